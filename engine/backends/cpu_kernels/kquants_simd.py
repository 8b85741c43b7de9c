"""Q4_K, Q5_K and Q6_K row dot products decoded in registers, written as LLVM vector IR (numba @intrinsic).

The first K-quant kernels dequantize a weight row into a float32 buffer with plain numba loops, then
dot it with each activation row (kquants._vdot). Here each 64-weight chunk of a super-block is decoded
in registers and used at once by 1 to 6 activation rows. A Q4_K chunk (32 bytes of nibbles: the low
nibbles are sub-block 2g, the high ones sub-block 2g + 1) is two 16-byte loads, an and and a shift,
and ds * q - dm (Q5_K adds a fifth bit from qh); a Q6_K chunk takes its 4 low bits from ql and 2
high bits from qh, and ds * (q - 32).
Gemma 3 270M's Q4_K matrix at B = 1: 0.067 -> 0.022 ms; B = 16: 0.31 -> 0.17 ms (2 threads).

The bits are those of the buffer path. Each weight is exactly the dequantized value (Q4_K, Q5_K:
fsub(fmul(ds, q), dm), two roundings; Q6_K: fmul(ds, q - 32), q - 32 exact in int8). Each activation
row's dot runs 64 lanes in four 16-lane vectors, lane l taking weights l, l + 64, l + 128, ... in order
with fmul then fadd, then (v0 + v1) + (v2 + v3) and a halving tree: `_vdot`'s order. So a row's result
is the same alone, in any batch, and whichever of the two paths computed it.

The cached functions live in kquants.py; cache_freshness.py drops their entries when this file changes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .simd import (
    PREFETCH_BYTES,
    activation_rows,
    exit_values,
    is_c_array,
    load_vec,
    prefetch,
    splat,
    sum_lanes,
)

_I8 = ir.IntType(8)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V16I8 = ir.VectorType(_I8, 16)
_V16F = ir.VectorType(_F32, 16)
_Q4_K_BYTES = 144
_Q5_K_BYTES = 176
_Q6_K_BYTES = 210
_BLOCK_BYTES = {"q4_k": _Q4_K_BYTES, "q5_k": _Q5_K_BYTES, "q6_k": _Q6_K_BYTES}
_QS_OFFSET = 16
"""Nibble bytes start after d, dmin (2 halves) and the 12 packed scale bytes."""


def _tree(builder: ir.IRBuilder, vectors: list[ir.Value]) -> ir.Value:
    """(v0 + v1) + (v2 + v3), then the 16 lanes summed by halving: _vdot's final order."""
    return sum_lanes(
        builder, builder.fadd(builder.fadd(vectors[0], vectors[1]), builder.fadd(vectors[2], vectors[3]))
    )


def _q4_k_weights(builder, row_ptr, sb, ds_ptr, dm_ptr, chunk):
    """The four 16-lane weight vectors of 64-weight chunk `chunk` (0..3) of Q4_K super-block `sb`: the
    low then high nibbles of 32 bytes, ds * q - dm with the sub-block's scale and min."""
    fifteen = ir.Constant(_V16I8, [15] * 16)
    four = ir.Constant(_V16I8, [4] * 16)
    base = builder.add(
        builder.mul(sb, ir.Constant(_I64, _Q4_K_BYTES)), ir.Constant(_I64, _QS_OFFSET + 32 * chunk)
    )
    qs = builder.gep(row_ptr, [base])
    first = load_vec(builder, qs, _V16I8)
    second = load_vec(builder, builder.gep(qs, [ir.Constant(_I64, 16)]), _V16I8)
    weights = []
    for j, (bytes_, high) in enumerate(((first, False), (second, False), (first, True), (second, True))):
        sub = builder.add(builder.mul(sb, ir.Constant(_I64, 8)), ir.Constant(_I64, 2 * chunk + j // 2))
        scale = splat(builder, builder.load(builder.gep(ds_ptr, [sub])))
        minimum = splat(builder, builder.load(builder.gep(dm_ptr, [sub])))
        q = builder.lshr(bytes_, four) if high else builder.and_(bytes_, fifteen)
        weights.append(builder.fsub(builder.fmul(scale, builder.uitofp(q, _V16F)), minimum))
    return weights


def _q5_k_weights(builder, row_ptr, sb, ds_ptr, dm_ptr, chunk):
    """The four 16-lane weight vectors of chunk `chunk` of Q5_K super-block `sb`: Q4_K's nibbles with a
    fifth bit from qh (bit 2 * chunk of qh[i] for the low nibbles, bit 2 * chunk + 1 for the high)."""
    one = ir.Constant(_V16I8, [1] * 16)
    fifteen = ir.Constant(_V16I8, [15] * 16)
    four = ir.Constant(_V16I8, [4] * 16)
    block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, _Q5_K_BYTES))])
    qh = [load_vec(builder, builder.gep(block, [ir.Constant(_I64, 16 + 16 * k)]), _V16I8) for k in range(2)]
    qs = [
        load_vec(builder, builder.gep(block, [ir.Constant(_I64, 48 + 32 * chunk + 16 * k)]), _V16I8)
        for k in range(2)
    ]
    weights = []
    for j in range(4):
        high = j >= 2
        half = j % 2  # bytes 0..15 or 16..31 of the chunk's 32
        nibble = builder.lshr(qs[half], four) if high else builder.and_(qs[half], fifteen)
        bit = builder.and_(builder.lshr(qh[half], ir.Constant(_V16I8, [2 * chunk + int(high)] * 16)), one)
        q = builder.or_(nibble, builder.shl(bit, four))
        sub = builder.add(builder.mul(sb, ir.Constant(_I64, 8)), ir.Constant(_I64, 2 * chunk + int(high)))
        scale = splat(builder, builder.load(builder.gep(ds_ptr, [sub])))
        minimum = splat(builder, builder.load(builder.gep(dm_ptr, [sub])))
        weights.append(builder.fsub(builder.fmul(scale, builder.uitofp(q, _V16F)), minimum))
    return weights


def _q6_k_weights(builder, row_ptr, sb, ds_ptr, dm_ptr, chunk):
    """The four 16-lane weight vectors of 64-weight chunk `chunk` of Q6_K super-block `sb`: 4 low bits
    from ql, 2 high bits from qh, q - 32 exact in int8, times the sub-block's d * scale."""
    three = ir.Constant(_V16I8, [3] * 16)
    fifteen = ir.Constant(_V16I8, [15] * 16)
    half, upper = divmod(chunk, 2)  # weights 128 * half + 64 * upper ...
    block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, _Q6_K_BYTES))])
    weights = []
    for j in range(4):
        part = 2 * upper + j // 2  # q0..q3 of the reference decoder
        lane_base = 16 * (j % 2)
        ql = load_vec(
            builder, builder.gep(block, [ir.Constant(_I64, 64 * half + 32 * (part % 2) + lane_base)]), _V16I8
        )
        qh = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 128 + 32 * half + lane_base)]), _V16I8)
        low = builder.and_(ql, fifteen) if part < 2 else builder.lshr(ql, ir.Constant(_V16I8, [4] * 16))
        high = builder.and_(builder.lshr(qh, ir.Constant(_V16I8, [2 * part] * 16)), three)
        q = builder.sub(
            builder.or_(low, builder.shl(high, ir.Constant(_V16I8, [4] * 16))), ir.Constant(_V16I8, [32] * 16)
        )
        sub = builder.add(builder.mul(sb, ir.Constant(_I64, 16)), ir.Constant(_I64, 4 * chunk + j))
        scale = splat(builder, builder.load(builder.gep(ds_ptr, [sub])))
        weights.append(builder.fmul(scale, builder.sitofp(q, _V16F)))
    return weights


def _rows_codegen(rows: int, decode, block_bytes: int):
    """IR for `rows` activation rows x[b0 ..] against one K-quant weight row, each 64-weight chunk
    decoded once by `decode` (its per-sub-block scales ds and mins dm precomputed, float32, as the
    reference decoder rounds them) and used by every row."""

    def codegen(context, builder, signature, args):
        row = context.make_array(signature.args[0])(context, builder, args[0])
        ds = context.make_array(signature.args[1])(context, builder, args[1])
        dm = context.make_array(signature.args[2])(context, builder, args[2])
        xa = context.make_array(signature.args[3])(context, builder, args[3])
        b0 = args[4]
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        ds_ptr = builder.bitcast(ds.data, _F32.as_pointer())
        dm_ptr = builder.bitcast(dm.data, _F32.as_pointer())
        n, x_rows = activation_rows(builder, xa, b0, rows)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        zero = ir.Constant(_V16F, None)

        entry = builder.block
        loop = builder.append_basic_block("superblocks")
        done = builder.append_basic_block("reduce")
        builder.cbranch(builder.icmp_unsigned(">", n_sb, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        sb = builder.phi(_I64)
        accs = [[builder.phi(_V16F) for _ in range(4)] for _ in range(rows)]
        block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, block_bytes))])
        prefetch(builder, block, PREFETCH_BYTES, lines=(block_bytes + 63) // 64)
        current = [list(chains) for chains in accs]
        for chunk in range(4):
            weights = decode(builder, row_ptr, sb, ds_ptr, dm_ptr, chunk)
            offset = builder.add(builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk))
            for r in range(rows):
                x_chunk = builder.gep(x_rows[r], [offset])
                for j in range(4):
                    xv = load_vec(builder, builder.gep(x_chunk, [ir.Constant(_I64, 16 * j)]), _V16F)
                    current[r][j] = builder.fadd(current[r][j], builder.fmul(weights[j], xv))
        following = builder.add(sb, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_sb), loop, done)
        sb.add_incoming(ir.Constant(_I64, 0), entry)
        sb.add_incoming(following, loop_end)
        for r in range(rows):
            for j in range(4):
                accs[r][j].add_incoming(zero, entry)
                accs[r][j].add_incoming(current[r][j], loop_end)

        builder.position_at_end(done)
        finals = [exit_values(builder, current[r], entry, loop_end) for r in range(rows)]
        results = [_tree(builder, row_finals) for row_finals in finals]
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _make(kind: str, rows: int, decode):
    def typer(typingctx, row, ds, dm, x, b0):
        if not (
            is_c_array(row, types.uint8, 1)
            and is_c_array(ds, types.float32, 1)
            and is_c_array(dm, types.float32, 1)
            and is_c_array(x, types.float32, 2)
            and isinstance(b0, types.Integer)
        ):
            return None
        signature = types.UniTuple(types.float32, rows)(row, ds, dm, x, types.int64)
        return signature, _rows_codegen(rows, decode, _BLOCK_BYTES[kind])

    typer.__name__ = f"{kind}_dot{rows}"
    typer.__doc__ = f"""(row uint8 [row_bytes], ds, dm float32 [per sub-block], x float32 [B, n], b0)
    -> the {rows} dot products of the {kind.upper()} weight row with x[b0], ..., x[b0 + {rows - 1}] (n a
    multiple of 256; dm unused by Q6_K)."""
    return intrinsic(typer)


# 1 to 6 activation rows per call: 6 rows of 4 accumulators and a chunk's 4 weight vectors stay in registers
q4_k_dot1, q4_k_dot2, q4_k_dot3, q4_k_dot4, q4_k_dot5, q4_k_dot6 = (
    _make("q4_k", r, _q4_k_weights) for r in range(1, 7)
)
q5_k_dot1, q5_k_dot2, q5_k_dot3, q5_k_dot4, q5_k_dot5, q5_k_dot6 = (
    _make("q5_k", r, _q5_k_weights) for r in range(1, 7)
)
q6_k_dot1, q6_k_dot2, q6_k_dot3, q6_k_dot4, q6_k_dot5, q6_k_dot6 = (
    _make("q6_k", r, _q6_k_weights) for r in range(1, 7)
)
