"""How the kernels read and write a KV cache stored in float32 or in IEEE half precision.

numba has no float16 type on the CPU, so a half cache reaches the kernels as a uint16 view of its
bits. Every kernel is written once over the element type: `kv_load` turns a stored element into
float32 before any arithmetic (the identity for float32; LLVM's `fpext half -> float` for half bits,
exact for every half including subnormals, infinities and NaN), `kv_store` turns a float32 into the
stored element (the identity, or `fptrunc float -> half`: round to nearest even, overflow to
infinity, as numpy's float16 cast does). numba compiles one specialization per element type, so the
float32 cache runs exactly the code it ran before, and a half cache's row sees the same fixed
reduction order whatever its batch.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

_F32 = ir.FloatType()
_HALF = ir.HalfType()
_I16 = ir.IntType(16)

KV_ELEMENT_TYPES = (types.float32, types.uint16)
"""numba element types of the cache arrays the kernels take: float32, or the bits of IEEE halves."""


@intrinsic
def kv_load(typingctx, element):
    """float32 value of one stored cache element (float32 as is, uint16 as the half it holds)."""
    if element == types.float32:

        def identity(context, builder, signature, args):
            return args[0]

        return types.float32(element), identity
    if element == types.uint16:

        def widen(context, builder, signature, args):
            return builder.fpext(builder.bitcast(args[0], _HALF), _F32)

        return types.float32(element), widen
    return None


@intrinsic
def kv_store(typingctx, like, value):
    """`value` (float32) as an element of the cache array `like`: itself for a float32 cache, its
    nearest half's bits (ties to even) for a uint16 one."""
    if value != types.float32 or not isinstance(like, types.Array) or like.dtype not in KV_ELEMENT_TYPES:
        return None
    if like.dtype == types.float32:

        def identity(context, builder, signature, args):
            return args[1]

        return types.float32(like, value), identity

    def narrow(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[1], _HALF), _I16)

    return types.uint16(like, value), narrow


def load_kv_vector(builder: ir.IRBuilder, ptr: ir.Value, element: types.Type, width: int = 16) -> ir.Value:
    """<width x float> from `width` consecutive cache elements at `ptr` (a pointer to float32 or to
    i16 half bits): one unaligned load, widened in one vector conversion for halves (vcvtph2ps)."""
    if element == types.float32:
        vty = ir.VectorType(_F32, width)
        return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=1)
    bits = builder.load(builder.bitcast(ptr, ir.VectorType(_I16, width).as_pointer()), align=1)
    return builder.fpext(builder.bitcast(bits, ir.VectorType(_HALF, width)), ir.VectorType(_F32, width))


def element_pointer_type(element: types.Type) -> ir.Type:
    """The LLVM pointer type of one cache element (float* or i16*)."""
    return (_F32 if element == types.float32 else _I16).as_pointer()
