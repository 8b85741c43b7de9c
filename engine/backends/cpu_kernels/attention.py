"""Attention of single rows against their own sequence's cache, one row at a time, in a fixed order.

A row's result depends only on its query, its slot and how many positions it sees: each score is one
compiled dot-product loop over the head (its summation order fixed by the head width alone), the softmax
and the weighted sum of values walk the positions in order. So a decode row, a row verifying drafts and
the same row recomputed alone give the same bits whatever else is in the batch (batched BLAS over padded
widths cannot promise that: its blocking, and so its summation order, follows the batch's shape).

numba's cache tracks only the source file of the cached function: after editing rowops.exp_f32, which
the softmax inlines, touch this file so the kernel is recompiled.
"""

from __future__ import annotations

import numba
import numpy as np

from .rowops import exp_f32


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """sum(a * b) over one head. LLVM may reassociate (vector lanes, unrolled chains) and fuse: the
    order it picks depends only on the length, never on the batch. Not inlined at numba's level, so
    these flags stay on its own instructions and never reach the caller's softmax arithmetic."""
    acc = np.float32(0.0)
    for j in range(a.shape[0]):
        acc += a[j] * b[j]
    return acc


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


# error_model="numpy": no zero check on float division (it would keep LLVM from vectorising).
@numba.njit(cache=True, parallel=True, error_model="numpy")
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
        count = n - f
        weights = np.empty(count, dtype=np.float32)
        query = q[row, head]
        head_keys = keys[slot, kv]
        top = np.float32(-np.inf)
        for p in range(count):
            score = _dot(query, head_keys[f + p])
            weights[p] = score
            if score > top:
                top = score
        for p in range(count):  # vectorised: no sum in this loop
            weights[p] = exp_f32(weights[p] - top)
        total = np.float32(0.0)
        for p in range(count):
            total += weights[p]
        target = out[row, head]
        for j in range(head_dim):
            target[j] = 0.0
        head_values = values[slot, kv]
        for p in range(count):
            w = weights[p]
            value = head_values[f + p]
            for j in range(head_dim):
                target[j] += w * value[j]
        inverse = np.float32(1.0) / total
        for j in range(head_dim):
            target[j] *= inverse
