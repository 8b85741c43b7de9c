"""Batch invariance with the CPU kernels, in the exact and int8 modes and for every family of block types
(legacy, K-quant): a decode or verify row's logits are the same bits (==) alone, beside up to 63 other
sequences of any lengths, at any place in the batch, next to prefill chunks, or as one of k+1 rows
verifying drafts of its own sequence; identical prompts prefilled together give their solo tokens;
with a float32 or a half (`kv_cache_dtype: f16`) KV cache. Speculative decoding and `infer gate`
rest on this (DESIGN.md, Determinism)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.runtime.engine import Engine, EngineConfig
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

# One test worker compiles and runs the CPU kernel tests: beside each other on two workers, a cold
# run (a fresh clone) compiled the same K-quant kernels twice at once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("cpu_kernels")

pytest_plugins = ["conftest_synthetic"]

SLOTS = 64
"""Sequences that decode; one more slot takes the prefill chunks that ride along."""
CAPACITY = 96


KERNEL_CASES = [
    ("Q8_0", "exact"),
    ("Q8_0", "int8"),
    ("Q4_1", "int8"),
    ("Q4_K", "exact"),
    ("Q4_K", "int8"),
    ("Q6_K", "int8"),
]
"""(block type of every matrix, kernel mode) pairs the decode/verify test walks: each int8 path (Q8_0
activations for the legacy types, Q8_K for the K-quants) and both exact kernel families."""

HALF_KV_CASES = [("Q8_0", "exact"), ("Q4_K", "int8")]
"""Pairs the decode/verify test walks again with `kv_cache_dtype: f16` (the attention kernels read
halves; the matmuls are those of the f32 cases)."""


@pytest.fixture(scope="module")
def quantized_model(tiny_model_factory: Callable[..., object]) -> object:
    return tiny_model_factory(quant="Q8_0", kv_heads=2, layers=2)


def _forward(model, cache, segments: list[tuple[int, int, list[int]]]) -> np.ndarray:
    """Logits of every row of a ragged batch of (slot, start, tokens) segments."""
    tokens = [t for _, _, ids in segments for t in ids]
    batch = ForwardBatch(
        np.asarray(tokens, dtype=np.int64),
        tuple(Segment(slot, start, len(ids)) for slot, start, ids in segments),
        np.arange(len(tokens), dtype=np.int64),
    )
    return model.forward(batch, cache)


@pytest.mark.parametrize(
    ("quant", "mode", "kv_dtype"),
    [(q, m, "f32") for q, m in KERNEL_CASES] + [(q, m, "f16") for q, m in HALF_KV_CASES],
)
def test_decode_and_verify_rows_are_bit_identical_in_any_batch(
    tiny_model_factory, quant: str, mode: str, kv_dtype: str
) -> None:
    tiny = tiny_model_factory(quant=quant, kv_heads=2, layers=2)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels=mode))
    cache = model.make_cache(SLOTS + 1, CAPACITY, kv_dtype)
    rng = np.random.default_rng(7)
    vocab = model.vocab_size
    # Every slot holds a prompt of its own length, prefilled alone (a run longer than the kernel
    # group goes through BLAS attention, on its own, so it is the same whatever else runs).
    prompts = [rng.integers(3, vocab, int(rng.integers(2, 40))).tolist() for _ in range(SLOTS)]
    for slot, prompt in enumerate(prompts):
        _forward(model, cache, [(slot, 0, prompt)])
    nexts = rng.integers(3, vocab, SLOTS).tolist()
    alone = [_forward(model, cache, [(slot, len(prompts[slot]), [nexts[slot]])])[0] for slot in range(SLOTS)]

    for trial in range(12):
        width = int(rng.integers(1, SLOTS + 1)) if trial else SLOTS
        chosen = rng.choice(SLOTS, size=width, replace=False)
        segments: list[tuple[int, int, list[int]]] = []
        decode_rows: list[tuple[int, int]] = []  # (batch row, slot)
        row = 0
        for slot in chosen.tolist():
            drafts = rng.integers(3, vocab, int(rng.integers(0, 5))).tolist() if rng.random() < 0.3 else []
            segments.append((slot, len(prompts[slot]), [nexts[slot], *drafts]))
            decode_rows.append((row, slot))
            row += 1 + len(drafts)
        if rng.random() < 0.5:  # a prefill chunk of a fresh prompt rides along, anywhere in the batch
            fresh = rng.integers(3, vocab, int(rng.integers(2, 30))).tolist()
            at = int(rng.integers(0, len(segments) + 1))
            segments.insert(at, (SLOTS, 0, fresh))
            decode_rows = [(r + (len(fresh) if i >= at else 0), s) for i, (r, s) in enumerate(decode_rows)]
        logits = _forward(model, cache, segments)
        for batch_row, slot in decode_rows:
            assert (logits[batch_row] == alone[slot]).all(), (trial, slot)


def _assert_batched_equal_solo(
    quantized_model,
    config: EngineConfig,
    lengths: list[int],
    max_tokens: int,
    seed_base: int,
    mode: str = "exact",
    same_prompt: bool = False,
    temperature: float = 0.9,
) -> None:
    """Requests with prompts of `lengths` (odd ones greedy, even ones seeded at `temperature`; one
    prompt for all when `same_prompt`) give the same tokens submitted together as each alone on a fresh
    engine with the `mode` kernels."""
    checkpoint = load_checkpoint(quantized_model.gguf_path)

    def engine() -> Engine:
        model = build_model(load_checkpoint(quantized_model.gguf_path), CpuBackend(kernels=mode))
        return Engine(model, checkpoint.tokenizer, config)

    rng = np.random.default_rng(seed_base)
    requests = []
    shared = tuple(rng.integers(3, checkpoint.config.vocab_size, lengths[0]).tolist())
    for i, length in enumerate(lengths):
        prompt = (
            shared if same_prompt else tuple(rng.integers(3, checkpoint.config.vocab_size, length).tolist())
        )
        params = (
            SamplingParams(temperature=0.0)
            if i % 2
            else SamplingParams(temperature=temperature, seed=seed_base + i)
        )
        requests.append(Request(prompt_ids=prompt, sampling=params, max_tokens=max_tokens, ignore_eos=True))
    solo = [engine().generate(r).token_ids for r in requests]
    together = engine()
    streams = [together.submit(r) for r in requests]
    assert [s.result().token_ids for s in streams] == solo


@pytest.mark.parametrize(("mode", "kv_dtype"), [("exact", "f32"), ("int8", "f32"), ("int8", "f16")])
def test_sixteen_concurrent_requests_equal_their_solo_runs(quantized_model, mode: str, kv_dtype: str) -> None:
    config = EngineConfig(
        ctx_size=128, max_num_seqs=16, max_batched_tokens=256, batch_size=16, kv_cache_dtype=kv_dtype
    )
    lengths = np.random.default_rng(3).integers(3, 40, 16).tolist()
    _assert_batched_equal_solo(quantized_model, config, lengths, max_tokens=12, seed_base=100, mode=mode)


@pytest.mark.parametrize(("quant", "mode"), [("Q8_0", "exact"), ("Q8_0", "int8"), ("Q4_K", "int8")])
def test_identical_prompts_prefilled_together_give_their_solo_tokens(tiny_model_factory, quant, mode) -> None:
    """32 requests of one prompt, prefilled in the same steps (rows of identical activations side by side),
    half greedy and half seeded at temperature 5 where near-ties are everywhere: each request's tokens
    equal its solo run's (the case a Zen 4 host once broke in tests/test_sampling_model.py)."""
    tiny = tiny_model_factory(quant=quant, kv_heads=2, layers=2)
    config = EngineConfig(ctx_size=64, max_num_seqs=32, max_batched_tokens=512, batch_size=64)
    _assert_batched_equal_solo(
        tiny, config, [12] * 32, max_tokens=6, seed_base=300, mode=mode, same_prompt=True, temperature=5.0
    )


@pytest.mark.parametrize("kv_dtype", ["f32", "f16"])
def test_long_prompts_prefilled_in_attention_blocks_give_their_solo_tokens(quantized_model, kv_dtype) -> None:
    """Prompts past ROW_ATTENTION_ROWS prefill through the blocked attention (on the backend's thread
    pool), in fixed chunks beside other sequences' prefill and decode rows: each request's tokens equal
    its solo run's, greedy and seeded (with a float32 or a half KV cache)."""
    from infer.engine.backends.cpu import ROW_ATTENTION_ROWS

    config = EngineConfig(
        ctx_size=384, max_num_seqs=6, max_batched_tokens=512, batch_size=192, kv_cache_dtype=kv_dtype
    )
    lengths = np.random.default_rng(5).integers(ROW_ATTENTION_ROWS + 10, 300, 6).tolist()
    _assert_batched_equal_solo(quantized_model, config, lengths, max_tokens=8, seed_base=200)
