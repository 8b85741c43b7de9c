"""A decode row through every layer in one compiled call (the cpu backend's row decoder, `int8` mode:
cpu_kernels/decode_row.py) gives the logits and KV-cache entries of the op-by-op path bit for bit, on
every block type it takes, stacks of types, a half cache, and every family with dense layers; a
mixture of experts (and the other modes) keep the op-by-op path."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic_gemma3 import write_tiny_gemma3

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model

pytestmark = pytest.mark.xdist_group("cpu_kernels")  # compiles the CPU kernels (test_batch_invariance.py)

pytest_plugins = ["conftest_synthetic"]

FAMILIES = Path(__file__).parent / "reference" / "families"

OP_BY_OP_FAMILIES = {"qwen3moe"}
"""The families' reference GGUFs whose layers the row decoder does not take (experts); the others cover
what it does beyond the Llama block: q/k/v biases (none here: test_other_modes... has qwen2), q/k norms
per head (qwen3, gemma3 in test_gemma3.py) and over the projection (olmo2), sandwich norms, GeGLU,
attention soft-capping and alternating RoPE kinds (gemma2), post-norms without pre-norms (olmo2),
residual multipliers (granite), layers without RoPE (smollm3), fused qkv and gate_up (phi3, phi4mini)."""


def _row(model, cache, slot: int, start: int, tokens: list[int]) -> np.ndarray:
    batch = ForwardBatch(
        np.asarray(tokens, dtype=np.int64),
        (Segment(slot, start, len(tokens)),),
        np.arange(len(tokens), dtype=np.int64),
    )
    return model.forward(batch, cache)


def _assert_one_call_matches_op_by_op(model, kv_dtype: str = "f32", steps: int = 4) -> None:
    """Prefill the same prompt into slots 0 and 1, then decode the same tokens: slot 0 a row at a time
    through the row decoder, slot 1 op by op. Logits and cache entries must be the same bits."""
    decoder = model._row_decoder
    assert decoder is not None
    cache = model.make_cache(2, 64, kv_dtype)
    rng = np.random.default_rng(11)
    prompt = rng.integers(3, model.vocab_size, 9).tolist()
    for slot in (0, 1):
        _row(model, cache, slot, 0, prompt)
    try:
        for step, token in enumerate(rng.integers(3, model.vocab_size, steps).tolist()):
            position = len(prompt) + step
            model._row_decoder = decoder
            one_call = _row(model, cache, 0, position, [token])
            model._row_decoder = None
            op_by_op = _row(model, cache, 1, position, [token])
            assert np.array_equal(one_call, op_by_op), step
    finally:
        model._row_decoder = decoder
    written = len(prompt) + steps
    for stored in (cache.keys, cache.values):
        assert np.array_equal(stored[:, 0, :, :written], stored[:, 1, :, :written])
        assert np.abs(stored[:, 0, :, len(prompt) : written]).max() > 0  # the rows were written


@pytest.mark.parametrize(
    ("quant", "tensor_quants", "kv_dtype"),
    [
        ("Q4_0", None, "f32"),
        ("Q4_1", None, "f32"),
        ("Q8_0", None, "f16"),
        ("Q5_0", None, "f32"),
        ("Q5_1", None, "f16"),
        ("Q4_K", None, "f32"),
        ("Q5_K", None, "f32"),
        ("Q6_K", None, "f16"),
        # Q4_K_M's mix: q, k and v of two types (a stack of parts), a Q8_0 part beside K-quant ones
        (
            "Q4_K",
            {"blk.0.attn_v.weight": "Q6_K", "blk.1.attn_v.weight": "Q8_0", "blk.1.ffn_down.weight": "Q6_K"},
            "f32",
        ),
    ],
)
def test_one_call_gives_the_op_by_op_bits(tiny_model_factory, quant, tensor_quants, kv_dtype) -> None:
    tiny = tiny_model_factory(quant=quant, kv_heads=2, layers=2, tensor_quants=tensor_quants)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="int8"))
    _assert_one_call_matches_op_by_op(model, kv_dtype)


@pytest.mark.parametrize("family", sorted(p.name for p in FAMILIES.iterdir() if p.is_dir()))
def test_families_with_the_plain_block_decode_a_row_in_one_call(family: str) -> None:
    model = build_model(load_checkpoint(FAMILIES / family / "q8_0.gguf"), CpuBackend(kernels="int8"))
    if family in OP_BY_OP_FAMILIES:
        assert model._row_decoder is None
        return
    _assert_one_call_matches_op_by_op(model)


def test_gemma3_in_one_call(tmp_path) -> None:
    """Two kinds of RoPE (sliding layers' own base), q/k norms per head, sandwich norms, GeGLU and a
    window of 5 that the decoded positions run past (the final soft cap runs after the layers; gemma2's
    reference model soft-caps attention scores)."""
    tiny = write_tiny_gemma3(tmp_path, softcap=20.0)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="int8"))
    assert model._sliding_layers and len(model._rope_tables) == 2
    _assert_one_call_matches_op_by_op(model)


def test_qkv_biases_in_one_call(tiny_model_factory) -> None:
    tiny = tiny_model_factory(quant="Q8_0", arch="qwen2", kv_heads=2)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="int8"))
    _assert_one_call_matches_op_by_op(model)


@pytest.mark.parametrize(
    ("quant", "arch", "mode"),
    [
        ("Q8_0", "llama", "exact"),  # float32 accumulation: its own kernels, op by op
        ("Q8_0", "llama", "blas"),
        ("F32", "llama", "int8"),  # float rows have no int8 kernels
    ],
)
def test_other_modes_and_layers_keep_the_op_by_op_path(tiny_model_factory, quant, arch, mode) -> None:
    tiny = tiny_model_factory(quant=quant, arch=arch)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels=mode))
    assert model._row_decoder is None
