"""Int8-activation matmuls on raw legacy blocks (Q4_0, Q4_1, Q8_0, Q5_0): the drivers of simd_int8.py.

Activations come quantized per 32-block (quantize_activations: xq int8, xs float32); what the row dots
read of them is laid out once per call (`int8_activations`). Threads split the output rows only (prange
over tiles of TILE weight rows); within a tile the activation rows go in groups of 8 and one group of
the 1 to 7 left, each group sharing every decoded weight pair (simd_int8.py), so up to 8 rows (k drafts
and the bonus row of a verify step) cost one pass over the weights. Every out[b, o] goes through the
same per-row arithmetic in the same order whatever group it is in, so a row's result is bit-identical
alone or anywhere in a batch.
One compiled kernel per int8 path, so a process compiles (or loads from numba's cache) only the path
its host runs; `*_matmul_int8_path` reaches the others (the tests compare them bit for bit).
numba's cache tracks only this file for these kernels: after editing simd_int8.py, touch this file.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit, prange

from . import simd_int8
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


# ---- Q4_0


@njit(cache=True, parallel=True)
def _q4_0_int8_vnni(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the vnni path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q4_0_int8_avx2(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the avx2 path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx28(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx21(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx22(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx23(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx24(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx25(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx26(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx27(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q4_0_int8_portable(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the portable path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


def q4_0_matmul_int8_path(
    blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Q4_0 weights against int8 activations through int8 path `path` (simd_int8: PORTABLE, AVX2, VNNI;
    every path gives the same bits)."""
    (_q4_0_int8_portable, _q4_0_int8_avx2, _q4_0_int8_vnni)[path](blocks, xq, xs, out)


def q4_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    q4_0_matmul_int8_path(blocks, xq, xs, out, INT8_PATH)


# ---- Q4_1


@njit(cache=True, parallel=True)
def _q4_1_int8_vnni(blocks, xq, xs, out):
    """Q4_1 against int8 activations on the vnni path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q4_1_int8_avx2(blocks, xq, xs, out):
    """Q4_1 against int8 activations on the avx2 path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx28(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx21(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx22(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx23(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx24(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx25(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx26(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx27(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q4_1_int8_portable(blocks, xq, xs, out):
    """Q4_1 against int8 activations on the portable path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


def q4_1_matmul_int8_path(
    blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Q4_1 weights against int8 activations through int8 path `path` (simd_int8: PORTABLE, AVX2, VNNI;
    every path gives the same bits)."""
    (_q4_1_int8_portable, _q4_1_int8_avx2, _q4_1_int8_vnni)[path](blocks, xq, xs, out)


def q4_1_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_1 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    q4_1_matmul_int8_path(blocks, xq, xs, out, INT8_PATH)


# ---- Q8_0


@njit(cache=True, parallel=True)
def _q8_0_int8_vnni(blocks, xq, xs, out):
    """Q8_0 against int8 activations on the vnni path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q8_0_int8_avx2(blocks, xq, xs, out):
    """Q8_0 against int8 activations on the avx2 path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx28(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx21(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx22(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx23(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx24(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx25(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx26(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx27(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q8_0_int8_portable(blocks, xq, xs, out):
    """Q8_0 against int8 activations on the portable path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


def q8_0_matmul_int8_path(
    blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Q8_0 weights against int8 activations through int8 path `path` (simd_int8: PORTABLE, AVX2, VNNI;
    every path gives the same bits)."""
    (_q8_0_int8_portable, _q8_0_int8_avx2, _q8_0_int8_vnni)[path](blocks, xq, xs, out)


def q8_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q8_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    q8_0_matmul_int8_path(blocks, xq, xs, out, INT8_PATH)


# ---- Q5_0


@njit(cache=True, parallel=True)
def _q5_0_int8_vnni(blocks, xq, xs, out):
    """Q5_0 against int8 activations on the vnni path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q5_0_int8_avx2(blocks, xq, xs, out):
    """Q5_0 against int8 activations on the avx2 path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx28(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx21(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx22(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx23(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx24(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx25(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx26(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx27(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


@njit(cache=True, parallel=True)
def _q5_0_int8_portable(blocks, xq, xs, out):
    """Q5_0 against int8 activations on the portable path."""
    xa, xu, xsum, xs_sum, xs4 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable8(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable1(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable2(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable3(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable4(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable5(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable6(blocks[o], xa, xu, xsum, xs_sum, xs4, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable7(blocks[o], xa, xu, xsum, xs_sum, xs4, b))


def q5_0_matmul_int8_path(
    blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Q5_0 weights against int8 activations through int8 path `path` (simd_int8: PORTABLE, AVX2, VNNI;
    every path gives the same bits)."""
    (_q5_0_int8_portable, _q5_0_int8_avx2, _q5_0_int8_vnni)[path](blocks, xq, xs, out)


def q5_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    q5_0_matmul_int8_path(blocks, xq, xs, out, INT8_PATH)


def host_int8_kernels() -> dict[str, Callable[..., None]]:
    """Each type's compiled int8 kernel (blocks, xq, xs, out) on the host's path: what compiled callers
    (decode_row.py) call for the type's `*_matmul_int8`."""
    return {
        "Q4_0": (_q4_0_int8_portable, _q4_0_int8_avx2, _q4_0_int8_vnni)[INT8_PATH],
        "Q4_1": (_q4_1_int8_portable, _q4_1_int8_avx2, _q4_1_int8_vnni)[INT8_PATH],
        "Q8_0": (_q8_0_int8_portable, _q8_0_int8_avx2, _q8_0_int8_vnni)[INT8_PATH],
        "Q5_0": (_q5_0_int8_portable, _q5_0_int8_avx2, _q5_0_int8_vnni)[INT8_PATH],
    }
