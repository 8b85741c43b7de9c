"""Attention of single rows against their own sequence's cache, one row at a time, in a fixed order.

A row's result depends only on its query, its slot and how many positions it sees: the dot products run
in 16 fixed lanes summed in a fixed tree, the softmax and the weighted sum of values walk the positions
in order. So a decode row, a row verifying drafts and the same row recomputed alone give the same bits
whatever else is in the batch (batched BLAS over padded widths cannot promise that: its blocking, and
so its summation order, follows the batch's shape).
"""

from __future__ import annotations

import math

import numba
import numpy as np

LANES = 16
"""Partial sums per dot product (a multiple of the SIMD width, so LLVM vectorises the lanes)."""


@numba.njit(cache=True, inline="always")
def _dot(a: np.ndarray, b: np.ndarray, lanes: np.ndarray) -> np.float32:
    """sum(a * b) over one head, in LANES fixed partial sums (`lanes`, scratch) reduced by a fixed tree."""
    for lane in range(LANES):
        lanes[lane] = 0.0
    width = a.shape[0]
    full = width - width % LANES
    for base in range(0, full, LANES):
        for lane in range(LANES):
            lanes[lane] += a[base + lane] * b[base + lane]
    for j in range(full, width):
        lanes[j - full] += a[j] * b[j]
    step = LANES // 2
    while step:
        for lane in range(step):
            lanes[lane] += lanes[lane + step]
        step //= 2
    return lanes[0]


def row_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    slots: np.ndarray,
    visible: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[r] = softmax(q[r] . K[slot, :, :n]) V[slot, :, :n] for r in `rows` (n = visible[i]); see
    `window_row_attention`, which this is with every row seeing from position 0."""
    window_row_attention(q, keys, values, rows, slots, np.zeros_like(visible), visible, out)


@numba.njit(cache=True, parallel=True)
def window_row_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    slots: np.ndarray,
    first: np.ndarray,
    visible: np.ndarray,
    out: np.ndarray,
) -> None:
    """out[r] = softmax(q[r] . K[slot, :, f:n]) V[slot, :, f:n] for r in `rows` (f = first[i], n =
    visible[i]: positions f..n-1; f > 0 for sliding-window attention).

    q, out: float32 [batch_rows, heads, head_dim]; keys, values: [slots, kv_heads, capacity, head_dim];
    rows, slots, first, visible: int64 [m]. Heads share kv heads in groups (grouped-query attention). Scores
    are not scaled here (the scale is folded into q). Parallel over (row, head): one task computes a
    whole row-head, so the thread count never changes a result (and a single decode row still has
    as many tasks as heads to share among the threads).
    """
    heads = q.shape[1]
    head_dim = q.shape[2]
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    for task in numba.prange(rows.shape[0] * heads):
        i = task // heads
        head = task % heads
        kv = head // group
        row, slot, f, n = rows[i], slots[i], first[i], visible[i]
        weights = np.empty(n - f, dtype=np.float32)
        lanes = np.empty(LANES, dtype=np.float32)
        query = q[row, head]
        top = np.float32(-np.inf)
        for p in range(f, n):
            score = _dot(query, keys[slot, kv, p], lanes)
            weights[p - f] = score
            if score > top:
                top = score
        total = np.float32(0.0)
        for p in range(f, n):
            e = np.float32(math.exp(weights[p - f] - top))
            weights[p - f] = e
            total += e
        target = out[row, head]
        for j in range(head_dim):
            target[j] = 0.0
        for p in range(f, n):
            w = weights[p - f]
            value = values[slot, kv, p]
            for j in range(head_dim):
                target[j] += w * value[j]
        inverse = np.float32(1.0) / total
        for j in range(head_dim):
            target[j] *= inverse
