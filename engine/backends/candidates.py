"""The device half of envelope sampling, written once over an array module (numpy, mlx.core, cupy).

For every logits row it adds the request's logit bias, flags rows the device must not decide (any
NaN, any +inf, or no finite logit) and returns the row's `width` best biased logits, sorted best
first, with their token ids. Only these [rows, width] pairs travel to the host, never the whole
vocabulary; the host finishes the draw on them with the host chain's own code
(`infer.engine.sampling.envelope`), so both paths draw the same token by construction.

Everything here is exact float32 arithmetic (one add per biased token, comparisons, a partial sort):
no transcendental function whose last bit could differ between numpy, MLX and CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from infer.engine.backends.arrays import Array


@dataclass(frozen=True)
class RowBias:
    """The logit bias of every row, flattened: row index, token id and float32 bias of each entry
    (host arrays; a (row, token) pair appears at most once)."""

    rows: np.ndarray
    tokens: np.ndarray
    values: np.ndarray

    @classmethod
    def none(cls) -> RowBias:
        """No bias on any row."""
        empty = np.zeros(0, dtype=np.int64)
        return cls(empty, empty, np.zeros(0, dtype=np.float32))


@dataclass(frozen=True)
class Candidates:
    """Host copies of the device's answer: `values` float32 [rows, width] (biased logits, descending),
    `ids` int64 [rows, width] (their token ids), `unsafe` bool [rows] (the row has a NaN, a +inf or no
    finite logit: the host samples it from the full row, and raises the host's error)."""

    values: np.ndarray
    ids: np.ndarray
    unsafe: np.ndarray


def _index(xp: Any, host: np.ndarray) -> Array:
    """Host indices as an array of `xp` (MLX indexes only with its own arrays, and int32)."""
    return xp.array(host.astype(np.int32)) if xp is not np else host


def top_candidates(
    xp: Any, logits: Array, bias: RowBias, width: int, to_host: Any = np.asarray
) -> Candidates:
    """The `width` best biased logits of every row of `logits` (an `xp` float32 array [rows, vocab])
    with their ids, and the rows the device must leave to the host. `to_host` copies an `xp` array
    into numpy (`np.asarray` for numpy, `cupy.asnumpy`, `np.array` for MLX)."""
    rows, vocab = logits.shape
    width = max(1, min(int(width), int(vocab)))
    w = logits.astype(xp.float32)
    if bias.rows.size:
        if xp is np:
            w = w.copy()
        r, t = _index(xp, bias.rows), _index(xp, bias.tokens)
        w[r, t] = w[r, t] + xp.array(bias.values.astype(np.float32))
    top = xp.max(w, axis=-1)
    unsafe = xp.any(xp.isnan(w), axis=-1) | (top == float("inf")) | (top == -float("inf"))
    if width < vocab:
        picked = xp.argpartition(-w, width - 1, axis=-1)[:, :width]
        values = xp.take_along_axis(w, picked, axis=-1)
    else:
        picked = xp.broadcast_to(xp.arange(vocab)[None, :], (rows, vocab))
        values = w
    order = xp.argsort(-values, axis=-1)
    values = xp.take_along_axis(values, order, axis=-1)
    ids = xp.take_along_axis(picked, order, axis=-1)
    return Candidates(
        np.asarray(to_host(values), dtype=np.float32),
        np.asarray(to_host(ids), dtype=np.int64),
        np.asarray(to_host(unsafe), dtype=bool).reshape(rows),
    )
