#!/usr/bin/env bash
# The cuda backend's runtime checks, on a lent GPU (one H200): under 8 minutes, nothing fetched.
#
# Usage: scripts/gpu_check.sh [WORK_DIR]        (PYTHON=python3.12 to choose the interpreter)
#
# The lent machine reaches no package registry and takes at most 64 MiB along (less than the 94 MiB
# default GGUF), so everything runs from this checkout on a model built there:
#   1. environment: the GPU, cupy, torch, transformers and this project's own dependencies
#      (anything missing is listed and the run stops with exit 3);
#   2. a model with the default model's shapes from seeded random weights (scripts/gpu_synthetic.py:
#      GGUF with Q4_1 matrices and a Q8_0 embedding, plus the same weights as a transformers folder);
#   3. pytest: the cuda-marked tests, the backend conformance tests and the envelope-sampling tests
#      (cuda joins their parametrization because its probe passes there), and the NVRTC compile test;
#   4. numpy vs CUDA (float32 and bfloat16) and CUDA vs transformers on that model: greedy tokens equal,
#      logits within the bfloat16 tolerance stated in scripts/gpu_compare.py;
#   5. `infer bench` (profile cuda, greedy) at concurrency 1, 16, 64 and 256 beside transformers'
#      batched `generate` on the same shapes.
# Exit status: 0 when every check passed, else the first failing step's status.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
WORK="${1:-$(mktemp -d /tmp/gpu_check.XXXXXX)}"
PY="${PYTHON:-python3}"
CONCURRENCY="1,16,64,256"
mkdir -p "$WORK"
cd "$ROOT"

# `infer` without pip: pyproject's package-dir mapping as symlinks in a namespace package on PYTHONPATH.
mkdir -p "$WORK/py/infer"
for part in cli engine profiles; do
    ln -sfn "$ROOT/$part" "$WORK/py/infer/$part"
done
export PYTHONPATH="$WORK/py:$ROOT/tests${PYTHONPATH:+:$PYTHONPATH}"
infer() { "$PY" -c "from infer.cli.main import main; main()" "$@"; }

step() { printf '\n== %s (at %ss)\n' "$1" "$SECONDS"; }

step "1. environment"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
"$PY" - <<'EOF'
import importlib
import sys

needed = ["cupy", "torch", "transformers", "numpy", "gguf", "tokenizers", "safetensors", "typer", "rich",
          "pydantic", "yaml", "ruamel.yaml", "jinja2", "numba", "threadpoolctl", "fastapi", "httpx", "pytest"]
missing = []
for name in needed:
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # report every missing module at once
        missing.append(f"{name} ({type(exc).__name__})")
        continue
    print(f"{name} {getattr(module, '__version__', '')}")
if missing:
    print("missing on this machine (it reaches no registry): " + ", ".join(missing))
    sys.exit(3)
from infer.engine.backends.probe import probe_backend

reason = probe_backend("cuda")
print(f"cuda probe: {reason or 'ok'}")
sys.exit(3 if reason else 0)
EOF

step "2. synthetic model with the default model's shapes"
timeout 180 "$PY" scripts/gpu_synthetic.py "$WORK/model" --seed 0
MODEL="$WORK/model/model.gguf"

step "3. tests on the GPU"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_cuda_backend.py tests/test_backend_conformance.py tests/test_sampling_envelope.py \
    tests/test_cuda_kernels_compile.py

step "4. numpy vs CUDA, CUDA vs transformers"
timeout 180 "$PY" scripts/gpu_compare.py compare "$WORK/model"

step "5. throughput: infer bench beside transformers generate"
timeout 180 infer bench -m "$MODEL" --profile cuda --strict-backend --temp 0 -p 512 -r 1 \
    --concurrency "$CONCURRENCY" --concurrency-prompt 32 --json >"$WORK/bench.json"
"$PY" - "$WORK/bench.json" <<'EOF'
import json
import sys

print(json.dumps(json.load(open(sys.argv[1])), indent=1)[:6000])
EOF
timeout 180 "$PY" scripts/gpu_compare.py hf-bench "$WORK/model" --concurrency "$CONCURRENCY" \
    --prompt-tokens 32 --new-tokens 128

step "done"
echo "gpu_check: every step passed in ${SECONDS}s (work files in $WORK)"
