"""Scalar bit conversions numba lacks on the CPU: half and bfloat16 to float32.

numba has no float16 type on the CPU, so the GGUF block scales (IEEE half) are converted through LLVM's own
`fpext half -> float` (one vcvtph2ps where the CPU has F16C), exact for every half value including
subnormals, infinities and NaN, which keeps dequantized weights bit-identical to gguf's numpy dequantize.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic


@intrinsic
def _half_bits_to_f32(typingctx, bits):
    """LLVM: trunc to i16, bitcast to half, fpext to float."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        h16 = builder.trunc(args[0], ir.IntType(16)) if bits.bitwidth > 16 else args[0]
        if bits.bitwidth < 16:
            h16 = builder.zext(args[0], ir.IntType(16))
        return builder.fpext(builder.bitcast(h16, ir.HalfType()), ir.FloatType())

    return sig, codegen


@intrinsic
def _i32_bits_to_f32(typingctx, bits):
    """LLVM: trunc/zext to i32, bitcast to float."""
    if not isinstance(bits, types.Integer):
        return None
    sig = types.float32(bits)

    def codegen(context, builder, signature, args):
        value = args[0]
        if bits.bitwidth > 32:
            value = builder.trunc(value, ir.IntType(32))
        elif bits.bitwidth < 32:
            value = builder.zext(value, ir.IntType(32))
        return builder.bitcast(value, ir.FloatType())

    return sig, codegen


@njit(inline="always", cache=True)
def half_to_f32(lo, hi):
    """float32 value of the little-endian IEEE half stored in bytes (lo, hi)."""
    return _half_bits_to_f32(types.uint16(lo) | (types.uint16(hi) << types.uint16(8)))


@njit(inline="always", cache=True)
def half_bits_to_f32(bits):
    """float32 value of a half given as its 16 bits (an unsigned integer)."""
    return _half_bits_to_f32(types.uint16(bits))


@njit(inline="always", cache=True)
def f32_from_bits(bits):
    """The float32 whose IEEE bits are the low 32 bits of integer `bits`."""
    return _i32_bits_to_f32(bits)


@njit(inline="always", cache=True)
def bf16_bits_to_f32(bits):
    """float32 value of a bfloat16 given as its 16 bits: the same bits shifted into the high half."""
    return _i32_bits_to_f32(types.uint32(bits) << types.uint32(16))


@intrinsic
def _f32_round_to_half(typingctx, value):
    """LLVM: fptrunc float -> half (round to nearest even), fpext back to float."""
    if value != types.float32:
        return None
    sig = types.float32(value)

    def codegen(context, builder, signature, args):
        return builder.fpext(builder.fptrunc(args[0], ir.HalfType()), ir.FloatType())

    return sig, codegen


@njit(inline="always", cache=True)
def round_to_half(value):
    """float32 value rounded to the nearest IEEE half (ties to even), as numpy's float16 cast does."""
    return _f32_round_to_half(np.float32(value))
