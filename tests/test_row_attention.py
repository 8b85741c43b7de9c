"""The row attention kernel: right against float64, and each row's bits independent of its batch."""

from __future__ import annotations

import numpy as np
import pytest

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.cpu import ROW_ATTENTION_ROWS, CpuBackend
from infer.engine.backends.cpu_kernels.attention import row_attention
from infer.engine.backends.kv_cache import KVCache


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, slot: int, visible: int) -> np.ndarray:
    """One row, float64: softmax(q . K) V per head, grouped-query."""
    heads, kv_heads = q.shape[0], keys.shape[1]
    group = heads // kv_heads
    out = np.empty(q.shape, dtype=np.float64)
    for head in range(heads):
        k = keys[slot, head // group, :visible].astype(np.float64)
        v = values[slot, head // group, :visible].astype(np.float64)
        scores = k @ q[head].astype(np.float64)
        weights = np.exp(scores - scores.max())
        out[head] = weights @ v / weights.sum()
    return out


@pytest.mark.parametrize(
    ("head_dim", "kv_heads", "heads"), [(64, 2, 6), (24, 2, 6), (80, 1, 18), (256, 1, 4)]
)
def test_rows_match_float64_and_ignore_their_batch(head_dim: int, kv_heads: int, heads: int) -> None:
    """The grouped kernel (head_dim a multiple of 16; up to 18 query heads to a kv head) and the
    per-head one (24) against float64, and each row's bits alone or anywhere in its batch."""
    rng = np.random.default_rng(head_dim)
    slots, capacity, batch = 5, 40, 12
    keys = rng.standard_normal((slots, kv_heads, capacity, head_dim)).astype(np.float32)
    values = rng.standard_normal((slots, kv_heads, capacity, head_dim)).astype(np.float32)
    q = rng.standard_normal((batch, heads, head_dim)).astype(np.float32)
    row_slots = rng.integers(0, slots, batch).astype(np.int64)
    visible = rng.integers(1, capacity + 1, batch).astype(np.int64)
    rows = np.arange(batch, dtype=np.int64)
    out = np.zeros_like(q)
    row_attention(q, keys, values, rows, row_slots, visible, out)
    for row in range(batch):
        expected = reference(q[row], keys, values, int(row_slots[row]), int(visible[row]))
        np.testing.assert_allclose(out[row], expected, rtol=1e-5, atol=1e-5)  # float32 sums of O(1) values
        alone = np.zeros_like(q)
        row_attention(
            q, keys, values, rows[row : row + 1], row_slots[row : row + 1], visible[row : row + 1], alone
        )
        assert (alone[row] == out[row]).all()
    # A row moved to another place in the batch, beside other rows, keeps its bits.
    order = rng.permutation(batch)
    moved = np.zeros_like(q)
    row_attention(q[order], keys, values, rows, row_slots[order], visible[order], moved)
    assert (moved == out[order]).all()


@pytest.mark.parametrize("element", [np.float32, np.uint16])
def test_grouped_rows_keep_their_bits_however_heads_and_threads_split(element: type) -> None:
    """The grouped kernel splits a kv head's query heads into parts when a call has fewer than
    MIN_TASKS (row, kv head) pairs: a row alone (its 6 heads a kv head in parts) and in a batch (whole
    groups), on 1 or 2 threads, gives the same bits (a float32 and a half cache)."""
    import numba

    from infer.engine.backends.cpu_kernels.attention import MIN_TASKS, window_row_attention

    rng = np.random.default_rng(7)
    slots, kv_heads, heads, head_dim, capacity, batch = 2, 2, 12, 64, 50, 3
    assert kv_heads < MIN_TASKS <= batch * kv_heads  # alone: split; batched: not
    keys = rng.standard_normal((slots, kv_heads, capacity, head_dim)).astype(np.float32)
    values = rng.standard_normal((slots, kv_heads, capacity, head_dim)).astype(np.float32)
    if element is np.uint16:  # half bits, as a `kv_cache_dtype: f16` cache holds them
        keys, values = keys.astype(np.float16).view(np.uint16), values.astype(np.float16).view(np.uint16)
    q = rng.standard_normal((batch, heads, head_dim)).astype(np.float32)
    rows = np.arange(batch, dtype=np.int64)
    row_slots = np.asarray([0, 1, 1], dtype=np.int64)
    first, visible = np.asarray([0, 0, 9], dtype=np.int64), np.asarray([1, 37, 50], dtype=np.int64)
    before = numba.get_num_threads()
    results = []
    for threads in (1, min(2, numba.config.NUMBA_NUM_THREADS)):
        numba.set_num_threads(threads)
        try:
            batched = np.full_like(q, np.nan)
            window_row_attention(q, keys, values, rows, row_slots, first, visible, batched)
            alone = np.full_like(q, np.nan)
            for r in range(batch):
                pick = slice(r, r + 1)
                window_row_attention(
                    q, keys, values, rows[pick], row_slots[pick], first[pick], visible[pick], alone
                )
            results += [batched, alone]
        finally:
            numba.set_num_threads(before)
    assert not np.isnan(results[0]).any()
    for out in results[1:]:
        assert (out.view(np.uint32) == results[0].view(np.uint32)).all()


def test_head_scores_give_a_position_the_same_bits_in_any_block_or_head_count() -> None:
    """A score's arithmetic is fixed: the same key row scored at any place in a block of SCORE_LANES
    positions, with any count, beside other heads or alone, gives the same bits; float64 agrees."""
    from numba import njit

    from infer.engine.backends.cpu_kernels.attention import SCORE_LANES, head_scores

    @njit
    def scores(queries, keys, first, count):
        out = np.empty((queries.shape[0], count + SCORE_LANES), np.float32)
        head_scores(queries, keys, first, count, out)
        return out[:, :count]

    rng = np.random.default_rng(3)
    keys = rng.standard_normal((41, 48)).astype(np.float32)
    queries = rng.standard_normal((3, 48)).astype(np.float32)
    full = scores(queries, keys, 0, 41)
    np.testing.assert_allclose(
        full, queries.astype(np.float64) @ keys.T.astype(np.float64), rtol=1e-5, atol=1e-5
    )
    for shift in range(1, SCORE_LANES + 2):
        assert (scores(queries, keys, shift, 41 - shift) == full[:, shift:]).all()
    for head in range(3):
        assert (scores(queries[head : head + 1], keys, 0, 41)[0] == full[head]).all()


def _cache(rng: np.random.Generator, slots: int, capacity: int) -> KVCache:
    backend = CpuBackend()
    cache = KVCache.allocate(backend, 1, slots, 2, capacity, 32)
    cache.keys[...] = rng.standard_normal(cache.keys.shape).astype(np.float32)
    cache.values[...] = rng.standard_normal(cache.values.shape).astype(np.float32)
    return cache


def test_kernel_mode_attention_agrees_with_blas_and_keeps_decode_rows_invariant() -> None:
    rng = np.random.default_rng(1)
    cache = _cache(rng, 6, ROW_ATTENTION_ROWS + 8)
    kernels, blas = CpuBackend(kernels="exact", kernel_table={}), CpuBackend(kernels="blas")
    # Three decode rows, a 4-row verify run and a prefill run that attends in blocks.
    slots = np.asarray([0, 2, 5, 1, 3], dtype=np.int64)
    starts = np.asarray([9, 30, 3, 12, 0], dtype=np.int64)
    lengths = np.asarray([1, 1, 1, 4, ROW_ATTENTION_ROWS + 3], dtype=np.int64)
    plan = AttentionPlan.build(slots, starts, lengths)
    q = rng.standard_normal((int(lengths.sum()), 4, 32)).astype(np.float32)
    got = kernels.attention(q, cache, 0, plan)
    np.testing.assert_allclose(got, blas.attention(q, cache, 0, plan), rtol=2e-5, atol=2e-6)
    # Each decode row alone, and the verify run alone, give the same bits as inside the batch.
    row = 0
    for slot, start, length in zip(slots[:4], starts[:4], lengths[:4], strict=True):
        alone_plan = AttentionPlan.build(np.asarray([slot]), np.asarray([start]), np.asarray([length]))
        alone = kernels.attention(q[row : row + length], cache, 0, alone_plan)
        assert (alone == got[row : row + length]).all()
        row += int(length)
    # A verify row equals the decode row of the same position.
    decode_plan = AttentionPlan.build(np.asarray([1]), np.asarray([13]), np.asarray([1]))
    verify_second_row = 3 + 1
    decoded = kernels.attention(q[verify_second_row : verify_second_row + 1], cache, 0, decode_plan)
    assert (decoded[0] == got[verify_second_row]).all()


def run_reference(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, start: int, window: int | None
) -> np.ndarray:
    """A prefill run in float64: row t at position start + t sees positions (p - window, p]."""
    length, heads, _ = q.shape
    group = heads // keys.shape[0]
    out = np.empty(q.shape, dtype=np.float64)
    for t in range(length):
        position = start + t
        first = 0 if window is None else max(0, position + 1 - window)
        for head in range(heads):
            k = keys[head // group, first : position + 1].astype(np.float64)
            v = values[head // group, first : position + 1].astype(np.float64)
            scores = k @ q[t, head].astype(np.float64)
            weights = np.exp(scores - scores.max())
            out[t, head] = weights @ v / weights.sum()
    return out


@pytest.mark.parametrize(("start", "length", "window"), [(0, 150, None), (37, 130, None), (20, 140, 48)])
def test_prefill_run_blocks_match_float64_on_any_thread_count(
    start: int, length: int, window: int | None
) -> None:
    """The blocked prefill attention (causal and sliding-window, a run starting past 0, a last block
    shorter than BLOCK_ROWS) against float64, and the same bits with a thread pool as without."""
    from concurrent.futures import ThreadPoolExecutor

    from infer.engine.backends.cpu_kernels.prefill_attention import BLOCK_ROWS, run_attention

    assert length % BLOCK_ROWS and length > BLOCK_ROWS
    rng = np.random.default_rng(start)
    kv_heads, heads, head_dim = 3, 9, 64
    keys = rng.standard_normal((kv_heads, start + length + 5, head_dim)).astype(np.float32)
    values = rng.standard_normal((kv_heads, start + length + 5, head_dim)).astype(np.float32)
    q = (rng.standard_normal((length, heads, head_dim)) * 0.3).astype(np.float32)
    serial = np.full_like(q, np.nan)
    run_attention(q, keys, values, start, window, serial, None)
    np.testing.assert_allclose(serial, run_reference(q, keys, values, start, window), rtol=1e-4, atol=2e-5)
    with ThreadPoolExecutor(2) as pool:
        pooled = np.full_like(q, np.nan)
        run_attention(q, keys, values, start, window, pooled, pool)
    assert (pooled == serial).all()
