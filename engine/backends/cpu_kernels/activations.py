"""llama.cpp's Q8 quantizations of activation rows: per 32-block (quantize_row_q8_0_ref) for the legacy
types, per 256-block (quantize_row_q8_K_ref) for the K-quants."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .bits import round_to_half

QK = 32

PARALLEL_ELEMENTS = 65536
"""Elements from which a batch's row-by-row work (these quantizations, rowops' RMSNorm and gated
activations) splits its rows over the threads (each row on its own either way, so the bits are the
same). Below it the thread pool's wake-up and join cost more than the split saves: at 16 streams of the
135M default model (rows of 576) the parallel versions cost 6 % of the aggregate speed; from it a
prefill chunk gains (256 rows of 8192 quantized per 256-block in 0.94 instead of 1.50 ms, Intel VM)."""


def runs_parallel(rows: int, width: int) -> bool:
    """Whether `rows` rows of `width` elements take the parallel version (PARALLEL_ELEMENTS)."""
    return rows >= 2 and rows * width >= PARALLEL_ELEMENTS


@njit(inline="always", cache=True)
def _roundf(v):
    """C roundf (halves away from zero), exactly as gguf's np_roundf computes it."""
    a = abs(v)
    floored = np.floor(a)
    r = floored + np.floor(np.float32(2.0) * (a - floored))
    return -r if v < 0 else r


@njit(inline="always", cache=True)
def _quantize_row(x, xq, xs, b):
    for k in range(x.shape[1] // QK):
        amax = np.float32(0.0)
        for j in range(k * QK, k * QK + QK):
            amax = max(amax, abs(x[b, j]))
        d = amax / np.float32(127.0)
        inv = np.float32(1.0) / d if d != 0 else np.float32(0.0)
        xs[b, k] = round_to_half(d)
        for j in range(k * QK, k * QK + QK):
            xq[b, j] = np.int8(_roundf(x[b, j] * inv))


@njit(cache=True)
def _quantize(x, xq, xs):
    for b in range(x.shape[0]):
        _quantize_row(x, xq, xs, b)


@njit(cache=True, parallel=True)
def _quantize_parallel(x, xq, xs):
    for b in prange(x.shape[0]):
        _quantize_row(x, xq, xs, b)


def quantize_activations(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Quantize float32 rows x [B, in] (in a multiple of 32) per 32-block as llama.cpp's Q8_0 does.

    Returns (xq int8 [B, in], xs float32 [B, in // 32]): xs = max|x| / 127 of the block rounded to half
    precision (the block scale llama.cpp stores), xq = roundf(x * 127 / max|x|). Each row independently.
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK:
        raise ValueError(f"quantize_activations needs [B, in] with in a multiple of {QK}, got {x.shape}")
    xq = np.empty(x.shape, np.int8)
    xs = np.empty((x.shape[0], x.shape[1] // QK), np.float32)
    (_quantize_parallel if runs_parallel(*x.shape) else _quantize)(x, xq, xs)
    return xq, xs


QK_K = 256


_MAGNITUDE = np.int32(0x7FFFFFFF)
"""The bits of a float32 but its sign: as int32, ordered as the magnitudes are (NaN above infinity)."""
_INFINITY_BITS = np.int32(0x7F800000)


@njit(inline="always", cache=True)
def _block_peak(x, bits, b, lo):
    """The first value of largest magnitude in x[b, lo : lo + QK_K], 0 when all are zero; NaN skipped,
    as llama.cpp's loop (`if (ax > amax)`) skips it. The largest magnitude is found as an integer
    maximum of the bits (`bits`: row b's int32 view), which LLVM vectorises, where the loop that carries
    the value beside its magnitude ran scalar (2.5x the time of the whole quantization at 2,048 wide)."""
    top = np.int32(0)
    for j in range(lo, lo + QK_K):
        top = max(top, bits[j] & _MAGNITUDE)
    if top > _INFINITY_BITS:  # a NaN in the block: the plain loop, which never picks it
        amax = np.float32(0.0)
        peak = np.float32(0.0)
        for j in range(lo, lo + QK_K):
            if abs(x[b, j]) > amax:
                amax = abs(x[b, j])
                peak = x[b, j]
        return peak
    for j in range(lo, lo + QK_K):
        if (bits[j] & _MAGNITUDE) == top:
            return x[b, j]
    return np.float32(0.0)


@njit(inline="always", cache=True)
def _quantize_k_row(x, xq, xd, xb, b):
    bits = x[b].view(np.int32)
    for k in range(x.shape[1] // QK_K):
        peak = _block_peak(x, bits, b, k * QK_K)
        if peak == 0:
            xd[b, k] = np.float32(0.0)
            for j in range(k * QK_K, k * QK_K + QK_K):
                xq[b, j] = np.int8(0)
        else:
            iscale = np.float32(-127.0) / peak
            for j in range(k * QK_K, k * QK_K + QK_K):
                xq[b, j] = np.int8(min(np.float32(127.0), _roundf(iscale * x[b, j])))
            xd[b, k] = np.float32(1.0) / iscale
    for k in range(x.shape[1] // 16):
        total = np.int32(0)
        for j in range(16 * k, 16 * k + 16):
            total += np.int32(xq[b, j])
        xb[b, k] = total


@njit(cache=True)
def _quantize_k(x, xq, xd, xb):
    for b in range(x.shape[0]):
        _quantize_k_row(x, xq, xd, xb, b)


@njit(cache=True, parallel=True)
def _quantize_k_parallel(x, xq, xd, xb):
    for b in prange(x.shape[0]):
        _quantize_k_row(x, xq, xd, xb, b)


def quantize_activations_k(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Quantize float32 rows x [B, in] (in a multiple of 256) per 256-block as llama.cpp's Q8_K does, for
    the K-quant int8 kernels.

    Returns (xq int8 [B, in], xd float32 [B, in // 256], xb int32 [B, in // 16]): per block the value of
    largest magnitude `peak` maps to -127 (iscale = -127 / peak, xq = min(127, roundf(iscale * x)),
    xd = 1 / iscale), and xb holds the sum of each 16 xq. Each row independently."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    if x.ndim != 2 or x.shape[1] % QK_K:
        raise ValueError(f"quantize_activations_k needs [B, in] with in a multiple of {QK_K}, got {x.shape}")
    xq = np.empty(x.shape, np.int8)
    xd = np.empty((x.shape[0], x.shape[1] // QK_K), np.float32)
    xb = np.empty((x.shape[0], x.shape[1] // 16), np.int32)
    (_quantize_k_parallel if runs_parallel(*x.shape) else _quantize_k)(x, xq, xd, xb)
    return xq, xd, xb
