"""On a CUDA machine: the cuda backend against numpy and against transformers on one synthetic model.

Usage:
  python scripts/gpu_compare.py compare FOLDER      # FOLDER from scripts/gpu_synthetic.py
  python scripts/gpu_compare.py hf-bench FOLDER --concurrency 1,16,64,256

`compare` checks: greedy tokens of the cuda backend (float32 and bfloat16, the cuda profile's dtype)
equal the numpy backend's on the same GGUF, and the last prompt row's logits agree within the stated
bfloat16 tolerance, |cuda - numpy| <= BF16_TOLERANCE * max(1, max |logit|); then the same against
transformers + torch (float32, on the GPU) on the folder holding the GGUF's weights dequantized.
`hf-bench` prints transformers' `generate` decode tok/s at each concurrency on the same shapes,
beside which gpu_check.sh prints `infer bench`'s. Exit 1 when a check fails.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

from infer.engine.batch import ForwardBatch, Segment
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

BF16_TOLERANCE = 1e-2
"""Logit agreement, relative to the largest logit: a few bfloat16 ulps (2**-8 = 0.0039 each)."""

PROMPTS = [tuple(range(100, 132)), tuple((i * 37) % 40000 + 300 for i in range(64)), (5, 9, 40, 41, 42)]
"""Prompt token ids (the synthetic vocabulary's ids, read as numbers: no tokenizer needed)."""

GENERATED = 32


def greedy(engine: Engine) -> list[tuple[int, ...]]:
    """Every prompt's GENERATED greedy tokens, all in one batch."""
    params = SamplingParams(temperature=0.0)
    streams = [engine.submit(Request(p, params, max_tokens=GENERATED, ignore_eos=True)) for p in PROMPTS]
    return [s.result().token_ids for s in streams]


def prompt_logits(engine: Engine, prompt: tuple[int, ...]) -> np.ndarray:
    """Logits of the prompt's last row, computed in slot 0 of the engine's cache."""
    batch = ForwardBatch(np.asarray(prompt), (Segment(0, 0, len(prompt)),), np.asarray([len(prompt) - 1]))
    return engine.model.forward(batch, engine.cache)[0]


def report(
    label: str, ours: list[tuple[int, ...]], theirs: list[tuple[int, ...]], gap: float, scale: float
) -> bool:
    """Print one comparison line; True when tokens are equal and logits within tolerance."""
    same = ours == theirs
    within = gap <= BF16_TOLERANCE * max(1.0, scale)
    agree = [
        next((i for i, (a, b) in enumerate(zip(x, y, strict=True)) if a != b), len(x))
        for x, y in zip(ours, theirs, strict=True)
    ]
    limit = BF16_TOLERANCE * max(1.0, scale)
    print(
        f"{label:38} greedy tokens {'equal' if same else 'DIFFER'} (leading agreement {agree}); "
        f"max |logit gap| {gap:.2e} (limit {limit:.2e}) {'ok' if within else 'FAIL'}"
    )
    return same and within


def compare(folder: Path) -> bool:
    """numpy vs cuda (float32, bfloat16), then cuda vs transformers."""
    gguf = folder / "model.gguf"
    config = EngineConfig(ctx_size=256, max_num_seqs=len(PROMPTS), batch_size=256)
    engines = {
        "numpy": load_engine(gguf, config, "cpu", cpu_kernels="exact"),
        "cuda float32": load_engine(gguf, config, "cuda", "float32"),
        "cuda bfloat16": load_engine(gguf, config, "cuda", "bfloat16"),
    }
    tokens = {name: greedy(engine) for name, engine in engines.items()}
    logits = {name: prompt_logits(engine, PROMPTS[1]) for name, engine in engines.items()}
    scale = float(np.abs(logits["numpy"]).max())
    ok = True
    for name in ("cuda float32", "cuda bfloat16"):
        gap = float(np.abs(logits[name] - logits["numpy"]).max())
        ok &= report(f"{name} vs numpy", tokens[name], tokens["numpy"], gap, scale)
    hf_tokens, hf_logits = transformers_greedy(folder / "hf")
    gap = float(np.abs(logits["cuda float32"] - hf_logits).max())
    ok &= report("cuda float32 vs transformers float32", tokens["cuda float32"], hf_tokens, gap, scale)
    return ok


def transformers_greedy(hf_dir: Path) -> tuple[list[tuple[int, ...]], np.ndarray]:
    """transformers' greedy tokens for PROMPTS and the logits of PROMPTS[1]'s last row (float32, GPU)."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float32).cuda().eval()
    out = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = torch.tensor([prompt], device="cuda")
            generated = model.generate(
                ids, max_new_tokens=GENERATED, min_new_tokens=GENERATED, do_sample=False, eos_token_id=None
            )
            out.append(tuple(generated[0, len(prompt) :].tolist()))
        logits = model(torch.tensor([PROMPTS[1]], device="cuda")).logits[0, -1].float().cpu().numpy()
    return out, logits


def hf_bench(hf_dir: Path, concurrency: list[int], prompt_tokens: int, new_tokens: int) -> None:
    """transformers' batched greedy `generate` (bfloat16, the cuda profile's dtype): decode tok/s."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.bfloat16).cuda().eval()
    prompt = torch.arange(300, 300 + prompt_tokens, device="cuda")
    for batch in concurrency:
        ids = prompt.repeat(batch, 1)

        def run(n: int, ids: torch.Tensor = ids) -> float:
            torch.cuda.synchronize()
            started = time.perf_counter()
            with torch.no_grad():
                model.generate(ids, max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None)
            torch.cuda.synchronize()
            return time.perf_counter() - started

        run(2)  # warm-up
        first, full = run(1), run(new_tokens)
        decode_s = max(full - first, 1e-9)  # prefill and the first token are in both
        per_stream = (new_tokens - 1) / decode_s
        print(
            f"transformers generate concurrency {batch:4d}: aggregate decode {batch * per_stream:8.1f} tok/s "
            f"({per_stream:7.1f} tok/s per stream)"
        )


def main() -> None:
    """Run the chosen check."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("compare", "hf-bench"))
    parser.add_argument("folder", type=Path)
    parser.add_argument("--concurrency", default="1,16,64,256")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    if args.command == "compare":
        sys.exit(0 if compare(args.folder) else 1)
    hf_bench(
        args.folder / "hf", [int(c) for c in args.concurrency.split(",")], args.prompt_tokens, args.new_tokens
    )


if __name__ == "__main__":
    main()
