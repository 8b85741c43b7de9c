"""Numba kernels on raw GGUF K-quant blocks: Q4_K, Q5_K and Q6_K (256-weight super-blocks).

Block layouts (little endian, as gguf/quants.py and llama.cpp's ggml-common.h define them):
- Q4_K, 144 bytes: d f16, dmin f16, 12 bytes of 6-bit sub-block scales and mins packed as below,
  128 bytes of nibbles. Sub-block j (32 weights) is the low (j even) or high (j odd) nibble of
  bytes 32 * (j // 2) .. +31; weight = d * sc[j] * q - dmin * m[j].
- Q5_K, 176 bytes: d, dmin, the same 12 scale bytes, qh 32 bytes (bit j of qh[i] is the fifth bit of
  weight i of sub-block j), then the 128 nibble bytes as in Q4_K.
- Q6_K, 210 bytes: ql 128 bytes (low nibbles), qh 64 bytes (2 high bits), 16 int8 scales (one per 16
  weights), d f16 last; weight = d * scale[w // 16] * (q - 32).

Every kernel runs `prange` over chunks of output rows only; one dot product never leaves its thread,
and the reduction over the input follows one order written here (super-blocks in order, eight lane
accumulators, a fixed tree over the lanes), whatever the batch width B or a row's place in it. So
out[b, o] is bit-identical however the batch is composed (batch invariance).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from infer.engine.backends.cpu_kernels.registry import QuantKernels

QK_K = 256
"""Weights per super-block."""
Q4_K_BYTES = 144
Q5_K_BYTES = 176
Q6_K_BYTES = 210
ROWS_PER_TASK = 8
"""Output rows per parallel task: scratch buffers are allocated once per task, not once per row."""


# ---------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------


@njit(cache=True)
def _half(lo: int, hi: int) -> np.float32:
    """IEEE half (two little-endian bytes) -> float32, exactly (every half is a float32)."""
    h = np.int32(lo) | (np.int32(hi) << 8)
    exp = (h >> 10) & 0x1F
    mant = h & 0x3FF
    if exp == 0:
        v = math.ldexp(float(mant), -24)
    elif exp == 31:
        v = math.inf if mant == 0 else math.nan
    else:
        v = math.ldexp(float(mant | 0x400), exp - 25)
    if h & 0x8000:
        v = -v
    return np.float32(v)


@njit(cache=True)
def _scales_mins(row: np.ndarray, off: int, ds: np.ndarray, dm: np.ndarray) -> None:
    """Q4_K/Q5_K: ds[j] = d * sc[j], dm[j] = dmin * m[j] (float32) for the super-block at `off`."""
    d = _half(row[off], row[off + 1])
    dmin = _half(row[off + 2], row[off + 3])
    s = off + 4
    for j in range(4):
        ds[j] = d * np.float32(row[s + j] & 0x3F)
        dm[j] = dmin * np.float32(row[s + 4 + j] & 0x3F)
    for j in range(4, 8):
        sc = (row[s + j + 4] & 0x0F) | ((row[s + j - 4] >> 6) << 4)
        mn = (row[s + j + 4] >> 4) | ((row[s + j] >> 6) << 4)
        ds[j] = d * np.float32(sc)
        dm[j] = dmin * np.float32(mn)


@njit(cache=True)
def _scales_q6(row: np.ndarray, off: int, ds: np.ndarray) -> None:
    """Q6_K: ds[k] = d * scale[k] (float32) for the 16 sub-blocks of the super-block at `off`."""
    d = _half(row[off + 208], row[off + 209])
    for k in range(16):
        sc = np.int32(row[off + 192 + k])
        if sc >= 128:
            sc -= 256
        ds[k] = d * np.float32(sc)


@njit(cache=True)
def _unpack_q4(row: np.ndarray, off: int, q: np.ndarray) -> None:
    """Q4_K: the 256 unsigned 4-bit quants of the super-block at `off`, in weight order."""
    qs = off + 16
    for g in range(4):
        for i in range(32):
            byte = row[qs + 32 * g + i]
            q[64 * g + i] = byte & 0x0F
            q[64 * g + 32 + i] = byte >> 4


@njit(cache=True)
def _unpack_q5(row: np.ndarray, off: int, q: np.ndarray) -> None:
    """Q5_K: the 256 unsigned 5-bit quants of the super-block at `off`, in weight order."""
    qh = off + 16
    qs = off + 48
    for g in range(4):
        for i in range(32):
            byte = row[qs + 32 * g + i]
            hi = row[qh + i]
            q[64 * g + i] = (byte & 0x0F) | (((hi >> (2 * g)) & 1) << 4)
            q[64 * g + 32 + i] = (byte >> 4) | (((hi >> (2 * g + 1)) & 1) << 4)


@njit(cache=True)
def _unpack_q6(row: np.ndarray, off: int, q: np.ndarray) -> None:
    """Q6_K: the 256 signed 6-bit quants (q - 32) of the super-block at `off`, in weight order."""
    for h in range(2):
        ql = off + 64 * h
        qh = off + 128 + 32 * h
        for i in range(32):
            lo0 = np.int32(row[ql + i])
            lo1 = np.int32(row[ql + 32 + i])
            hi = np.int32(row[qh + i])
            w = 128 * h + i
            q[w] = ((lo0 & 0x0F) | ((hi & 3) << 4)) - 32
            q[w + 32] = ((lo1 & 0x0F) | (((hi >> 2) & 3) << 4)) - 32
            q[w + 64] = ((lo0 >> 4) | (((hi >> 4) & 3) << 4)) - 32
            q[w + 96] = ((lo1 >> 4) | (((hi >> 6) & 3) << 4)) - 32


@njit(cache=True)
def _sums32(x: np.ndarray) -> np.ndarray:
    """Per-32 sums of each row of x (float32, fixed order), for the min term of Q4_K/Q5_K."""
    n_b, n_in = x.shape
    s = np.empty((n_b, n_in // 32), np.float32)
    for b in range(n_b):
        for blk in range(n_in // 32):
            acc = np.float32(0.0)
            for i in range(32):
                acc += x[b, 32 * blk + i]
            s[b, blk] = acc
    return s


@njit(cache=True)
def _qsums32(xq: np.ndarray) -> np.ndarray:
    """Per-32 integer sums of each row of xq, for the min term of Q4_K/Q5_K in the int8 path."""
    n_b, n_in = xq.shape
    s = np.empty((n_b, n_in // 32), np.int32)
    for b in range(n_b):
        for blk in range(n_in // 32):
            acc = np.int32(0)
            for i in range(32):
                acc += np.int32(xq[b, 32 * blk + i])
            s[b, blk] = acc
    return s


@njit(cache=True)
def _lane_sum(lanes: np.ndarray, b: int) -> np.float32:
    """The fixed tree over a row's eight lane accumulators."""
    a = (lanes[b, 0] + lanes[b, 4]) + (lanes[b, 2] + lanes[b, 6])
    c = (lanes[b, 1] + lanes[b, 5]) + (lanes[b, 3] + lanes[b, 7])
    return a + c


# ---------------------------------------------------------------------------------------------------
# Exact kernels: weights dequantized in registers, float32 accumulation
# ---------------------------------------------------------------------------------------------------


@njit(cache=True)
def _dot_sub32(q: np.ndarray, x: np.ndarray, ds: np.ndarray, lanes: np.ndarray, n_b: int, xo: int) -> None:
    """lanes[b, k] += ds[j] * sum_t q[32j + 8t + k] * x[b, xo + 32j + 8t + k] over the 8 sub-blocks."""
    for b in range(n_b):
        for j in range(8):
            d = ds[j]
            base = 32 * j
            for k in range(8):
                p = q[base + k] * x[b, xo + base + k]
                p += q[base + 8 + k] * x[b, xo + base + 8 + k]
                p += q[base + 16 + k] * x[b, xo + base + 16 + k]
                p += q[base + 24 + k] * x[b, xo + base + 24 + k]
                lanes[b, k] += d * p


@njit(cache=True)
def _dot_sub16(q: np.ndarray, x: np.ndarray, ds: np.ndarray, lanes: np.ndarray, n_b: int, xo: int) -> None:
    """lanes[b, k] += ds[s] * (q[16s + k] x[..] + q[16s + 8 + k] x[..]) over the 16 sub-blocks (Q6_K)."""
    for b in range(n_b):
        for s in range(16):
            d = ds[s]
            base = 16 * s
            for k in range(8):
                p = q[base + k] * x[b, xo + base + k]
                p += q[base + 8 + k] * x[b, xo + base + 8 + k]
                lanes[b, k] += d * p


@njit(cache=True, parallel=True)
def _exact_q45(blocks: np.ndarray, x: np.ndarray, out: np.ndarray, five_bit: bool) -> None:
    """Q4_K (five_bit False) / Q5_K (True): out = x @ W.T, W dequantized in registers."""
    n_b, n_in = x.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    bb = Q5_K_BYTES if five_bit else Q4_K_BYTES
    xsum = _sums32(x)
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(n_tasks):
        q = np.empty(QK_K, np.float32)
        ds = np.empty(8, np.float32)
        dm = np.empty(8, np.float32)
        lanes = np.empty((n_b, 8), np.float32)
        macc = np.empty(n_b, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            lanes[:] = 0.0
            macc[:] = 0.0
            for sb in range(n_sb):
                off = sb * bb
                _scales_mins(row, off, ds, dm)
                if five_bit:
                    _unpack_q5(row, off, q)
                else:
                    _unpack_q4(row, off, q)
                _dot_sub32(q, x, ds, lanes, n_b, sb * QK_K)
                for b in range(n_b):
                    for j in range(8):
                        macc[b] += dm[j] * xsum[b, sb * 8 + j]
            for b in range(n_b):
                out[b, o] = _lane_sum(lanes, b) - macc[b]


@njit(cache=True, parallel=True)
def _exact_q6(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q6_K: out = x @ W.T, W dequantized in registers."""
    n_b, n_in = x.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(n_tasks):
        q = np.empty(QK_K, np.float32)
        ds = np.empty(16, np.float32)
        lanes = np.empty((n_b, 8), np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            lanes[:] = 0.0
            for sb in range(n_sb):
                off = sb * Q6_K_BYTES
                _scales_q6(row, off, ds)
                _unpack_q6(row, off, q)
                _dot_sub16(q, x, ds, lanes, n_b, sb * QK_K)
            for b in range(n_b):
                out[b, o] = _lane_sum(lanes, b)


@njit(cache=True)
def q4_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q4_K: out[B, out] = x[B, in] @ W.T, weights dequantized in registers, float32 accumulation."""
    _exact_q45(blocks, x, out, False)


@njit(cache=True)
def q5_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q5_K: out[B, out] = x[B, in] @ W.T, weights dequantized in registers, float32 accumulation."""
    _exact_q45(blocks, x, out, True)


@njit(cache=True)
def q6_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q6_K: out[B, out] = x[B, in] @ W.T, weights dequantized in registers, float32 accumulation."""
    _exact_q6(blocks, x, out)


# ---------------------------------------------------------------------------------------------------
# Int8 kernels: activations quantized per 32-block (xq int8, xs one float32 scale per 32)
# ---------------------------------------------------------------------------------------------------


@njit(cache=True, parallel=True)
def _int8_q45(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray, five_bit: bool) -> None:
    """Q4_K/Q5_K against int8 activations: integer dot per 32-block, then float32 in block order."""
    n_b, n_in = xq.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    bb = Q5_K_BYTES if five_bit else Q4_K_BYTES
    xqsum = _qsums32(xq)
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(n_tasks):
        q = np.empty(QK_K, np.int32)
        ds = np.empty(8, np.float32)
        dm = np.empty(8, np.float32)
        acc = np.empty(n_b, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            acc[:] = 0.0
            for sb in range(n_sb):
                off = sb * bb
                _scales_mins(row, off, ds, dm)
                if five_bit:
                    _unpack_q5(row, off, q)
                else:
                    _unpack_q4(row, off, q)
                for b in range(n_b):
                    for j in range(8):
                        xo = sb * QK_K + 32 * j
                        isum = np.int32(0)
                        for i in range(32):
                            isum += q[32 * j + i] * np.int32(xq[b, xo + i])
                        blk = sb * 8 + j
                        v = ds[j] * np.float32(isum) - dm[j] * np.float32(xqsum[b, blk])
                        acc[b] += xs[b, blk] * v
            for b in range(n_b):
                out[b, o] = acc[b]


@njit(cache=True, parallel=True)
def _int8_q6(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q6_K against int8 activations: integer dot per 16-sub-block, then float32 in block order."""
    n_b, n_in = xq.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(n_tasks):
        q = np.empty(QK_K, np.int32)
        ds = np.empty(16, np.float32)
        acc = np.empty(n_b, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            acc[:] = 0.0
            for sb in range(n_sb):
                off = sb * Q6_K_BYTES
                _scales_q6(row, off, ds)
                _unpack_q6(row, off, q)
                for b in range(n_b):
                    for j in range(8):
                        xo = sb * QK_K + 32 * j
                        s0 = np.int32(0)
                        s1 = np.int32(0)
                        for i in range(16):
                            s0 += q[32 * j + i] * np.int32(xq[b, xo + i])
                            s1 += q[32 * j + 16 + i] * np.int32(xq[b, xo + 16 + i])
                        v = ds[2 * j] * np.float32(s0) + ds[2 * j + 1] * np.float32(s1)
                        acc[b] += xs[b, sb * 8 + j] * v
            for b in range(n_b):
                out[b, o] = acc[b]


@njit(cache=True)
def q4_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    _int8_q45(blocks, xq, xs, out, False)


@njit(cache=True)
def q5_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    _int8_q45(blocks, xq, xs, out, True)


@njit(cache=True)
def q6_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q6_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    _int8_q6(blocks, xq, xs, out)


# ---------------------------------------------------------------------------------------------------
# Dequantization to float32 rows (bit-identical to gguf.quants.dequantize)
# ---------------------------------------------------------------------------------------------------


@njit(cache=True, parallel=True)
def _dequant_q45(blocks: np.ndarray, start: int, stop: int, out: np.ndarray, five_bit: bool) -> None:
    """Q4_K/Q5_K rows start..stop-1 as float32: (d * sc) * q - dmin * m, rounded as gguf does."""
    n_sb = out.shape[1] // QK_K
    bb = Q5_K_BYTES if five_bit else Q4_K_BYTES
    for r in prange(stop - start):
        row = blocks[start + r]
        q = np.empty(QK_K, np.float32)
        ds = np.empty(8, np.float32)
        dm = np.empty(8, np.float32)
        for sb in range(n_sb):
            off = sb * bb
            _scales_mins(row, off, ds, dm)
            if five_bit:
                _unpack_q5(row, off, q)
            else:
                _unpack_q4(row, off, q)
            for j in range(8):
                for i in range(32):
                    out[r, sb * QK_K + 32 * j + i] = ds[j] * q[32 * j + i] - dm[j]


@njit(cache=True, parallel=True)
def _dequant_q6(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q6_K rows start..stop-1 as float32: (d * scale) * (q - 32), rounded as gguf does."""
    n_sb = out.shape[1] // QK_K
    for r in prange(stop - start):
        row = blocks[start + r]
        q = np.empty(QK_K, np.float32)
        ds = np.empty(16, np.float32)
        for sb in range(n_sb):
            off = sb * Q6_K_BYTES
            _scales_q6(row, off, ds)
            _unpack_q6(row, off, q)
            for s in range(16):
                for i in range(16):
                    out[r, sb * QK_K + 16 * s + i] = ds[s] * q[16 * s + i]


@njit(cache=True)
def q4_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q4_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant_q45(blocks, start, stop, out, False)


@njit(cache=True)
def q5_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q5_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant_q45(blocks, start, stop, out, True)


@njit(cache=True)
def q6_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q6_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant_q6(blocks, start, stop, out)


KQUANT_KERNELS: dict[str, QuantKernels] = {
    "Q4_K": QuantKernels("Q4_K", QK_K, Q4_K_BYTES, q4_k_matmul_exact, q4_k_matmul_int8, q4_k_dequantize_rows),
    "Q5_K": QuantKernels("Q5_K", QK_K, Q5_K_BYTES, q5_k_matmul_exact, q5_k_matmul_int8, q5_k_dequantize_rows),
    "Q6_K": QuantKernels("Q6_K", QK_K, Q6_K_BYTES, q6_k_matmul_exact, q6_k_matmul_int8, q6_k_dequantize_rows),
}
"""GGUF K-quant type name -> its kernels."""
