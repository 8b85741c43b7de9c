"""The elementwise and per-row ops of a step around the matmuls, as numba kernels: RMSNorm, RoPE, the
KV-cache write, SwiGLU and GeGLU.

At batch 1 each of these is a few microseconds of numpy calls and temporaries (RMSNorm alone was five
ufunc passes), run ~8 times per layer; one compiled call each does the same work in about a microsecond.
Every row is computed on its own in a fixed order (the RMSNorm sum of squares in LANES fixed partial
sums reduced by a fixed tree), so a row's bits never depend on the rows beside it. Single-threaded:
at decode sizes a parallel region costs more than the work.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic

LANES = 16
"""Partial sums of the RMSNorm sum of squares (a multiple of the SIMD width, so LLVM vectorises them)."""

_GELU_SCALE = np.float32(math.sqrt(2.0 / math.pi))


@njit(cache=True)
def rms_norm_rows(x, weight, eps, out):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for every row of x [rows, width] (float32,
    C-ordered); `eps` float32. The sum of squares runs in LANES partial sums reduced by a fixed tree."""
    rows, width = x.shape
    full = width - width % LANES
    lanes = np.empty(LANES, np.float32)
    for r in range(rows):
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
    i fma(a, s, b c): the rounding of numpy's complex64 multiply, so the bits are the same."""
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
    k, v [rows, kv_heads, head_dim]; keys, values [layers, slots, kv_heads, capacity, head_dim]."""
    rows, kv_heads, head_dim = k.shape
    for i in range(rows):
        slot, position = slots[i], positions[i]
        for h in range(kv_heads):
            key_target = keys[layer, slot, h, position]
            value_target = values[layer, slot, h, position]
            for j in range(head_dim):
                key_target[j] = k[i, h, j]
                value_target[j] = v[i, h, j]


@njit(cache=True)
def silu_mul_rows(gate_up, width, out):
    """out[r, j] = silu(gate) * up = gate * up / (1 + exp(-gate)) with gate = gate_up[r, j], up =
    gate_up[r, width + j]; exp(-gate) overflowing to inf gives the right 0."""
    for r in range(gate_up.shape[0]):
        row = gate_up[r]
        target = out[r]
        for j in range(width):
            g = row[j]
            target[j] = g * row[width + j] / (np.float32(1.0) + np.float32(math.exp(-g)))


@njit(cache=True)
def gelu_mul_rows(gate_up, width, out):
    """out[r, j] = gelu(gate) * up with the tanh approximation (PyTorch's gelu(approximate="tanh")):
    0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, in float32."""
    for r in range(gate_up.shape[0]):
        row = gate_up[r]
        target = out[r]
        for j in range(width):
            g = row[j]
            inner = (g * g * np.float32(0.044715) + np.float32(1.0)) * g * _GELU_SCALE
            t = (np.float32(math.tanh(inner)) + np.float32(1.0)) * np.float32(0.5)
            target[j] = t * (g * row[width + j])
