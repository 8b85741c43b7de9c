"""Int8-activation matmuls on raw K-quant blocks (Q4_K, Q5_K, Q6_K): the drivers of kquants_simd_int8.py.

Activations come quantized per 256-block as llama.cpp's Q8_K (activations.quantize_activations_k: xq
int8, a scale xd per 256, the sums xb of each 16 xq), the quantizer these kernels register. Threads
split the output rows only (prange over tiles of TILE weight rows); each super-block's scales and chunks
are decoded in registers and shared by up to four activation rows at a time; one activation row (a
decode step) takes two weight rows a loop instead (`_weight_pair`: one reduction tree for both, each
row's block of the next pair prefetched: two streams of a thread keep more of memory's lines in flight). From
kquants_tiles_int8.MIN_ROWS activation rows a call takes the tiled kernel instead (weights unpacked once
per call, one activation row per lane), which computes the same integers and the same float part. Every
out[b, o] goes through the same arithmetic in the same order whatever group or kernel it is in, and every
path gives the same integers, so a row's result is bit-identical alone, in any batch, and on every path
(kquants_simd_int8.py says why).
`matmul_int8_path` runs one path by number (simd_int8: PORTABLE, AVX2, VNNI); the public kernels take
the best the host has. Their cache entries hold kquants_simd_int8.py's and simd_int8.py's code too:
cache_freshness.py drops them when any kernel module changes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable

import numba
import numpy as np
from numba import njit, prange

from . import kquants_simd_int8 as k8
from . import kquants_tiles_int8 as tiles
from .activations import quantize_activations_k
from .kquants import KQUANT_KERNELS as _FLOAT_KQUANT_KERNELS
from .kquants import Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES, check_segments, check_shapes
from .registry import QuantKernels
from .simd import store_column
from .simd_int8 import available_paths

TILE = 16
"""Weight rows per parallel work item."""

GROUP = k8.ROW_COUNTS[-1]
"""Activation rows per row-dot call (the last group of a call takes the 1 to GROUP - 1 left)."""

INT8_PATH = available_paths()[-1]
"""The int8 path the public kernels use: the best this host has (VNNI > AVX2 > portable)."""


@njit(inline="always", cache=True)
def _q4_k_rows(row, xq, xd, xb, b, count, o, out, path):
    """out[b .. b + count - 1, o] for one Q4_K weight row through int8 path `path`."""
    if path == 2:
        if count == 4:
            store_column(out, b, o, k8.q4_k_vnni4(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q4_k_vnni3(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q4_k_vnni2(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q4_k_vnni1(row, xq, xd, xb, b))
    elif path == 1:
        if count == 4:
            store_column(out, b, o, k8.q4_k_avx24(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q4_k_avx23(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q4_k_avx22(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q4_k_avx21(row, xq, xd, xb, b))
    elif count == 4:
        store_column(out, b, o, k8.q4_k_portable4(row, xq, xd, xb, b))
    elif count == 3:
        store_column(out, b, o, k8.q4_k_portable3(row, xq, xd, xb, b))
    elif count == 2:
        store_column(out, b, o, k8.q4_k_portable2(row, xq, xd, xb, b))
    else:
        store_column(out, b, o, k8.q4_k_portable1(row, xq, xd, xb, b))


@njit(inline="always", cache=True)
def _q5_k_rows(row, xq, xd, xb, b, count, o, out, path):
    """As `_q4_k_rows`, for Q5_K."""
    if path == 2:
        if count == 4:
            store_column(out, b, o, k8.q5_k_vnni4(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q5_k_vnni3(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q5_k_vnni2(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q5_k_vnni1(row, xq, xd, xb, b))
    elif path == 1:
        if count == 4:
            store_column(out, b, o, k8.q5_k_avx24(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q5_k_avx23(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q5_k_avx22(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q5_k_avx21(row, xq, xd, xb, b))
    elif count == 4:
        store_column(out, b, o, k8.q5_k_portable4(row, xq, xd, xb, b))
    elif count == 3:
        store_column(out, b, o, k8.q5_k_portable3(row, xq, xd, xb, b))
    elif count == 2:
        store_column(out, b, o, k8.q5_k_portable2(row, xq, xd, xb, b))
    else:
        store_column(out, b, o, k8.q5_k_portable1(row, xq, xd, xb, b))


@njit(inline="always", cache=True)
def _q6_k_rows(row, xq, xd, xb, b, count, o, out, path):
    """As `_q4_k_rows`, for Q6_K."""
    if path == 2:
        if count == 4:
            store_column(out, b, o, k8.q6_k_vnni4(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q6_k_vnni3(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q6_k_vnni2(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q6_k_vnni1(row, xq, xd, xb, b))
    elif path == 1:
        if count == 4:
            store_column(out, b, o, k8.q6_k_avx24(row, xq, xd, xb, b))
        elif count == 3:
            store_column(out, b, o, k8.q6_k_avx23(row, xq, xd, xb, b))
        elif count == 2:
            store_column(out, b, o, k8.q6_k_avx22(row, xq, xd, xb, b))
        else:
            store_column(out, b, o, k8.q6_k_avx21(row, xq, xd, xb, b))
    elif count == 4:
        store_column(out, b, o, k8.q6_k_portable4(row, xq, xd, xb, b))
    elif count == 3:
        store_column(out, b, o, k8.q6_k_portable3(row, xq, xd, xb, b))
    elif count == 2:
        store_column(out, b, o, k8.q6_k_portable2(row, xq, xd, xb, b))
    else:
        store_column(out, b, o, k8.q6_k_portable1(row, xq, xd, xb, b))


@njit(inline="always", cache=True)
def _weight_pair(blocks, xq, xd, xb, b, o, out, kind, path):
    """out[b, o] and out[b, o + 1]: weight rows o and o + 1 against activation row b in one loop (a
    decode row's products), each the same arithmetic as the one-row kernel's."""
    row0, row1 = blocks[o], blocks[o + 1]
    if kind == 0:
        if path == 2:
            pair = k8.q4_k_vnni_pair(row0, row1, xq, xd, xb, b)
        elif path == 1:
            pair = k8.q4_k_avx2_pair(row0, row1, xq, xd, xb, b)
        else:
            pair = k8.q4_k_portable_pair(row0, row1, xq, xd, xb, b)
    elif kind == 1:
        if path == 2:
            pair = k8.q5_k_vnni_pair(row0, row1, xq, xd, xb, b)
        elif path == 1:
            pair = k8.q5_k_avx2_pair(row0, row1, xq, xd, xb, b)
        else:
            pair = k8.q5_k_portable_pair(row0, row1, xq, xd, xb, b)
    elif path == 2:
        pair = k8.q6_k_vnni_pair(row0, row1, xq, xd, xb, b)
    elif path == 1:
        pair = k8.q6_k_avx2_pair(row0, row1, xq, xd, xb, b)
    else:
        pair = k8.q6_k_portable_pair(row0, row1, xq, xd, xb, b)
    out[b, o] = pair[0]
    out[b, o + 1] = pair[1]


@njit(inline="always", cache=True)
def _weight_row(row, xq, xd, xb, lo, hi, o, out, kind, path):
    """out[lo .. hi - 1, o]: one weight row against activation rows lo .. hi - 1, GROUP at a time."""
    for b in range(lo, hi, GROUP):
        count = min(GROUP, hi - b)
        if kind == 0:
            _q4_k_rows(row, xq, xd, xb, b, count, o, out, path)
        elif kind == 1:
            _q5_k_rows(row, xq, xd, xb, b, count, o, out, path)
        else:
            _q6_k_rows(row, xq, xd, xb, b, count, o, out, path)


@njit(cache=True, parallel=True)
def _int8_matmul(blocks, xq, xd, xb, out, kind, path):
    """out = (xq * xd) @ W.T for Q4_K (kind 0), Q5_K (1) or Q6_K (2) through int8 path `path`."""
    n_b = xq.shape[0]
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):
        start, stop = t * TILE, min(rows, (t + 1) * TILE)
        if n_b == 1:  # decode: two weight rows a loop (the next pair's rows are prefetched)
            for o in range(start, stop - 1, 2):
                _weight_pair(blocks, xq, xd, xb, 0, o, out, kind, path)
            if (stop - start) % 2:
                _weight_row(blocks[stop - 1], xq, xd, xb, 0, 1, stop - 1, out, kind, path)
        else:
            for o in range(start, stop):
                _weight_row(blocks[o], xq, xd, xb, 0, n_b, o, out, kind, path)


@njit(cache=True)
def _matmul(blocks, xq, xd, xb, out, kind, path, lanes, rows_per_call, threads):
    """Shape checks, then the row dots, or from tiles.MIN_ROWS activation rows on the tiled kernel
    (`lanes`, `rows_per_call`: its shape on `path`): the same bits either way."""
    block_bytes = (Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES)[kind]
    check_shapes(blocks, xq.shape[1], block_bytes, xq.shape[0], out)
    if xd.shape[0] != xq.shape[0] or xd.shape[1] * 256 != xq.shape[1]:
        raise ValueError("xd must be [B, in // 256]")
    if xb.shape[0] != xq.shape[0] or xb.shape[1] * 16 != xq.shape[1]:
        raise ValueError("xb must be [B, in // 16]")
    xq, xd, xb = np.ascontiguousarray(xq), np.ascontiguousarray(xd), np.ascontiguousarray(xb)
    if xq.shape[0] >= tiles.MIN_ROWS:
        xp, xdp, xbp = tiles.pack_activations(xq, xd, xb, lanes)
        tiles.tiled_matmul(blocks, xp, xdp, xbp, xq.shape[0], out, kind, path, lanes, rows_per_call, threads)
    else:
        _int8_matmul(blocks, xq, xd, xb, out, kind, path)


def row_kernel() -> Callable[..., None]:
    """The compiled row dots (blocks, xq, xd, xb, out, kind, path) the public int8 matmuls run below
    tiles.MIN_ROWS activation rows (kind 0-2: Q4_K, Q5_K, Q6_K), for compiled callers (decode_row.py)."""
    return _int8_matmul


def _run(blocks, xq, xd, xb, out, kind: int, path: int) -> None:
    lanes, rows = tiles.SHAPES[path]
    _matmul(blocks, xq, xd, xb, out, kind, path, lanes, rows, numba.get_num_threads())


@njit(cache=True, parallel=True)
def _int8_segments(stack, experts, starts, xq, xd, xb, out, kind, path):
    """An expert stack's segments in one parallel loop over (segment, tile): segment s multiplies
    activation rows starts[s] .. starts[s + 1] - 1 by matrix experts[s], each row through the same
    row dots as `_int8_matmul` (whose bits do not depend on the rows beside it)."""
    rows = stack.shape[1]
    tiles = (rows + TILE - 1) // TILE
    for job in prange(experts.shape[0] * tiles):
        s = job // tiles
        t = job - s * tiles
        e, lo, hi = experts[s], starts[s], starts[s + 1]
        for o in range(t * TILE, min(rows, (t + 1) * TILE)):
            _weight_row(stack[e, o], xq, xd, xb, lo, hi, o, out, kind, path)


@njit(cache=True)
def _segments(stack, experts, starts, xq, xd, xb, out, kind, path):
    block_bytes = (Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES)[kind]
    check_segments(stack, experts, starts, xq.shape[1], block_bytes, xq.shape[0], out)
    if xd.shape[0] != xq.shape[0] or xd.shape[1] * 256 != xq.shape[1]:
        raise ValueError("xd must be [P, in // 256]")
    if xb.shape[0] != xq.shape[0] or xb.shape[1] * 16 != xq.shape[1]:
        raise ValueError("xb must be [P, in // 16]")
    _int8_segments(
        stack,
        experts,
        starts,
        np.ascontiguousarray(xq),
        np.ascontiguousarray(xd),
        np.ascontiguousarray(xb),
        out,
        kind,
        path,
    )


def segments_int8_path(type_name: str, stack, experts, starts, xq, xd, xb, out, path: int) -> None:
    """An expert stack of K-quant `type_name` against int8 activations, segment by segment in one call
    (registry.MatmulSegments), through int8 path `path`."""
    _segments(stack, experts, starts, xq, xd, xb, out, ("Q4_K", "Q5_K", "Q6_K").index(type_name), path)


def matmul_int8_path(
    type_name: str,
    blocks: np.ndarray,
    xq: np.ndarray,
    xd: np.ndarray,
    xb: np.ndarray,
    out: np.ndarray,
    path: int,
) -> None:
    """K-quant `type_name` weights against int8 activations through int8 path `path` (every path gives
    the same bits; one the host lacks runs as portable)."""
    _run(blocks, xq, xd, xb, out, ("Q4_K", "Q5_K", "Q6_K").index(type_name), path)


def q4_k_matmul_int8(
    blocks: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray, out: np.ndarray
) -> None:
    """Q4_K weights against int8 activations (quantize_activations_k) through the host's best path."""
    _run(blocks, xq, xd, xb, out, 0, INT8_PATH)


def q5_k_matmul_int8(
    blocks: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray, out: np.ndarray
) -> None:
    """Q5_K weights against int8 activations (quantize_activations_k) through the host's best path."""
    _run(blocks, xq, xd, xb, out, 1, INT8_PATH)


def q6_k_matmul_int8(
    blocks: np.ndarray, xq: np.ndarray, xd: np.ndarray, xb: np.ndarray, out: np.ndarray
) -> None:
    """Q6_K weights against int8 activations (quantize_activations_k) through the host's best path."""
    _run(blocks, xq, xd, xb, out, 2, INT8_PATH)


KQUANT_KERNELS: dict[str, QuantKernels] = {
    name: dataclasses.replace(
        kernels,
        matmul_int8=int8,
        quantize=quantize_activations_k,
        segments_int8=functools.partial(segments_int8_path, name, path=INT8_PATH),
    )
    for (name, kernels), int8 in zip(
        _FLOAT_KQUANT_KERNELS.items(), (q4_k_matmul_int8, q5_k_matmul_int8, q6_k_matmul_int8), strict=True
    )
}
"""The K-quant kernels: kquants.py's exact and dequantizing ones, with these integer int8 matmuls."""
