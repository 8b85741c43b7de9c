"""Kernels on GGUF float rows: F32, F16, BF16 (one weight per "block"; no int8 kernel).

F16/BF16 rows are widened to float32 one row at a time in a scratch row (exactly as gguf's numpy
dequantize widens them), then dotted with each activation row, so the weights are read once per call.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .bits import bf16_bits_to_f32, half_bits_to_f32
from .legacy import TILE, dot_f32
from .registry import QuantKernels

_FAST = {"reassoc", "contract"}


@njit(inline="always", cache=True)
def _f16_row(row, w):
    h = row.view(np.uint16)
    for i in range(w.shape[0]):
        w[i] = half_bits_to_f32(h[i])


@njit(inline="always", cache=True)
def _bf16_row(row, w):
    h = row.view(np.uint16)
    for i in range(w.shape[0]):
        w[i] = bf16_bits_to_f32(h[i])


@njit(inline="always", cache=True)
def _f32_row(row, w):
    f = row.view(np.float32)
    for i in range(w.shape[0]):
        w[i] = f[i]


@njit(cache=True, parallel=True, fastmath=_FAST)
def f32_matmul_exact(blocks, x, out):
    """out[b, o] = sum_i x[b, i] * W[o, i] for float32 rows."""
    for o in prange(blocks.shape[0]):
        w = blocks[o].view(np.float32)
        for b in range(x.shape[0]):
            out[b, o] = dot_f32(w, x[b])


@njit(cache=True, parallel=True)
def f32_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W."""
    for r in prange(start, stop):
        _f32_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True, fastmath=_FAST)
def f16_matmul_exact(blocks, x, out):
    """out[b, o] = sum_i x[b, i] * W[o, i] for IEEE half rows; float32 accumulation."""
    rows = blocks.shape[0]
    n = x.shape[1]
    for t in prange((rows + TILE - 1) // TILE):
        w = np.empty(n, np.float32)
        for o in range(t * TILE, min(rows, (t + 1) * TILE)):
            _f16_row(blocks[o], w)
            for b in range(x.shape[0]):
                out[b, o] = dot_f32(w, x[b])


@njit(cache=True, parallel=True)
def f16_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W widened to float32."""
    for r in prange(start, stop):
        _f16_row(blocks[r], out[r - start])


@njit(cache=True, parallel=True, fastmath=_FAST)
def bf16_matmul_exact(blocks, x, out):
    """out[b, o] = sum_i x[b, i] * W[o, i] for bfloat16 rows; float32 accumulation."""
    rows = blocks.shape[0]
    n = x.shape[1]
    for t in prange((rows + TILE - 1) // TILE):
        w = np.empty(n, np.float32)
        for o in range(t * TILE, min(rows, (t + 1) * TILE)):
            _bf16_row(blocks[o], w)
            for b in range(x.shape[0]):
                out[b, o] = dot_f32(w, x[b])


@njit(cache=True, parallel=True)
def bf16_dequantize_rows(blocks, start, stop, out):
    """out[r - start] = row r of W widened to float32."""
    for r in prange(start, stop):
        _bf16_row(blocks[r], out[r - start])


FLOAT_KERNELS: dict[str, QuantKernels] = {
    "F32": QuantKernels("F32", 1, 4, f32_matmul_exact, None, f32_dequantize_rows),
    "F16": QuantKernels("F16", 1, 2, f16_matmul_exact, None, f16_dequantize_rows),
    "BF16": QuantKernels("BF16", 1, 2, bf16_matmul_exact, None, bf16_dequantize_rows),
}
"""The float row types (int8 mode uses matmul_exact for them)."""
