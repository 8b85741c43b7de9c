"""GGUF's Q4_0, Q4_1 and Q8_0 blocks as affine quantization (w = scale * q + bias, q unsigned), the
layout MLX's `quantized_matmul` takes with group size 32: numpy only, run once at load.

Every one of these types holds 32 weights per block with one float16 scale `d` (and, for Q4_1, one
float16 minimum `m`):

* Q4_0: 18 bytes `d, qs[16]`: weight j = d * ((qs[j] & 15) - 8), weight j + 16 = d * ((qs[j] >> 4) - 8);
* Q4_1: 20 bytes `d, m, qs[16]`: the same nibbles, weight = d * q + m;
* Q8_0: 34 bytes `d, qs[32]` (int8): weight j = d * qs[j].

As affine groups: scale = d, bias = -8d (Q4_0), m (Q4_1) or -128d (Q8_0, q shifted to unsigned).
d * q and 8d, 128d are exact in float32 (an 11-bit mantissa times a small integer), so dequantizing
gives gguf-py's floats bit for bit; in float16 scale and bias are exact too (m is float16 already).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

GROUP = 32
"""Weights per GGUF block = weights per affine group."""

BLOCK_BYTES: dict[str, int] = {"Q4_0": 18, "Q4_1": 20, "Q8_0": 34}
"""Bytes per 32-weight block of each type this module converts."""

BITS: dict[str, int] = {"Q4_0": 4, "Q4_1": 4, "Q8_0": 8}
"""Bits per quantized weight of each type."""


@dataclass(frozen=True)
class AffineGroups:
    """A [out, in] matrix as affine groups of 32: `packed` uint32 [out, in * bits / 32] (weight i of a
    row in bits [bits * (i % per_word), ...) of word i // per_word, low bits first), `scales` and
    `biases` float32 [out, in / 32]."""

    packed: np.ndarray
    scales: np.ndarray
    biases: np.ndarray
    bits: int


def to_affine(blocks: np.ndarray, quant: str, shape: tuple[int, int]) -> AffineGroups:
    """GGUF blocks (uint8 [out, row_bytes] or flat) of type `quant` as affine groups of 32."""
    if quant not in BLOCK_BYTES:
        raise ValueError(f"no affine form for GGUF type {quant}")
    rows, cols = shape
    if cols % GROUP:
        raise ValueError(f"{quant} rows must hold whole blocks of {GROUP}, got {cols} columns")
    per_row = cols // GROUP
    raw = np.ascontiguousarray(blocks, dtype=np.uint8).reshape(rows, per_row, BLOCK_BYTES[quant])
    d = raw[..., 0:2].copy().view(np.float16)[..., 0].astype(np.float32)
    if quant == "Q8_0":
        q = (raw[..., 2:].view(np.int8).astype(np.int16) + 128).astype(np.uint8)  # [rows, groups, 32]
        bias = -128.0 * d
    else:
        nibbles = raw[..., 4:] if quant == "Q4_1" else raw[..., 2:]
        q = np.concatenate([nibbles & 15, nibbles >> 4], axis=-1)  # weights 0..15, then 16..31
        bias = (
            raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32) if quant == "Q4_1" else -8.0 * d
        )
    bits = BITS[quant]
    per_word = 32 // bits
    words = q.reshape(rows, cols // per_word, per_word).astype(np.uint32)
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    packed = np.bitwise_or.reduce(words << shifts, axis=-1).astype(np.uint32)
    return AffineGroups(np.ascontiguousarray(packed), d, bias.astype(np.float32), bits)


def dequantize_affine(groups: AffineGroups) -> np.ndarray:
    """The float32 [out, in] matrix of `groups` (the reference for tests)."""
    bits = groups.bits
    per_word = 32 // bits
    rows = groups.packed.shape[0]
    shifts = (np.arange(per_word, dtype=np.uint32) * bits)[None, None, :]
    q = (groups.packed[..., None] >> shifts) & np.uint32((1 << bits) - 1)
    q = q.reshape(rows, -1, GROUP).astype(np.float32)
    return (q * groups.scales[..., None] + groups.biases[..., None]).reshape(rows, -1)
