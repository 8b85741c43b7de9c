"""Int8-activation matmuls on raw legacy blocks (Q4_0, Q4_1, Q8_0, Q5_0): the drivers of simd_int8.py.

Activations come quantized per 32-block (quantize_activations: xq int8, xs float32); what the kernels
read of them besides xq is laid out once per call (`int8_activations`). Threads split the output rows
only (prange over tiles of TILE weight rows); within a tile the activation rows go in groups of 8 and
one group of the 1 to 7 left, each group sharing every decoded weight pair (simd_int8.py), so up to 8
rows (k drafts and the bonus row of a verify step) cost one pass over the weights. Every out[b, o] goes
through the same per-row arithmetic in the same order whatever group it is in, so a row's result is
bit-identical alone or anywhere in a batch.
One compiled kernel per int8 path, so a process compiles (or loads from numba's cache) only the path
its host runs; `*_matmul_int8_path` reaches the others (the tests compare them bit for bit).
numba's cache tracks only this file for these kernels: after editing simd_int8.py, touch this file.
"""

from __future__ import annotations

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
    """What the int8 kernels read of the activations besides xq, laid out once per call for every weight
    row (simd_int8.py): xu uint8 [B, in] = xq + 128 (the unsigned side of vpdpbusd against signed
    weights), and per lane of four activations (int32 / float32 [B, in // 4]) their sum xl, xs * xl
    (Q4_1's min term; exact in float32: an 11-bit scale times at most 9 bits) and the block scale xs of
    the lane's block."""
    batch, width = xq.shape
    lanes = width // 4
    xu = np.empty((batch, width), np.uint8)
    xl = np.empty((batch, lanes), np.int32)
    xsl = np.empty((batch, lanes), np.float32)
    xs8 = np.empty((batch, lanes), np.float32)
    for b in range(batch):
        for j in range(width):
            xu[b, j] = np.uint8(np.int32(xq[b, j]) + 128)
        for j in range(lanes):
            total = (
                np.int32(xq[b, 4 * j])
                + np.int32(xq[b, 4 * j + 1])
                + np.int32(xq[b, 4 * j + 2])
                + np.int32(xq[b, 4 * j + 3])
            )
            scale = xs[b, j // 8]
            xl[b, j] = total
            xsl[b, j] = scale * np.float32(total)
            xs8[b, j] = scale
    return xu, xl, xsl, xs8


# ---- Q4_0


@njit(cache=True, parallel=True)
def _q4_0_int8_vnni(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the vnni path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_vnni7(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q4_0_int8_avx2(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the avx2 path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx28(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx21(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx22(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx23(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx24(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx25(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx26(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_avx27(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q4_0_int8_portable(blocks, xq, xs, out):
    """Q4_0 against int8 activations on the portable path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_0_portable7(blocks[o], xq, xu, xl, xsl, xs8, b))


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
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_vnni7(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q4_1_int8_avx2(blocks, xq, xs, out):
    """Q4_1 against int8 activations on the avx2 path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx28(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx21(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx22(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx23(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx24(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx25(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx26(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_avx27(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q4_1_int8_portable(blocks, xq, xs, out):
    """Q4_1 against int8 activations on the portable path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q4_1_portable7(blocks[o], xq, xu, xl, xsl, xs8, b))


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
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_vnni7(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q8_0_int8_avx2(blocks, xq, xs, out):
    """Q8_0 against int8 activations on the avx2 path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx28(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx21(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx22(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx23(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx24(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx25(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx26(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_avx27(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q8_0_int8_portable(blocks, xq, xs, out):
    """Q8_0 against int8 activations on the portable path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q8_0_portable7(blocks[o], xq, xu, xl, xsl, xs8, b))


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
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_vnni7(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q5_0_int8_avx2(blocks, xq, xs, out):
    """Q5_0 against int8 activations on the avx2 path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx28(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx21(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx22(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx23(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx24(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx25(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx26(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_avx27(blocks[o], xq, xu, xl, xsl, xs8, b))


@njit(cache=True, parallel=True)
def _q5_0_int8_portable(blocks, xq, xs, out):
    """Q5_0 against int8 activations on the portable path."""
    xu, xl, xsl, xs8 = int8_activations(xq, xs)
    batch = xq.shape[0]
    eights = batch - batch % 8
    rest = batch - eights
    rows = blocks.shape[0]
    for t in prange((rows + TILE - 1) // TILE):  # a tile of weight rows against every activation row
        first, last = t * TILE, min(rows, (t + 1) * TILE)
        for b in range(0, eights, 8):
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable8(blocks[o], xq, xu, xl, xsl, xs8, b))
        b = eights
        if rest == 1:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable1(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 2:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable2(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 3:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable3(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 4:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable4(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 5:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable5(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 6:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable6(blocks[o], xq, xu, xl, xsl, xs8, b))
        elif rest == 7:
            for o in range(first, last):
                store_column(out, b, o, simd_int8.q5_0_portable7(blocks[o], xq, xu, xl, xsl, xs8, b))


def q5_0_matmul_int8_path(
    blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, path: int
) -> None:
    """Q5_0 weights against int8 activations through int8 path `path` (simd_int8: PORTABLE, AVX2, VNNI;
    every path gives the same bits)."""
    (_q5_0_int8_portable, _q5_0_int8_avx2, _q5_0_int8_vnni)[path](blocks, xq, xs, out)


def q5_0_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_0 weights against int8 activations (quantize_activations) through the host's best int8 path."""
    q5_0_matmul_int8_path(blocks, xq, xs, out, INT8_PATH)
