"""Int8-activation matmuls on raw legacy blocks (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1): the driver of simd_int8.py.

Activations come quantized per 32-block (quantize_activations: xq int8, xs float32); what the row dots
read of them is laid out once per call (`int8_activations`). Threads split the output rows only (prange
over tiles of TILE weight rows); within a tile the activation rows go in groups of 8 and one group of
the 1 to 7 left, each group sharing every decoded weight pair (simd_int8.py), so up to 8 rows (k drafts
and the bonus row of a verify step) cost one pass over the weights. A last group of one row (a decode
step) takes two weight rows a loop (simd_int8.PAIR_DOTS), each output with the one-row arithmetic.
Every out[b, o] goes through the same per-row arithmetic in the same order whatever group it is in, so
a row's result is bit-identical alone or anywhere in a batch. From legacy_tiles_int8.min_rows activation
rows a call takes the tiled kernel of legacy_tiles_int8.py instead, which gives the same bits.
One driver, `_matmul`, specialised per type and int8 path (both literal arguments), so a process compiles
(or loads from numba's cache) only its model's types on the path its host runs; `matmul_int8_path`
reaches the other paths (the tests compare them bit for bit).
These kernels' cache entries also hold simd_int8.py's code: cache_freshness.py drops them when it changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange, types
from numba.extending import overload

from . import legacy_tiles_int8, simd_int8
from .simd import store_column

TILE = 16
"""Weight rows per parallel work item."""

INT8_PATH = simd_int8.available_paths()[-1]
"""The int8 path the public int8 kernels use: the best this host has (VNNI > AVX2 > portable)."""


@njit(cache=True)
def int8_activations(xq, xs):
    """What the int8 row dots read of the activations, laid out once per call for every weight row
    (simd_int8.py): xa int8 [B, in], xq with each block pair's halves rearranged as the kernels hold the
    weights (the first 16 of both blocks, then the last 16 of both; an odd last block as it is), xu
    uint8 = xa + 128 (the unsigned side of vpdpbusd against signed weights), and per lane (four a
    block, lane k: xq 4k..4k + 3 and 16 + 4k..16 + 4k + 3) int32 / float32 [B, in // 8]: the lane's xq
    sum xsum, its block's scale xs4, and xs_sum = xs * (the block's xq sum) in lane 0, zero in lanes 1-3
    (Q4_1's min term; exact in float32: a half-precision scale times at most 12 bits)."""
    batch, width = xq.shape
    blocks = width // 32
    paired = blocks - blocks % 2
    xa = np.empty((batch, width), np.int8)
    xu = np.empty((batch, width), np.uint8)
    xsum = np.empty((batch, 4 * blocks), np.int32)
    xs_sum = np.zeros((batch, 4 * blocks), np.float32)
    xs4 = np.empty((batch, 4 * blocks), np.float32)
    for b in range(batch):
        for k in range(blocks):
            first, second = 32 * k, 32 * k + 16  # where the block's halves go
            if k < paired:
                first = 64 * (k // 2) + 16 * (k % 2)
                second = first + 32
            for i in range(16):
                xa[b, first + i] = xq[b, 32 * k + i]
                xa[b, second + i] = xq[b, 32 * k + 16 + i]
            total = np.int32(0)
            for lane in range(4):
                part = np.int32(0)
                for t in range(4):
                    part += np.int32(xq[b, 32 * k + 4 * lane + t]) + np.int32(
                        xq[b, 32 * k + 16 + 4 * lane + t]
                    )
                xsum[b, 4 * k + lane] = part
                xs4[b, 4 * k + lane] = xs[b, k]
                total += part
            xs_sum[b, 4 * k] = xs[b, k] * np.float32(total)
        for j in range(width):
            xu[b, j] = np.uint8(np.int32(xa[b, j]) + 128)
    return xa, xu, xsum, xs_sum, xs4


def _rows(kind, path, count, row, xa, xu, xsum, xs_sum, xs4, b):
    """simd_int8's `count`-row dot of type `kind` on int8 path `path` (all three literals): resolved at
    compile time (`_rows_of`), so a driver specialised for one type and path holds only that type's
    and path's row dots."""
    raise NotImplementedError  # only called from compiled code


@overload(_rows, inline="always")
def _rows_of(kind, path, count, row, xa, xu, xsum, xs_sum, xs4, b):
    """The row-dot intrinsic `_rows` names, from simd_int8.ROW_DOTS."""
    if not (
        isinstance(kind, types.StringLiteral)
        and isinstance(path, types.IntegerLiteral)
        and isinstance(count, types.IntegerLiteral)
    ):
        return None
    dot = simd_int8.ROW_DOTS[(kind.literal_value, path.literal_value, count.literal_value)]

    def rows(kind, path, count, row, xa, xu, xsum, xs_sum, xs4, b):
        return dot(row, xa, xu, xsum, xs_sum, xs4, b)

    return rows


def _pair(kind, path, blocks, o, xa, xu, xsum, xs_sum, xs4, b):
    """simd_int8's paired row dot (weight rows o and o + 1 against activation row b) of type `kind` on
    int8 path `path` (both literals), resolved at compile time as `_rows` is."""
    raise NotImplementedError  # only called from compiled code


@overload(_pair, inline="always")
def _pair_of(kind, path, blocks, o, xa, xu, xsum, xs_sum, xs4, b):
    """The paired row-dot intrinsic `_pair` names, from simd_int8.PAIR_DOTS."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(path, types.IntegerLiteral)):
        return None
    dot = simd_int8.PAIR_DOTS[(kind.literal_value, path.literal_value)]

    def pair(kind, path, blocks, o, xa, xu, xsum, xs_sum, xs4, b):
        return dot(blocks[o], blocks[o + 1], xa, xu, xsum, xs_sum, xs4, b)

    return pair


# Not cached itself: numba keeps every signature of a function in one cache index, and two processes
# compiling two of them at once (test workers, two types) can pair one key with the other's code; each
# `bound_kernel` holds its copy of this driver in a cache file of its own.
@njit(parallel=True)
def _row_dots(blocks, xq, xs, out, kind, path):
    """out = the int8 product of `blocks` of type `kind` (a simd_int8 kind name) with the activations,
    on int8 path `path`, through the row dots. Both are made literals, so each type and path compiles a
    driver holding only that type's row dots."""
    numba.literally(kind)
    numba.literally(path)
    batch = xq.shape[0]
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 8, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:  # (a decode row) two weight rows a loop, the stream a row further ahead
            for o in range(first, last - 1, 2):
                both = _pair(kind, path, blocks, o, xa, xu, xsum, xs_sum, xs4, b)
                out[b, o] = both[0]
                out[b, o + 1] = both[1]
            if (last - first) % 2:
                o = last - 1
                store_column(out, b, o, _rows(kind, path, 1, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 2, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 3, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 4, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 5, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 6, blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, _rows(kind, path, 7, blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit
def _matmul(blocks, xq, xs, out, kind, path):
    """`_row_dots`, or from legacy_tiles_int8.min_rows activation rows the tiled kernel (the same bits,
    faster there)."""
    numba.literally(kind)
    numba.literally(path)
    if xq.shape[0] >= legacy_tiles_int8.tiled_from(kind, path):
        legacy_tiles_int8.tiled_matmul(blocks, xq, xs, out, kind, path)
    else:
        _row_dots(blocks, xq, xs, out, kind, path)


@functools.cache
def bound_kernel(kind: str, path: int, tiles: bool = True) -> Callable[..., None]:
    """`_matmul` (`_row_dots` without `tiles`) for one type (a simd_int8 kind name) and int8 path as a
    compiled function (blocks, xq, xs, out): the literals bound in at compile time, where a Python call
    passing them would make numba retry its typing on every call (about 0.2 s). Each is cached by numba
    in files of its own (named by its qualified name); compiled callers (decode_row.py) take it as a
    function value."""
    # each variant names its driver as a global: numba keys a closure's cache entries by its captured
    # values, and a captured dispatcher pickles differently in every process (a new entry each run)
    if tiles:

        def bound(blocks, xq, xs, out):
            _matmul(blocks, xq, xs, out, kind, path)

    else:

        def bound(blocks, xq, xs, out):
            _row_dots(blocks, xq, xs, out, kind, path)

    bound.__qualname__ = f"{kind}_int8_{simd_int8.PATH_NAMES[path]}" + ("" if tiles else "_row_dots")
    return njit(cache=True)(bound)


def matmul_int8_path(
    type_name: str, blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Legacy `type_name` (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1) weights against int8 activations through int8
    path `path` (simd_int8: PORTABLE, AVX2, VNNI; every path gives the same bits)."""
    bound_kernel(type_name.lower(), path)(blocks, xq, xs, out)


def q4_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    bound_kernel("q4_0", INT8_PATH)(blocks, xq, xs, out)


def q4_1_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_1 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    bound_kernel("q4_1", INT8_PATH)(blocks, xq, xs, out)


def q8_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q8_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    bound_kernel("q8_0", INT8_PATH)(blocks, xq, xs, out)


def q5_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    bound_kernel("q5_0", INT8_PATH)(blocks, xq, xs, out)


def q5_1_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_1 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    bound_kernel("q5_1", INT8_PATH)(blocks, xq, xs, out)


def host_int8_kernels() -> dict[str, Callable[..., None]]:
    """Each type's compiled int8 kernel (blocks, xq, xs, out) on the host's path: what compiled callers
    (decode_row.py) call for the type's `*_matmul_int8`."""
    names = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")
    return {name: bound_kernel(name.lower(), INT8_PATH) for name in names}
