"""The elementwise and per-row ops of a step around the matmuls, as numba kernels: RMSNorm, RoPE, the
KV-cache write, SwiGLU and GeGLU.

At batch 1 each of these was a few microseconds of numpy calls and temporaries (RMSNorm alone five
ufunc passes, 6 us), run ~8 times per layer; one compiled call each does the same work in about a
microsecond. RMSNorm, RoPE and the KV write give the numpy formulas' bits; SwiGLU and GeGLU use exp_f32
(numba has no vector exp), within 2 ulp of exp and closer to float64 than numpy's results.
Every row is computed on its own in a fixed order (the RMSNorm sum of squares in LANES fixed partial
sums reduced by a fixed tree), so a row's bits never depend on the rows beside it. RMSNorm, SwiGLU and
GeGLU split their rows over the threads from activations.PARALLEL_ELEMENTS elements (`*_rows` picks):
below it, at decode sizes, a parallel region costs more than the work.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange, types
from numba.extending import intrinsic

from .activations import runs_parallel
from .bits import f32_from_bits
from .kv_storage import kv_store

LANES = 16
"""Partial sums of the RMSNorm sum of squares (a multiple of the SIMD width, so LLVM vectorises them)."""

_GELU_SCALE = np.float32(math.sqrt(2.0 / math.pi))


@njit(inline="always", cache=True)
def _rms_norm_row(x, weight, eps, out, r, lanes):
    width = x.shape[1]
    full = width - width % LANES
    row = x[r]
    for lane in range(LANES):
        lanes[lane] = 0.0
    for base in range(0, full, LANES):
        for lane in range(LANES):
            lanes[lane] += row[base + lane] * row[base + lane]
    for j in range(full, width):
        lanes[j - full] += row[j] * row[j]
    step = LANES // 2
    while step:
        for lane in range(step):
            lanes[lane] += lanes[lane + step]
        step //= 2
    scale = np.float32(1.0) / np.sqrt(lanes[0] / np.float32(width) + eps)
    target = out[r]
    for j in range(width):
        target[j] = row[j] * scale * weight[j]


@njit(cache=True)
def _rms_norm_serial(x, weight, eps, out):
    lanes = np.empty(LANES, np.float32)
    for r in range(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, r, lanes)


@njit(cache=True, parallel=True)
def _rms_norm_parallel(x, weight, eps, out):
    for r in prange(x.shape[0]):
        _rms_norm_row(x, weight, eps, out, r, np.empty(LANES, np.float32))


def rms_norm_rows(x: np.ndarray, weight: np.ndarray, eps: np.float32, out: np.ndarray) -> None:
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for every row of x [rows, width] (float32,
    C-ordered); `eps` float32. The sum of squares runs in LANES partial sums reduced by a fixed tree."""
    (_rms_norm_parallel if runs_parallel(*x.shape) else _rms_norm_serial)(x, weight, eps, out)


@intrinsic
def _fma(typingctx, a, b, c):
    """LLVM: a * b + c rounded once (float32)."""
    if not all(t == types.float32 for t in (a, b, c)):
        return None
    sig = types.float32(types.float32, types.float32, types.float32)

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return sig, codegen


@njit(cache=True)
def rope_rows(x, rotations):
    """Rotate adjacent pairs (2i, 2i + 1) of every head of x [rows, heads, d] by rotations[r, i]
    (complex64 [rows, d/2]) in place. Each product is (a + ib)(c + is) = fma(a, c, -(b s)) +
    i fma(a, s, b c): how numpy's SIMD complex64 multiply rounds on AVX2/AVX-512 hosts, so there the
    bits are those of the numpy formula (the blas mode's), whose results the gate anchors pinned."""
    rows, heads, dim = x.shape
    for r in range(rows):
        rot = rotations[r]
        for h in range(heads):
            pair = x[r, h]
            for i in range(dim // 2):
                a, b = pair[2 * i], pair[2 * i + 1]
                c, s = rot[i].real, rot[i].imag
                pair[2 * i] = _fma(a, c, -(b * s))
                pair[2 * i + 1] = _fma(a, s, b * c)


@njit(cache=True)
def write_kv_rows(keys, values, layer, slots, positions, k, v):
    """keys[layer, slots[i], :, positions[i]] = k[i] and the same for values, for every row i of
    k, v float32 [rows, kv_heads, head_dim]; keys, values [layers, slots, kv_heads, capacity, head_dim]
    in float32, or half bits (uint16) each rounded to the nearest half (ties to even)."""
    rows, kv_heads, head_dim = k.shape
    for i in range(rows):
        slot, position = slots[i], positions[i]
        for h in range(kv_heads):
            key_target = keys[layer, slot, h, position]
            value_target = values[layer, slot, h, position]
            for j in range(head_dim):
                key_target[j] = kv_store(keys, k[i, h, j])
                value_target[j] = kv_store(values, v[i, h, j])


@njit(inline="always", cache=True, fastmath={"contract"})
def exp_f32(x):
    """exp(x) in float32 within 2 ulp (Cephes' expf: x = k ln 2 + r, |r| <= ln 2 / 2, a degree-7
    polynomial in r, times 2^k made from its bits), written so that LLVM vectorises a loop of it: numba
    has no vector exp, and a libm call per element made SwiGLU 8x slower than this. x is clamped to
    [-87, 88] (results 1.6e-38 .. 1.7e38), which SwiGLU and GeGLU only ever divide by; NaN stays NaN."""
    x = np.float32(-87.0) if x < np.float32(-87.0) else x
    x = np.float32(88.0) if x > np.float32(88.0) else x
    k = np.floor(x * np.float32(1.44269504088896341) + np.float32(0.5))
    r = x - k * np.float32(0.693359375)
    r = r - k * np.float32(-2.12194440e-4)
    p = np.float32(1.9875691500e-4)
    p = p * r + np.float32(1.3981999507e-3)
    p = p * r + np.float32(8.3334519073e-3)
    p = p * r + np.float32(4.1665795894e-2)
    p = p * r + np.float32(1.6666665459e-1)
    p = p * r + np.float32(5.0000001201e-1)
    p = p * r * r + r + np.float32(1.0)
    return p * f32_from_bits((np.int32(k) + np.int32(127)) << np.int32(23))


# error_model="numpy": a float division by zero gives inf instead of raising, which drops the zero
# check that kept LLVM from vectorising these loops.
@njit(inline="always", cache=True, error_model="numpy")
def _gated_row(gate_up, width, out, r, gelu):
    gate = gate_up[r, :width]
    up = gate_up[r, width:]
    target = out[r]
    if gelu:
        for j in range(width):
            g = gate[j]
            y = (g * g * np.float32(0.044715) + np.float32(1.0)) * g * _GELU_SCALE
            target[j] = g * up[j] / (np.float32(1.0) + exp_f32(np.float32(-2.0) * y))
    else:
        for j in range(width):
            g = gate[j]
            target[j] = g * up[j] / (np.float32(1.0) + exp_f32(-g))


@njit(cache=True, error_model="numpy")
def _gated_serial(gate_up, width, out, gelu):
    for r in range(gate_up.shape[0]):
        _gated_row(gate_up, width, out, r, gelu)


@njit(cache=True, error_model="numpy", parallel=True)
def _gated_parallel(gate_up, width, out, gelu):
    for r in prange(gate_up.shape[0]):
        _gated_row(gate_up, width, out, r, gelu)


def _gated_rows(gate_up: np.ndarray, width: int, out: np.ndarray, gelu: bool) -> None:
    (_gated_parallel if runs_parallel(*gate_up.shape) else _gated_serial)(gate_up, width, out, gelu)


def silu_mul_rows(gate_up: np.ndarray, width: int, out: np.ndarray) -> None:
    """out[r, j] = silu(gate) * up = gate * up / (1 + exp(-gate)) with gate = gate_up[r, j], up =
    gate_up[r, width + j]; gate_up [rows, 2 width], out [rows, width], float32."""
    _gated_rows(gate_up, width, out, False)


def gelu_mul_rows(gate_up: np.ndarray, width: int, out: np.ndarray) -> None:
    """out[r, j] = gelu(gate) * up with the tanh approximation (PyTorch's gelu(approximate="tanh")):
    0.5 g (1 + tanh(y)) u with y = sqrt(2/pi) (g + 0.044715 g^3), computed as g u / (1 + exp(-2y))
    (the same function, with no cancellation near y = 0), in float32."""
    _gated_rows(gate_up, width, out, True)
