"""The cuda backend: its host logic on any machine, its kernels against numpy where a GPU is present.

Host side (runs everywhere): bfloat16 rounding, the bytes the kernels read for dense rows, launch
geometry, the kernel names the backend looks up, and the refusal without cupy. The `cuda`-marked tests
need a CUDA device (scripts/gpu_check.sh runs them on a lent GPU); the backend conformance tests
and the envelope-sampling tests join in on their own when the cuda probe passes.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from infer.engine.backends import create_backend
from infer.engine.backends.cuda import QUANT_FORMATS, bfloat16_bits, dense_bytes, gemv_grid, grid_for
from infer.engine.backends.cuda_kernels import BLOCK_FORMATS, KERNELS
from infer.engine.backends.errors import BackendError
from infer.engine.backends.probe import probe_backend

pytest_plugins = ["conftest_synthetic"]

needs_gpu = pytest.mark.skipif(probe_backend("cuda") is not None, reason="no usable CUDA device here")


def test_bfloat16_rounds_to_nearest_even() -> None:
    one = np.float32(1.0)
    ulp = np.float32(2.0**-7)  # bfloat16 spacing at 1.0
    values = np.array(
        [one, one + ulp / 2, one + ulp * 1.5, one + ulp / 2 + 2.0**-20, -2.5, np.inf, 3.0e38], np.float32
    )
    bits = bfloat16_bits(values)
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    assert back[0] == 1.0
    assert back[1] == 1.0  # a tie goes to the even neighbour
    assert back[2] == one + 2 * ulp  # the other tie goes up, to the even one
    assert back[3] == one + ulp  # past the tie: up
    assert back[4] == -2.5 and back[5] == np.inf
    assert abs(back[6] - 3.0e38) / 3.0e38 < 2.0**-8
    assert np.isnan((bfloat16_bits(np.array([np.nan], np.float32)).astype(np.uint32) << 16).view(np.float32))[
        0
    ]


def test_dense_bytes_are_rows_of_the_compute_dtype() -> None:
    m = np.random.default_rng(0).standard_normal((3, 64)).astype(np.float32)
    assert dense_bytes(m, "float32").shape == (3, 256)
    np.testing.assert_array_equal(dense_bytes(m, "float32").view(np.float32), m)
    np.testing.assert_array_equal(dense_bytes(m, "float16").view(np.float16), m.astype(np.float16))
    halves = dense_bytes(m, "bfloat16").view(np.uint16)
    np.testing.assert_allclose((halves.astype(np.uint32) << 16).view(np.float32), m, rtol=2.0**-8)
    for fmt, dtype in (("F32", "float32"), ("F16", "float16"), ("BF16", "bfloat16")):
        assert dense_bytes(m, dtype).shape[1] // 2 == BLOCK_FORMATS[fmt][1]  # two runs of 32 per row


def test_launch_geometry_covers_every_item() -> None:
    assert grid_for(1) == (1,) and grid_for(256) == (1,) and grid_for(257) == (2,) and grid_for(0) == (1,)
    assert gemv_grid(8) == (1,) and gemv_grid(9) == (2,) and gemv_grid(576) == (72,)


def test_every_format_has_its_kernels() -> None:
    for fmt in BLOCK_FORMATS:
        for kind in ("gemv", "dequantize"):
            assert f"{kind}_{fmt.lower()}" in KERNELS["matmul"]
    assert set(QUANT_FORMATS) <= set(BLOCK_FORMATS)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
def test_without_cupy_the_backend_is_refused_clearly() -> None:
    with pytest.raises(BackendError, match="cupy"):
        create_backend("cuda")
    assert "cupy" in (probe_backend("cuda") or "")


# ---- on a GPU ------------------------------------------------------------------------------------


@pytest.mark.cuda
@needs_gpu
@pytest.mark.parametrize("quant", ["F32", "Q4_0", "Q4_1", "Q8_0"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cuda_matches_numpy_on_the_tiny_model(tiny_model_factory, quant: str, dtype: str) -> None:
    """Greedy tokens equal to the cpu backend's on the same GGUF; logits of the first step within
    1e-3 (float32) or 5e-2 (bfloat16 dense weights) of numpy's."""
    from infer.engine.runtime.engine import EngineConfig, load_engine
    from infer.engine.runtime.request import Request
    from infer.engine.sampling import SamplingParams

    path: Path = tiny_model_factory(quant=quant, kv_heads=2, layers=2).gguf_path
    config = EngineConfig(ctx_size=96, max_num_seqs=4, batch_size=8)
    engines = {
        name: load_engine(path, config, name, dtype if name == "cuda" else "float32")
        for name in ("cpu", "cuda")
    }
    prompts = [(5, 9, 40, 41, 42), (7,) * 12, tuple(range(3, 30))]
    tokens = {}
    for name, engine in engines.items():
        requests = [
            Request(p, SamplingParams(temperature=0.0), max_tokens=16, ignore_eos=True) for p in prompts
        ]
        streams = [engine.submit(r) for r in requests]
        tokens[name] = [s.result().token_ids for s in streams]
    if dtype == "float32" or quant != "F32":
        assert tokens["cuda"] == tokens["cpu"]
    from infer.engine.batch import ForwardBatch, Segment

    batch = ForwardBatch(
        np.asarray(prompts[2]), (Segment(0, 0, len(prompts[2])),), np.asarray([len(prompts[2]) - 1])
    )
    got = engines["cuda"].model.forward(batch, engines["cuda"].cache)
    want = engines["cpu"].model.forward(batch, engines["cpu"].cache)
    tolerance = 1e-3 if dtype == "float32" or quant != "F32" else 5e-2
    np.testing.assert_allclose(got, want, atol=tolerance * max(1.0, float(np.abs(want).max())))


@pytest.mark.skipif(probe_backend("cuda") is None, reason="cuda runs here: nothing falls back")
def test_without_a_gpu_the_cuda_profile_falls_back_or_exits_2(tiny_gguf: Path) -> None:
    """`--profile cuda` runs on cpu after one notice line; with `--strict-backend` it exits 2."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    base = [sys.executable, "-c", "from infer.cli.main import main; main()", "generate", "--profile", "cuda"]
    tail = ["-m", str(tiny_gguf), "-n", "3", "hello"]
    strict = subprocess.run(
        [*base, "--strict-backend", *tail], capture_output=True, text=True, env=env, timeout=120
    )
    assert strict.returncode == 2 and strict.stdout == ""
    assert len(strict.stderr.strip().splitlines()) == 1 and "--strict-backend" in strict.stderr
    fallback = subprocess.run([*base, *tail], capture_output=True, text=True, env=env, timeout=120)
    assert fallback.returncode == 0, fallback.stderr
    notices = [line for line in fallback.stderr.splitlines() if "unavailable" in line]
    assert len(notices) == 1 and notices[0].endswith("using cpu in float32 (not bfloat16)")
