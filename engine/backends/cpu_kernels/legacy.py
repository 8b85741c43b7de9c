"""Kernels on raw GGUF blocks of the legacy 32-weight types: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1.

Block layouts (little-endian, ggml-common.h):
    Q4_0: d f16, qs[16]          weight j = d * ((qs[j] & 15) - 8), weight j + 16 = d * ((qs[j] >> 4) - 8)
    Q4_1: d f16, m f16, qs[16]   weight j = d * (qs[j] & 15) + m,   weight j + 16 = d * (qs[j] >> 4) + m
    Q8_0: d f16, qs[32] int8     weight j = d * qs[j]
    Q5_0: d f16, qh u32, qs[16]  weight j = d * ((qs[j] & 15 | bit j of qh << 4) - 16),
                                 weight j + 16 = d * ((qs[j] >> 4 | bit j + 16 of qh << 4) - 16)
    Q5_1: d f16, m f16, qh u32, qs[16]   as Q5_0 without the - 16, plus m (as Q4_1)

matmul_exact decodes each block in vector registers (simd.py) and uses it for up to 6 activation rows
at once: the weights are read from memory once per call for all B rows. dequantize_rows uses the same
arithmetic as gguf's numpy dequantize, so its weights are bit-identical to it.
matmul_int8 (legacy_int8.py) works on integers inside a block (exact) and scales per block in float32.
Batch invariance: threads split the output rows only (prange over rows); every out[b, o] goes through
the same per-row arithmetic in the same order (simd.py) whether its activation row is computed alone or
in a group of 2 to 6, whatever B is and wherever row b sits.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from . import simd
from .bits import half_to_f32
from .legacy_int8 import (  # noqa: F401 (INT8_PATH and matmul_int8_path: the tests run every path)
    INT8_PATH,
    matmul_int8_path,
    q4_0_matmul_int8,
    q4_1_matmul_int8,
    q5_0_matmul_int8,
    q5_1_matmul_int8,
    q8_0_matmul_int8,
)
from .registry import QuantKernels

QK = 32
"""Weights per block."""
TILE = 16
"""Output rows per parallel work item (one scratch row allocated per item, not per row)."""

_FAST = {"reassoc", "contract"}
"""The dot products: LLVM may reassociate (vector lanes) and fuse. The order it picks depends only on
the length of the row, never on B or on which row b is (one compiled loop, the same for every b)."""


@njit(inline="always", cache=True, fastmath=_FAST)
def dot_f32(w, x):
    """Dot product of two float32 vectors of the same length, accumulated in float32."""
    acc = np.float32(0.0)
    for i in range(w.shape[0]):
        acc += w[i] * x[i]
    return acc


# ---- dequantize one row (shared by matmul_exact and dequantize_rows; no fastmath: exact gguf arithmetic)


@njit(inline="always", cache=True)
def _q4_0_row(row, w):
    for k in range(w.shape[0] // QK):
        off = k * 18
        d = half_to_f32(row[off], row[off + 1])
        base = k * QK
        for j in range(16):
            q = row[off + 2 + j]
            w[base + j] = d * np.float32(np.int32(q & 15) - 8)
            w[base + 16 + j] = d * np.float32(np.int32(q >> 4) - 8)


@njit(inline="always", cache=True)
def _q4_1_row(row, w):
    for k in range(w.shape[0] // QK):
        off = k * 20
        d = half_to_f32(row[off], row[off + 1])
        m = half_to_f32(row[off + 2], row[off + 3])
        base = k * QK
        for j in range(16):
            q = row[off + 4 + j]
            w[base + j] = d * np.float32(q & 15) + m
            w[base + 16 + j] = d * np.float32(q >> 4) + m


@njit(inline="always", cache=True)
def _q8_0_row(row, w):
    qs = row.view(np.int8)
    for k in range(w.shape[0] // QK):
        off = k * 34
        d = half_to_f32(row[off], row[off + 1])
        base = k * QK
        for j in range(QK):
            w[base + j] = d * np.float32(qs[off + 2 + j])


@njit(inline="always", cache=True)
def _five_bit_row(row, w, block_bytes, qh_at, has_min):
    """A Q5_0 (has_min False: d * (q - 16)) or Q5_1 (d * q + m) row: d f16 (then m f16), qh u32 at
    `qh_at` (bit j: the fifth bit of weight j), qs[16] after it."""
    for k in range(w.shape[0] // QK):
        off = k * block_bytes
        d = half_to_f32(row[off], row[off + 1])
        m = half_to_f32(row[off + 2], row[off + 3]) if has_min else np.float32(0.0)
        at = off + qh_at
        qh = (
            np.uint32(row[at])
            | (np.uint32(row[at + 1]) << np.uint32(8))
            | (np.uint32(row[at + 2]) << np.uint32(16))
            | (np.uint32(row[at + 3]) << np.uint32(24))
        )
        base = k * QK
        for j in range(16):
            q = row[at + 4 + j]
            low = np.int32(q & 15) | np.int32(((qh >> np.uint32(j)) & np.uint32(1)) << np.uint32(4))
            high = np.int32(q >> 4) | np.int32(((qh >> np.uint32(j + 16)) & np.uint32(1)) << np.uint32(4))
            if has_min:
                w[base + j] = d * np.float32(low) + m
                w[base + 16 + j] = d * np.float32(high) + m
            else:
                w[base + j] = d * np.float32(low - 16)
                w[base + 16 + j] = d * np.float32(high - 16)


@njit(inline="always", cache=True)
def _q5_0_row(row, w):
    _five_bit_row(row, w, 22, 2, False)


@njit(inline="always", cache=True)
def _q5_1_row(row, w):
    _five_bit_row(row, w, 24, 4, True)


# ---- matmul_exact: one driver, specialised per type


def _dots(kind, count, row, x, b):
    """simd.py's `count`-row dot of type `kind` (both literals), resolved at compile time (`_dots_of`),
    so a driver specialised for one type holds only that type's dots."""
    raise NotImplementedError  # only called from compiled code


@overload(_dots, inline="always")
def _dots_of(kind, count, row, x, b):
    """The dot intrinsic `_dots` names, from simd.DOTS."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(count, types.IntegerLiteral)):
        return None
    dot = simd.DOTS[(kind.literal_value, count.literal_value)]

    def dots(kind, count, row, x, b):
        return dot(row, x, b)

    return dots


# Not cached itself (as legacy_int8._matmul): each `_bound_exact` holds its copy in a cache file of its own.
@njit(parallel=True)
def _exact(blocks, x, out, kind):
    """out[b, o] = sum_i x[b, i] * W[o, i] for blocks of type `kind` (a simd.py kind name, made a
    literal: one compiled driver per type): weights decoded in registers (simd.py), float32
    accumulation; activation rows in groups of 6 sharing each decoded block, the last 1 to 5 rows in one
    group (a verify step of 4 drafts and the bonus row is one pass over the weights)."""
    numba.literally(kind)
    batch = x.shape[0]
    if batch == 1:
        for o in prange(blocks.shape[0]):
            (out[0, o],) = _dots(kind, 1, blocks[o], x, 0)
        return
    full = batch - batch % 6
    rest = batch % 6
    rows = blocks.shape[0]
    # a tile of TILE weight rows against each group of activation rows: both stay in L1 (the loop
    # order changes nothing in any one dot product)
    for t in prange((rows + TILE - 1) // TILE):
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, full, 6):
            for o in range(first, last):
                simd.store_column(out, b, o, _dots(kind, 6, blocks[o], x, b))
        if rest == 0:
            continue
        for o in range(first, last):
            if rest == 1:
                simd.store_column(out, full, o, _dots(kind, 1, blocks[o], x, full))
            elif rest == 2:
                simd.store_column(out, full, o, _dots(kind, 2, blocks[o], x, full))
            elif rest == 3:
                simd.store_column(out, full, o, _dots(kind, 3, blocks[o], x, full))
            elif rest == 4:
                simd.store_column(out, full, o, _dots(kind, 4, blocks[o], x, full))
            else:
                simd.store_column(out, full, o, _dots(kind, 5, blocks[o], x, full))


@functools.cache
def _bound_exact(kind: str) -> Callable[[np.ndarray, np.ndarray, np.ndarray], None]:
    """`_exact` for one type as a compiled function (blocks, x, out), its kind bound in at compile time:
    a Python call passing the literal would make numba retry its typing on every call. Cached by numba
    in files of its own (named by its qualified name)."""

    def bound(blocks, x, out):
        _exact(blocks, x, out, kind)

    bound.__qualname__ = f"{kind}_exact"
    return njit(cache=True)(bound)


def q4_0_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[b, o] = sum_i x[b, i] * W[o, i] for Q4_0 blocks (`_exact`)."""
    _bound_exact("q4_0")(blocks, x, out)


def q4_1_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[b, o] = sum_i x[b, i] * W[o, i] for Q4_1 blocks (`_exact`)."""
    _bound_exact("q4_1")(blocks, x, out)


def q8_0_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[b, o] = sum_i x[b, i] * W[o, i] for Q8_0 blocks (`_exact`)."""
    _bound_exact("q8_0")(blocks, x, out)


def q5_0_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[b, o] = sum_i x[b, i] * W[o, i] for Q5_0 blocks (`_exact`)."""
    _bound_exact("q5_0")(blocks, x, out)


def q5_1_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out[b, o] = sum_i x[b, i] * W[o, i] for Q5_1 blocks (`_exact`)."""
    _bound_exact("q5_1")(blocks, x, out)


# ---- dequantize_rows


@njit(cache=True, parallel=True)
def q4_0_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W as float32, exactly as gguf's dequantize."""
    for r in prange(start, stop):
        _q4_0_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True)
def q4_1_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W as float32, exactly as gguf's dequantize."""
    for r in prange(start, stop):
        _q4_1_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True)
def q8_0_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W as float32, exactly as gguf's dequantize."""
    for r in prange(start, stop):
        _q8_0_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True)
def q5_0_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W as float32, exactly as gguf's dequantize."""
    for r in prange(start, stop):
        _q5_0_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True)
def q5_1_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W as float32, exactly as gguf's dequantize."""
    for r in prange(start, stop):
        _q5_1_row(blocks[r], out[r - start])


LEGACY_KERNELS: dict[str, QuantKernels] = {
    "Q4_0": QuantKernels("Q4_0", QK, 18, q4_0_matmul_exact, q4_0_matmul_int8, q4_0_dequantize_rows),
    "Q4_1": QuantKernels("Q4_1", QK, 20, q4_1_matmul_exact, q4_1_matmul_int8, q4_1_dequantize_rows),
    "Q8_0": QuantKernels("Q8_0", QK, 34, q8_0_matmul_exact, q8_0_matmul_int8, q8_0_dequantize_rows),
    "Q5_0": QuantKernels("Q5_0", QK, 22, q5_0_matmul_exact, q5_0_matmul_int8, q5_0_dequantize_rows),
    "Q5_1": QuantKernels("Q5_1", QK, 24, q5_1_matmul_exact, q5_1_matmul_int8, q5_1_dequantize_rows),
}
"""The legacy 32-weight block types."""
