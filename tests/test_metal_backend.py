"""The metal backend (MLX): GGUF blocks as affine groups, reference parity on the default model, the
CLI under `--profile metal --strict-backend`. Runs wherever `mlx` imports (Metal on a Mac, MLX's CPU
build on Linux: `pip install 'mlx[cpu]'`); the conformance, mode-matrix and sampler tests cover the
rest of the backend through their own parametrization.

Parity tolerance: MLX in float32 with the default model's Q4_1 blocks multiplied quantized follows
transformers' float32 greedy path token for token, with the top-5 logits within 1e-3 (measured: 8e-5).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from infer.engine.backends.gguf_affine import BLOCK_BYTES, dequantize_affine, to_affine
from infer.engine.backends.probe import probe_backend

pytestmark = pytest.mark.skipif(probe_backend("metal") is not None, reason="mlx is not usable here")
pytest_plugins = ["conftest_synthetic"]

PARITY_ATOL = 1e-3
"""Top-5 logits against transformers' float32 oracle (the reference README's tolerance)."""


@pytest.mark.parametrize("quant", sorted(BLOCK_BYTES))
def test_affine_groups_dequantize_like_gguf_bit_for_bit(quant: str) -> None:
    rng = np.random.default_rng(3)
    weights = (rng.standard_normal((12, 160)) * rng.uniform(0.01, 3.0, (12, 1))).astype(np.float32)
    blocks = quantize(weights, GGMLQuantizationType[quant])
    expected = dequantize(blocks, GGMLQuantizationType[quant]).reshape(weights.shape)
    groups = to_affine(blocks, quant, weights.shape)
    np.testing.assert_array_equal(dequantize_affine(groups), expected)
    import mlx.core as mx

    got = mx.dequantize(
        mx.array(groups.packed),
        mx.array(groups.scales),
        mx.array(groups.biases),
        group_size=32,
        bits=groups.bits,
    )
    np.testing.assert_array_equal(np.array(got), expected)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("quant", sorted(BLOCK_BYTES))
def test_quantized_linear_against_the_dequantized_product(quant: str, dtype: str) -> None:
    from infer.engine.backends import create_backend

    backend = create_backend("metal", dtype)
    rng = np.random.default_rng(4)
    weights = rng.standard_normal((40, 96)).astype(np.float32)
    blocks = quantize(weights, GGMLQuantizationType[quant])
    dense = dequantize(blocks, GGMLQuantizationType[quant]).reshape(weights.shape).astype(np.float64)
    x = rng.standard_normal((5, 96)).astype(np.float32)
    got = backend.to_host(
        backend.linear(backend.asarray(x), backend.weight(blocks, quant=quant, shape=weights.shape))
    )
    tolerance = {"float32": 1e-4, "float16": 3e-2, "bfloat16": 2e-1}[dtype]
    np.testing.assert_allclose(got, x.astype(np.float64) @ dense.T, atol=tolerance, rtol=tolerance)


@pytest.mark.real_model
@pytest.mark.slow  # ~30 s on MLX's CPU build; the fast suite keeps the per-op parity tests above
def test_reference_parity_on_the_default_model(default_model_path: Path, transformers_reference) -> None:
    """Every reference prompt in one batch along transformers' greedy path: each step's argmax is
    transformers' token and the top-5 logits are within PARITY_ATOL."""
    from infer.engine.backends import create_backend
    from infer.engine.batch import ForwardBatch, Segment
    from infer.engine.loader import load_checkpoint
    from infer.engine.models import build_model

    cases = transformers_reference["greedy_32"]
    model = build_model(load_checkpoint(default_model_path), create_backend("metal", "float32"))
    cache = model.make_cache(len(cases), 128)
    feed = [list(c["prompt_ids"]) for c in cases]
    starts = [0] * len(cases)
    for step in range(len(cases[0]["greedy_ids"])):
        segments, rows, last = [], [], []
        for slot, tokens in enumerate(feed):
            segments.append(Segment(slot, starts[slot], len(tokens)))
            rows.extend(tokens)
            last.append(len(rows) - 1)
        logits = model.forward(ForwardBatch(np.asarray(rows), tuple(segments), np.asarray(last)), cache)
        for slot, case in enumerate(cases):
            expected = case["steps"][step]
            assert int(np.argmax(logits[slot])) == case["greedy_ids"][step], (case["prompt"], step)
            np.testing.assert_allclose(
                logits[slot][expected["top_ids"]], expected["top_logits"], atol=PARITY_ATOL
            )
            starts[slot] += len(feed[slot])
            feed[slot] = [case["greedy_ids"][step]]


def test_generate_with_the_metal_profile_and_strict_backend(tiny_gguf: Path) -> None:
    """`--profile metal --strict-backend` runs on MLX (float16, the profile's dtype) with no fallback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    # The profile samples (random seed); a tiny random model may draw EOS early: run the full length.
    args = ["generate", "--profile", "metal", "--strict-backend", "-m", str(tiny_gguf), "-n", "6", "--json"]
    args += ["--ignore-eos"]
    proc = subprocess.run(
        [sys.executable, "-c", "from infer.cli.main import main; main()", *args, "hello"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert "unavailable" not in proc.stderr and "using cpu" not in proc.stderr
    result = json.loads(proc.stdout)
    assert result["finish_reason"] == "length" and result["completion_tokens"] == 6


def _metal_engine(path: Path, *, device_sampling: bool):
    from infer.engine.runtime.engine import EngineConfig, load_engine

    engine = load_engine(path, EngineConfig(ctx_size=256, max_num_seqs=8), "metal", "float32")
    if not device_sampling:
        engine.executor.device_xp = None  # every row copied to the host and drawn there, as the cpu does
    return engine


@pytest.mark.parametrize(
    "fields",
    [
        {"temperature": 0.8},
        {"temperature": 1.3, "top_k": 5},
        {"temperature": 1.0, "top_p": 0.9, "min_p": 0.05},
        {"temperature": 0.9, "top_k": 10**9, "logit_bias": {7: 3.0}},
        {"temperature": 0.0},  # greedy: the host's row argmax
        {"temperature": 0.8, "repeat_penalty": 1.3},  # outside the envelope: the host
    ],
)
def test_the_engine_draws_on_the_device_what_the_host_draws(tiny_gguf: Path, fields: dict) -> None:
    """On a device backend, rows inside the envelope are drawn from the device's candidates, the
    rest on the host; alone or 6 at once, the tokens equal those of drawing every row on the host,
    and each request says how many of its draws the device made."""
    from infer.engine.runtime.request import Request
    from infer.engine.sampling import SamplingParams

    params = SamplingParams(**fields)
    requests = [
        Request(prompt_ids=(5, 9 + i, 17, 3), sampling=params, max_tokens=12, ignore_eos=True, seed=40 + i)
        for i in range(6)
    ]
    runs = {}
    for device in (True, False):
        engine = _metal_engine(tiny_gguf, device_sampling=device)
        alone = [engine.generate(r).done for r in requests[:2]]
        streams = [engine.submit(r) for r in requests]
        together = [s.result().done for s in streams]
        runs[device] = (alone, together)
    (dev_alone, dev_together), (host_alone, host_together) = runs[True], runs[False]
    assert [d.token_ids for d in dev_alone] == [d.token_ids for d in host_alone]
    assert [d.token_ids for d in dev_together] == [d.token_ids for d in host_together]
    assert [d.token_ids for d in dev_together[:2]] == [d.token_ids for d in dev_alone]
    inside = params.temperature > 0 and "repeat_penalty" not in fields
    for done in dev_alone:
        assert len(done.token_ids) == 12
        assert done.sampled_on_device == (12 if inside else 0), fields
    assert all(d.sampled_on_device == 0 for d in host_alone)


@pytest.mark.parametrize(
    ("profile", "temperature", "on_device"),
    [("metal", "0.8", True), ("metal", "0", False), ("cpu", "0.8", False)],
)
def test_bench_json_says_where_tokens_were_sampled(
    tiny_gguf: Path, profile: str, temperature: str, on_device: bool
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    args = [
        "bench",
        "--profile",
        profile,
        "-m",
        str(tiny_gguf),
        "-p",
        "4",
        "-n",
        "6",
        "-r",
        "1",
        "--temp",
        temperature,
        "--json",
    ]
    proc = subprocess.run(
        [sys.executable, "-c", "from infer.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    records = document if isinstance(document, list) else document["results"]
    decode = [r for r in records if r["n_gen"] > 0]
    assert decode
    for record in decode:
        where = record["sampled_where"]
        assert (where["device_tokens"] > 0) == on_device, where
        assert where["device_tokens"] + where["host_tokens"] == record["tokens"]
