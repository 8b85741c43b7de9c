"""Int8-activation row dot products on raw K-quant blocks (Q4_K, Q5_K, Q6_K), as LLVM vector IR.

The activations come quantized per 32-block as for the legacy types (quantize_activations: xq int8,
xs float32 per block), so every matmul of a layer shares one quantization whatever its weights' type.
A K-quant weight is an unsigned integer q times a float per sub-block, minus a float per sub-block:
    Q4_K, Q5_K: w = ds[j] * q - dm[j]      (q 4 or 5 bits; ds = d * sc, dm = dmin * m per 32 weights)
    Q6_K:       w = ds[k] * q - 32 ds[k]   (q 6 bits; ds = d * scale per 16 weights)
so a row's dot splits into an integer part and a min part:
    sum_j ds[j] xs[j] (sum_i q_i xq_i)  -  sum_k dm[k] (xs[k] sum_i xq_i)
The integer sums are exact whichever instructions compute them (vpdpbusd on VNNI, vpmaddubsw +
vpmaddwd on AVX2, widening multiplies elsewhere: `simd_int8.unsigned_lanes`), 16 int32 lanes per
64-weight chunk, lane l summing weights 4l..4l+3 of the chunk. Each lane is converted to float and
accumulated as acc = fma(ds * xs, lanes, acc) in one 16-lane chain per activation row, chunk after
chunk. The min part takes one 16-lane fma per super-block and row: accm = fma(dm per 16 activations,
xsb, accm), where xsb = xs * (sum of the 16 xq), exact in float32 (an 11-bit scale times a 12-bit
integer). The result is sum_lanes(lo + hi of acc) - sum_lanes(lo + hi of accm).

That order is written here, fixed for every row and call, and nothing in it depends on B or on the
other rows of a call: a row's result is bit-identical alone, in any batch, as a verify row, and on
every path (the integer lanes are the same numbers). numba's cache tracks only kquants_int8.py for
these kernels: after editing this file (or simd_int8.py), touch kquants_int8.py.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .features import cpu_features
from .simd import fma, is_c_array, load_vec, sum_lanes
from .simd_int8 import PORTABLE, available_paths, unsigned_lanes

ROW_COUNTS = (1, 2, 3, 4)
"""Activation rows per intrinsic call: 4 rows of one 16-lane accumulator (two ymm on AVX2) and a chunk's
weights and scales stay inside AVX2's 16 registers."""

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V64I8 = ir.VectorType(_I8, 64)
_V16F = ir.VectorType(_F32, 16)
_V8F = ir.VectorType(_F32, 8)

BLOCK_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}


def _const(vty: ir.VectorType, value: int) -> ir.Constant:
    return ir.Constant(vty, [value] * vty.count)


def _concat(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    indices = list(range(2 * a.type.count))
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(indices)), indices))


def _half(builder: ir.IRBuilder, vec: ir.Value, which: int) -> ir.Value:
    count = vec.type.count // 2
    indices = list(range(which * count, (which + 1) * count))
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(_I32, count), indices))


def _load32(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    return load_vec(builder, builder.gep(block, [ir.Constant(_I64, offset)]), _V32I8)


def _chunk_quants(builder: ir.IRBuilder, kind: str, block: ir.Value, chunk: int) -> ir.Value:
    """The 64 unsigned quants of 64-weight chunk `chunk` (0..3) of the super-block at `block`, in weight
    order, as <64 x i8>."""
    fifteen, four = _const(_V32I8, 15), _const(_V32I8, 4)
    if kind == "q6_k":  # 4 low bits from ql, 2 high bits from qh (llama.cpp's q1..q4 of a 128-half)
        half, upper = divmod(chunk, 2)
        parts = []
        for second in (0, 1):
            ql = _load32(builder, block, 64 * half + 32 * second)
            qh = _load32(builder, block, 128 + 32 * half)
            low = builder.lshr(ql, four) if upper else builder.and_(ql, fifteen)
            shift = 2 * (2 * upper + second)
            high = builder.and_(builder.lshr(qh, _const(_V32I8, shift)), _const(_V32I8, 3))
            parts.append(builder.or_(low, builder.shl(high, four)))
        return _concat(builder, parts[0], parts[1])
    qs_offset = 16 if kind == "q4_k" else 48
    qs = _load32(builder, block, qs_offset + 32 * chunk)
    low, high = builder.and_(qs, fifteen), builder.lshr(qs, four)
    if kind == "q5_k":  # bit 2 * chunk of qh[i] tops the low nibbles, bit 2 * chunk + 1 the high ones
        qh = _load32(builder, block, 16)
        one = _const(_V32I8, 1)
        for which in (0, 1):
            bit = builder.and_(builder.lshr(qh, _const(_V32I8, 2 * chunk + which)), one)
            top = builder.shl(bit, four)
            if which == 0:
                low = builder.or_(low, top)
            else:
                high = builder.or_(high, top)
    return _concat(builder, low, high)


def _shuffle(builder: ir.IRBuilder, vec: ir.Value, indices: list[int]) -> ir.Value:
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(_I32, len(indices)), indices))


def _half_at(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The IEEE half at byte `offset` of the block, widened to float."""
    ptr = builder.bitcast(builder.gep(block, [ir.Constant(_I64, offset)]), ir.IntType(16).as_pointer())
    return builder.fpext(builder.bitcast(builder.load(ptr, align=1), ir.HalfType()), _F32)


def _splat8(builder: ir.IRBuilder, value: ir.Value) -> ir.Value:
    vec = builder.insert_element(ir.Constant(_V8F, ir.Undefined), value, ir.Constant(_I32, 0))
    return _shuffle(builder, vec, [0] * 8)


def _superblock_scales(builder: ir.IRBuilder, kind: str, block: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(ds, mins) of the super-block at `block`, decoded in registers with the scalar decoder's bits
    (kquants._scales_mins / _scales_q6: one float32 product each). Q4_K, Q5_K: ds = d * sc and
    dm = dmin * m for the 8 sub-blocks (<8 x float> each), the 6-bit sc and m unpacked from the 12 scale
    bytes; Q6_K: ds = d * scale for the 16 runs of 16 (<16 x float>), mins unused (None)."""
    if kind == "q6_k":
        scales = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 192)]), ir.VectorType(_I8, 16))
        d = _half_at(builder, block, 208)
        wide = builder.sitofp(scales, _V16F)
        splat = _shuffle(
            builder,
            builder.insert_element(ir.Constant(_V16F, ir.Undefined), d, ir.Constant(_I32, 0)),
            [0] * 16,
        )
        return builder.fmul(splat, wide), None
    v8i32 = ir.VectorType(_I32, 8)
    raw = builder.zext(
        load_vec(builder, builder.gep(block, [ir.Constant(_I64, 4)]), ir.VectorType(_I8, 16)),
        ir.VectorType(_I32, 16),
    )  # the 12 scale bytes s0..s11 (and 4 nibble bytes, unused)

    def pick(indices: list[int]) -> ir.Value:
        return _shuffle(builder, raw, indices)

    def consts(values: list[int]) -> ir.Constant:
        return ir.Constant(v8i32, values)

    # j < 4: sc = s[j] & 63, m = s[j + 4] & 63; j >= 4: sc = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4),
    # m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4)
    top_bits = consts([0] * 4 + [0x30] * 4)
    sc = builder.or_(
        builder.and_(pick([0, 1, 2, 3, 8, 9, 10, 11]), consts([63] * 4 + [15] * 4)),
        builder.and_(builder.lshr(pick([0, 1, 2, 3, 0, 1, 2, 3]), consts([2] * 8)), top_bits),
    )
    mn = builder.or_(
        builder.and_(
            builder.lshr(pick([4, 5, 6, 7, 8, 9, 10, 11]), consts([0] * 4 + [4] * 4)), consts([63] * 8)
        ),
        builder.and_(builder.lshr(pick([0, 1, 2, 3, 4, 5, 6, 7]), consts([2] * 8)), top_bits),
    )
    d, dmin = _half_at(builder, block, 0), _half_at(builder, block, 2)
    ds = builder.fmul(_splat8(builder, d), builder.uitofp(sc, _V8F))
    dm = builder.fmul(_splat8(builder, dmin), builder.uitofp(mn, _V8F))
    return ds, dm


def _codegen(kind: str, rows: int, path: int):
    if path not in available_paths():
        path = PORTABLE
    wide = cpu_features().avx512_vnni
    block_bytes = BLOCK_BYTES[kind]

    def codegen(context, builder, signature, args):
        row, xqa, xsa, xsba = (
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:4], args[:4], strict=True)
        )
        b0 = args[4]
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        n = builder.extract_value(xqa.shape, 1)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        blocks_per_row = builder.udiv(n, ir.Constant(_I64, 32))
        sixteens_per_row = builder.udiv(n, ir.Constant(_I64, 16))
        xq_rows, xs_rows, xsb_rows = [], [], []
        for r in range(rows):
            b = builder.add(b0, ir.Constant(_I64, r))
            xq_rows.append(builder.gep(builder.bitcast(xqa.data, _I8.as_pointer()), [builder.mul(b, n)]))
            xs_rows.append(
                builder.gep(builder.bitcast(xsa.data, _F32.as_pointer()), [builder.mul(b, blocks_per_row)])
            )
            xsb_rows.append(
                builder.gep(builder.bitcast(xsba.data, _F32.as_pointer()), [builder.mul(b, sixteens_per_row)])
            )
        zero = ir.Constant(_V16F, None)

        entry = builder.block
        loop = builder.append_basic_block("superblocks")
        done = builder.append_basic_block("reduce")
        builder.cbranch(builder.icmp_unsigned(">", n_sb, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        sb = builder.phi(_I64)
        acc_phis = [builder.phi(_V16F) for _ in range(rows)]
        min_phis = [builder.phi(_V16F) for _ in range(rows)]
        block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, block_bytes))])
        ds, dm = _superblock_scales(builder, kind, block)
        if kind == "q6_k":  # the min of each run of 16 is 32 * ds: exact (a power of two)
            mins = builder.fmul(ds, ir.Constant(_V16F, [32.0] * 16))
        else:
            mins = _shuffle(builder, dm, [i // 2 for i in range(16)])
        block0 = builder.mul(sb, ir.Constant(_I64, 8))
        sixteen0 = builder.mul(sb, ir.Constant(_I64, 16))
        coefs = []  # per row: ds * xs, one lane per sub-block (Q4_K, Q5_K) or per run of 16 (Q6_K)
        for r in range(rows):
            xs = load_vec(builder, builder.gep(xs_rows[r], [block0]), _V8F)
            if kind == "q6_k":
                coefs.append(builder.fmul(ds, _shuffle(builder, xs, [i // 2 for i in range(16)])))
            else:
                coefs.append(builder.fmul(ds, xs))
        accs = list(acc_phis)
        for chunk in range(4):
            quants = _chunk_quants(builder, kind, block, chunk)
            byte0 = builder.add(builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk))
            if kind == "q6_k":
                lanes_of = [4 * chunk + i // 4 for i in range(16)]
            else:
                lanes_of = [2 * chunk + i // 8 for i in range(16)]
            for r in range(rows):
                act = load_vec(builder, builder.gep(xq_rows[r], [byte0]), _V64I8)
                lanes = unsigned_lanes(builder, path, wide, quants, act)
                accs[r] = fma(
                    builder, _shuffle(builder, coefs[r], lanes_of), builder.sitofp(lanes, _V16F), accs[r]
                )
        new_mins = []
        for r in range(rows):
            xsb = load_vec(builder, builder.gep(xsb_rows[r], [sixteen0]), _V16F)
            new_mins.append(fma(builder, mins, xsb, min_phis[r]))
        following = builder.add(sb, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_sb), loop, done)
        sb.add_incoming(ir.Constant(_I64, 0), entry)
        sb.add_incoming(following, loop_end)
        for r in range(rows):
            for phi, new in ((acc_phis[r], accs[r]), (min_phis[r], new_mins[r])):
                phi.add_incoming(zero, entry)
                phi.add_incoming(new, loop_end)

        builder.position_at_end(done)
        finals = []
        for r in range(rows):
            pair = []
            for new in (accs[r], new_mins[r]):
                phi = builder.phi(_V16F)
                phi.add_incoming(zero, entry)
                phi.add_incoming(new, loop_end)
                pair.append(phi)
            finals.append(pair)
        results = []
        for acc, accm in finals:
            total = sum_lanes(builder, builder.fadd(_half(builder, acc, 0), _half(builder, acc, 1)))
            minus = sum_lanes(builder, builder.fadd(_half(builder, accm, 0), _half(builder, accm, 1)))
            results.append(builder.fsub(total, minus))
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _make(kind: str, rows: int, path: int):
    def typer(typingctx, row, xq, xs, xsb, b0):
        arrays = ((row, types.uint8, 1), (xq, types.int8, 2), (xs, types.float32, 2), (xsb, types.float32, 2))
        if not (all(is_c_array(a, t, d) for a, t, d in arrays) and isinstance(b0, types.Integer)):
            return None
        signature = types.UniTuple(types.float32, rows)(row, xq, xs, xsb, types.int64)
        return signature, _codegen(kind, rows, path)

    typer.__name__ = f"{kind}_i8dot{rows}_{('portable', 'avx2', 'vnni')[path]}"
    typer.__doc__ = f"""(row uint8, xq int8 [B, n], xs float32 [B, n // 32], xsb float32 [B, n // 16], b0)
    -> the {rows} int8-activation dot products of the {kind.upper()} row with rows b0.. (xsb:
    kquants_int8.sixteen_sums)."""
    return intrinsic(typer)


# module-level names (numba resolves intrinsics as globals): <type>_<path><rows>
q4_k_portable1, q4_k_portable2, q4_k_portable3, q4_k_portable4 = (_make("q4_k", r, 0) for r in ROW_COUNTS)
q4_k_avx21, q4_k_avx22, q4_k_avx23, q4_k_avx24 = (_make("q4_k", r, 1) for r in ROW_COUNTS)
q4_k_vnni1, q4_k_vnni2, q4_k_vnni3, q4_k_vnni4 = (_make("q4_k", r, 2) for r in ROW_COUNTS)
q5_k_portable1, q5_k_portable2, q5_k_portable3, q5_k_portable4 = (_make("q5_k", r, 0) for r in ROW_COUNTS)
q5_k_avx21, q5_k_avx22, q5_k_avx23, q5_k_avx24 = (_make("q5_k", r, 1) for r in ROW_COUNTS)
q5_k_vnni1, q5_k_vnni2, q5_k_vnni3, q5_k_vnni4 = (_make("q5_k", r, 2) for r in ROW_COUNTS)
q6_k_portable1, q6_k_portable2, q6_k_portable3, q6_k_portable4 = (_make("q6_k", r, 0) for r in ROW_COUNTS)
q6_k_avx21, q6_k_avx22, q6_k_avx23, q6_k_avx24 = (_make("q6_k", r, 1) for r in ROW_COUNTS)
q6_k_vnni1, q6_k_vnni2, q6_k_vnni3, q6_k_vnni4 = (_make("q6_k", r, 2) for r in ROW_COUNTS)
