"""`kv_cache_dtype: f16`: the KV cache stored as IEEE halves on the cpu kernels. A write rounds as
numpy's float16 cast does; attention widens every half to float32 before any arithmetic, so it gives
the bits of a float32 cache holding the rounded values; the memory budget halves; prefix caching and
the draft model's cache follow; a backend or mode that cannot store it refuses it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.cpu import ROW_ATTENTION_ROWS, CpuBackend
from infer.engine.backends.cuda import CudaBackend
from infer.engine.backends.kv_cache import KVCache, KVCacheDtypeError, check_kv_cache_dtype
from infer.engine.backends.metal import MetalBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.runtime.config import EngineConfigError
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams
from infer.engine.speculative import SpecConfig

pytest_plugins = ["conftest_synthetic"]

KV_HEADS, HEAD_DIM = 2, 64


def _edge_values(rng: np.random.Generator, count: int) -> np.ndarray:
    """float32 values across the half range and past it: ties, subnormals, overflow, signed zeros."""
    tiny = np.float32(2.0**-24)  # the smallest half subnormal
    edges = np.array(
        [
            *(0.0, -0.0, 1 + 2**-11, 1 + 3 * 2**-11, 65504.0, 65519.0, 65520.0, -1e6, np.inf, -np.inf),
            *(tiny, tiny / 2, tiny * 1.5, tiny * 2.5, 2.0**-14, 2.0**-14 - tiny / 2, 1e-9),
        ],
        dtype=np.float32,
    )
    spread = rng.standard_normal(count).astype(np.float32) * np.float32(10.0) ** rng.integers(-9, 6, count)
    values = np.concatenate([edges, spread.astype(np.float32)])[:count]
    return values.reshape(-1, KV_HEADS, HEAD_DIM)


def test_a_half_cache_write_is_numpy_float16_rounding() -> None:
    rng = np.random.default_rng(1)
    backend = CpuBackend(kernels="exact")
    rows = 40
    cache = KVCache.allocate(backend, 2, 3, KV_HEADS, rows, HEAD_DIM, "f16")
    k = _edge_values(rng, rows * KV_HEADS * HEAD_DIM)
    v = -k[::-1].copy()
    slots = rng.integers(0, 3, rows).astype(np.int64)
    positions = rng.permutation(rows).astype(np.int64)
    backend.write_kv(cache, 1, slots, positions, k, v)
    with np.errstate(over="ignore"):
        want_k, want_v = k.astype(np.float16), v.astype(np.float16)
    stored_k = cache.keys[1, slots, :, positions]  # [rows, kv_heads, head_dim]
    stored_v = cache.values[1, slots, :, positions]
    assert cache.keys.dtype == np.float16
    assert (stored_k.view(np.uint16) == want_k.view(np.uint16)).all()  # the bits, signed zeros too
    assert (stored_v.view(np.uint16) == want_v.view(np.uint16)).all()
    assert not cache.keys[0].any()  # the other layer untouched


def test_half_cache_attention_is_the_float32_kernels_on_the_rounded_values() -> None:
    """Decode and verify rows (the row kernel) and a long prefill run (the blocked attention) give the
    same bits from a half cache as from a float32 cache holding the same halves: each element is
    widened exactly before any arithmetic, in the same order."""
    rng = np.random.default_rng(2)
    backend = CpuBackend(kernels="exact")
    length = ROW_ATTENTION_ROWS + 40
    half = KVCache.allocate(backend, 1, 2, KV_HEADS, length + 8, HEAD_DIM, "f16")
    full = KVCache.allocate(backend, 1, 2, KV_HEADS, length + 8, HEAD_DIM)
    k = rng.standard_normal((length + 8, KV_HEADS, HEAD_DIM)).astype(np.float32)
    v = rng.standard_normal((length + 8, KV_HEADS, HEAD_DIM)).astype(np.float32)
    for slot in range(2):
        rows = np.arange(length + 8, dtype=np.int64)
        slots = np.full(length + 8, slot, dtype=np.int64)
        backend.write_kv(half, 0, slots, rows, k, v)
        backend.write_kv(
            full,
            0,
            slots,
            rows,
            k.astype(np.float16).astype(np.float32),
            v.astype(np.float16).astype(np.float32),
        )
    q = (rng.standard_normal((length, 2 * KV_HEADS, HEAD_DIM)) * 0.2).astype(np.float32)
    prefill = AttentionPlan.build(np.array([0]), np.array([0]), np.array([length]))
    assert (backend.attention(q, half, 0, prefill) == backend.attention(q, full, 0, prefill)).all()
    # one decode row of slot 1 beside three verify rows of slot 0
    rows = AttentionPlan.build(np.array([1, 0]), np.array([length, length + 2]), np.array([1, 3]))
    assert (backend.attention(q[:4], half, 0, rows) == backend.attention(q[:4], full, 0, rows)).all()


def test_the_kv_budget_and_the_cache_halve(tiny_model_factory) -> None:
    tiny = tiny_model_factory(quant="Q8_0", kv_heads=2, layers=2)
    engines = {
        dtype: load_engine(
            tiny.gguf_path, EngineConfig(ctx_size=64, kv_cache_dtype=dtype), cpu_kernels="exact"
        )
        for dtype in ("f32", "f16")
    }
    assert engines["f16"].kv_budget.position_bytes * 2 == engines["f32"].kv_budget.position_bytes
    assert engines["f16"].cache.keys.nbytes * 2 == engines["f32"].cache.keys.nbytes
    assert engines["f16"].kv_budget.max_positions == 0  # unbounded either way


def test_prefix_caching_and_the_draft_model_follow_the_dtype(tiny_model_factory) -> None:
    """A request that starts from a kept half prefix gives the tokens it gives without prefix
    caching; a draft model's cache is stored as the target's, and speculation keeps the tokens."""
    tiny = tiny_model_factory(quant="Q8_0", kv_heads=2, layers=2)
    config = EngineConfig(ctx_size=96, max_num_seqs=2, batch_size=8, kv_cache_dtype="f16")
    plain = load_engine(tiny.gguf_path, config, cpu_kernels="int8", draft_model=tiny.gguf_path)
    assert plain.drafting.drafters["draft_model"].cache.keys.dtype == np.float16
    prompt = tuple(range(3, 3 + 27))
    greedy = SamplingParams(temperature=0.0)

    def request(spec: SpecConfig | None = None) -> Request:
        return Request(prompt_ids=prompt, sampling=greedy, max_tokens=8, ignore_eos=True, spec=spec)

    expected = plain.generate(request()).done.token_ids
    assert plain.generate(request(SpecConfig("draft_model", num_tokens=3))).done.token_ids == expected
    cached = load_engine(tiny.gguf_path, replace(config, prefix_caching=True), cpu_kernels="int8")
    cached.generate(request())
    assert cached.scheduler.prefix_cache is not None and cached.scheduler.prefix_cache.kept_positions == 24
    assert cached.generate(request()).done.token_ids == expected


def test_a_dtype_that_cannot_be_stored_is_refused_before_loading(tiny_gguf: Path) -> None:
    with pytest.raises(
        KVCacheDtypeError, match=r"f16 is not available on this cpu backend.*cpu_kernels exact or int8"
    ):
        load_engine(tiny_gguf, EngineConfig(kv_cache_dtype="f16"), cpu_kernels="blas")
    for backend_class in (CudaBackend, MetalBackend):  # instances without their device libraries
        backend = object.__new__(backend_class)
        check_kv_cache_dtype(backend, "f32")
        with pytest.raises(KVCacheDtypeError, match=f"on this {backend_class.name} backend.*in f32 only"):
            check_kv_cache_dtype(backend, "f16")
    with pytest.raises(KVCacheDtypeError, match="must be one of f32, f16, got 'q8_0'"):
        KVCache.allocate(CpuBackend(kernels="exact"), 1, 1, 1, 4, 16, "q8_0")
    with pytest.raises(
        EngineConfigError, match=r"kv_cache_dtype must be one of f32, f16, got 'bf16'\."
    ) as info:
        EngineConfig(kv_cache_dtype="bf16")
    assert info.value.parameter == "kv_cache_dtype"


@pytest.mark.real_model
def test_default_model_logits_with_a_half_cache_stay_near_float32(default_model_path: Path) -> None:
    """Teacher-forced along the float32 greedy path, the f16 cache's logits stay within 0.1 of the
    float32 ones (measured: at most 0.026 over four prompts x 48 tokens, where the greedy tokens of
    both agreed at every step), so the greedy token agrees wherever float32's top two are 0.2 apart."""
    engines = {
        dtype: load_engine(
            default_model_path,
            EngineConfig(ctx_size=128, max_num_seqs=1, kv_cache_dtype=dtype),
            cpu_kernels="exact",
        )
        for dtype in ("f32", "f16")
    }
    ids = tuple(engines["f32"].tokenizer.encode("The capital of France is"))
    greedy = SamplingParams(temperature=0.0)
    tokens = engines["f32"].generate(Request(prompt_ids=ids, sampling=greedy, max_tokens=24, ignore_eos=True))
    sequence = np.asarray([*ids, *tokens.done.token_ids], dtype=np.int64)
    batch = ForwardBatch(sequence, (Segment(0, 0, len(sequence)),), np.arange(len(sequence), dtype=np.int64))
    logits = {}
    for dtype, engine in engines.items():
        logits[dtype] = engine.model.forward(batch, engine.model.make_cache(1, 128, dtype))
    assert np.abs(logits["f16"] - logits["f32"]).max() < 0.1
    top_two = np.sort(logits["f32"], axis=1)[:, -2:]
    clear = top_two[:, 1] - top_two[:, 0] > 0.2
    assert clear.sum() > len(sequence) // 2
    assert (logits["f16"].argmax(1)[clear] == logits["f32"].argmax(1)[clear]).all()


@pytest.mark.real_model
def test_the_cli_refuses_a_dtype_its_backend_mode_cannot_store(default_model_path: Path) -> None:
    from cli_process import infer_cli

    result = infer_cli("generate", "-p", "hi", "-n", "1", "--kv-cache-dtype", "f16", "--cpu-kernels", "blas")
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines() == [
        "infer: error: flag --kv-cache-dtype: kv_cache_dtype f16 is not available on this cpu backend, which "
        "stores the KV cache in f32 only (f16 runs on the cpu backend with cpu_kernels exact or int8)"
    ]
