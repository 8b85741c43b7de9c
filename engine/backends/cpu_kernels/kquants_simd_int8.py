"""Int8-activation row dot products on raw K-quant blocks (Q4_K, Q5_K, Q6_K), as LLVM vector IR.

The activations come quantized per 256-block as llama.cpp's Q8_K (activations.quantize_activations_k:
xq int8, one float32 scale xd per 256, and xb, the int32 sum of each 16 xq), so a super-block's whole
dot is one exact integer sum. A K-quant weight is an unsigned integer q with a small integer scale per
sub-block:
    Q4_K, Q5_K: w = d * sc[j] * q - dmin * m[j]   (q 4 or 5 bits; sc, m 6 bits per 32 weights)
    Q6_K:       w = d * sc[k] * (q - 32)          (q 6 bits; sc int8 per 16 weights)
so per super-block and activation row
    Q4_K, Q5_K: (d * xd) * A - (dmin * xd) * M,   A = sum_j sc[j] sum_i q_i xq_i,  M = sum_j m[j] xb32[j]
    Q6_K:       (d * xd) * (A - 32 * sum_k sc[k] xb[k])
with A and M exact int32 sums, 16 lanes wide (lane l summing weights 4l..4l+3 of each 64-weight chunk),
whichever instructions compute them (vpmaddubsw, then vpdpwssd against the lanes' scales on VNNI;
vpmaddubsw and vpmaddwd against the scales on AVX2, as llama.cpp does; widening multiplies elsewhere:
`simd_int8.add_scaled_lanes`; the mins and Q6_K's offsets through `simd_int8.small_products`).
The float part is fixed: the 16 lanes of A (and M) are added into one exact int32 per super-block,
then acc = fma(d * xd, float(A), acc) and (Q4_K, Q5_K) accm = fma(dmin * xd, float(M), accm), scalars,
super-block after super-block; the result is acc - accm. That per-super-block form is also what the
tiled kernels of kquants_tiles_int8.py compute for each (weight row, activation row), with activation
rows in the lanes, so a row's bits are the same whichever of the two kernels a call takes.

That order is written here, fixed for every row and call, and nothing in it depends on B or on the other
rows of a call: a row's result is bit-identical alone, in any batch, as a verify row, and on every path
(the integer lanes are the same numbers). numba's cache tracks only kquants_int8.py for these kernels:
after editing this file (or simd_int8.py), touch kquants_int8.py.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .features import cpu_features
from .simd import PREFETCH_BYTES, fma, is_c_array, load_vec, prefetch, sum_int_lanes_of
from .simd_int8 import (
    PORTABLE,
    add_scaled_lanes,
    available_paths,
    concat,
    const_vec,
    low_halves,
    pair_scales,
    small_products,
)

ROW_COUNTS = (1, 2, 3, 4)
"""Activation rows per intrinsic call: 4 rows of two 16-lane accumulators (int and float) and a chunk's
quants and scales fit AVX2's 16 registers."""

_I8 = ir.IntType(8)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V32I8 = ir.VectorType(_I8, 32)
_V64I8 = ir.VectorType(_I8, 64)
_V16I32 = ir.VectorType(_I32, 16)

BLOCK_BYTES = {"q4_k": 144, "q5_k": 176, "q6_k": 210}


def _load32(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    return load_vec(builder, builder.gep(block, [ir.Constant(_I64, offset)]), _V32I8)


def _chunk_quants(builder: ir.IRBuilder, kind: str, block: ir.Value, chunk: int) -> ir.Value:
    """The 64 unsigned quants of 64-weight chunk `chunk` (0..3) of the super-block at `block`, in weight
    order, as <64 x i8>."""
    fifteen, four = const_vec(_V32I8, 15), const_vec(_V32I8, 4)
    if kind == "q6_k":  # 4 low bits from ql, 2 high bits from qh (llama.cpp's q1..q4 of a 128-half)
        part, upper = divmod(chunk, 2)
        parts = []
        for second in (0, 1):
            ql = _load32(builder, block, 64 * part + 32 * second)
            qh = _load32(builder, block, 128 + 32 * part)
            low = builder.lshr(ql, four) if upper else builder.and_(ql, fifteen)
            shift = 2 * (2 * upper + second)
            high = builder.and_(builder.lshr(qh, const_vec(_V32I8, shift)), const_vec(_V32I8, 3))
            parts.append(builder.or_(low, builder.shl(high, four)))
        return concat(builder, parts[0], parts[1])
    # the 32 quant bytes in both halves of one vector (one broadcast load), the high half shifted right
    # by 4 in its 64-bit lanes, then one mask: the low nibbles, then the high ones (each bit moved
    # stays inside its byte)
    v8i64 = ir.VectorType(_I64, 8)
    qs_offset = 16 if kind == "q4_k" else 48
    both = _both_halves(builder, block, qs_offset + 32 * chunk)
    nibbles = builder.bitcast(builder.lshr(both, ir.Constant(v8i64, [0] * 4 + [4] * 4)), _V64I8)
    quants = builder.and_(nibbles, const_vec(_V64I8, 15))
    if kind == "q5_k":  # bit 2 * chunk of qh[i] tops the low nibbles, bit 2 * chunk + 1 the high ones
        qh = _both_halves(builder, block, 16)
        # move bit (2 * chunk + half) of every byte to bit 4: left by 4 - (2 * chunk + half) for the
        # first two chunks, right by (2 * chunk + half) - 4 for the last two
        shifts = [2 * chunk + h - 4 for h in (0, 1) for _ in range(4)]
        if chunk < 2:
            moved = builder.shl(qh, ir.Constant(v8i64, [-k for k in shifts]))
        else:
            moved = builder.lshr(qh, ir.Constant(v8i64, shifts))
        quants = builder.or_(quants, builder.and_(builder.bitcast(moved, _V64I8), const_vec(_V64I8, 16)))
    return quants


def _both_halves(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The 32 bytes at block + offset, twice, as <8 x i64> (a 256-bit broadcast load)."""
    half_vec = load_vec(builder, builder.gep(block, [ir.Constant(_I64, offset)]), ir.VectorType(_I64, 4))
    return concat(builder, half_vec, half_vec)


def _shuffle(builder: ir.IRBuilder, vec: ir.Value, indices: list[int]) -> ir.Value:
    return builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(_I32, len(indices)), indices))


def _half_at(builder: ir.IRBuilder, block: ir.Value, offset: int) -> ir.Value:
    """The IEEE half at byte `offset` of the block, widened to float."""
    ptr = builder.bitcast(builder.gep(block, [ir.Constant(_I64, offset)]), ir.IntType(16).as_pointer())
    return builder.fpext(builder.bitcast(builder.load(ptr, align=1), ir.HalfType()), _F32)


def _superblock_scales(builder: ir.IRBuilder, kind: str, block: ir.Value):
    """(sc, m, d, dmin) of the super-block at `block`: Q4_K, Q5_K: the 8 six-bit sub-block scales and
    mins as <8 x i32>, unpacked from the 12 scale bytes, and the two halves d, dmin as floats; Q6_K: the 16
    signed scales as <16 x i32>, None, d, None."""
    if kind == "q6_k":
        scales = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 192)]), ir.VectorType(_I8, 16))
        return builder.sext(scales, _V16I32), None, _half_at(builder, block, 208), None
    v8i32 = ir.VectorType(_I32, 8)
    raw = builder.zext(
        load_vec(builder, builder.gep(block, [ir.Constant(_I64, 4)]), ir.VectorType(_I8, 16)), _V16I32
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
    return sc, mn, _half_at(builder, block, 0), _half_at(builder, block, 2)


def _codegen(kind: str, rows: int, path: int):
    if path not in available_paths():
        path = PORTABLE
    wide = cpu_features().avx512_vnni
    block_bytes = BLOCK_BYTES[kind]

    def codegen(context, builder, signature, args):
        row, xqa, xda, xba = (
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:4], args[:4], strict=True)
        )
        b0 = args[4]
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        n = builder.extract_value(xqa.shape, 1)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        sixteens = builder.udiv(n, ir.Constant(_I64, 16))
        xq_rows, xd_rows, xb_rows = [], [], []
        for r in range(rows):
            b = builder.add(b0, ir.Constant(_I64, r))
            xq_rows.append(builder.gep(builder.bitcast(xqa.data, _I8.as_pointer()), [builder.mul(b, n)]))
            xd_rows.append(builder.gep(builder.bitcast(xda.data, _F32.as_pointer()), [builder.mul(b, n_sb)]))
            xb_rows.append(
                builder.gep(builder.bitcast(xba.data, _I32.as_pointer()), [builder.mul(b, sixteens)])
            )
        # the float accumulators: lane r = row r's acc, lane rows + r its accm (Q4_K, Q5_K)
        sums_per_row = 1 if kind == "q6_k" else 2
        width = 1
        while width < sums_per_row * rows:
            width *= 2
        fty = ir.VectorType(_F32, width)
        zero = ir.Constant(fty, None)

        entry = builder.block
        loop = builder.append_basic_block("superblocks")
        done = builder.append_basic_block("reduce")
        builder.cbranch(builder.icmp_unsigned(">", n_sb, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        sb = builder.phi(_I64)
        acc_phi = builder.phi(fty)
        block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, block_bytes))])
        prefetch(builder, block, PREFETCH_BYTES, lines=(block_bytes + 63) // 64)
        sc, mn, d, dmin = _superblock_scales(builder, kind, block)
        if kind == "q6_k":  # signed scales: `small_products` wants their high halves clear
            q6_offsets = low_halves(builder, path, builder.mul(sc, const_vec(_V16I32, -32)))
            sc = low_halves(builder, path, sc)
        else:
            min_factors = _shuffle(builder, mn, [i // 2 for i in range(16)])
        sc_pairs = pair_scales(builder, path, sc)  # once per super-block, each chunk shuffles its lanes
        sums = [ir.Constant(_V16I32, None)] * rows
        for chunk in range(4):
            quants = _chunk_quants(builder, kind, block, chunk)
            # the scale of each lane of four weights: per 32 weights (Q4_K, Q5_K) or per 16 (Q6_K)
            lanes_of = (
                [4 * chunk + i // 4 for i in range(16)]
                if kind == "q6_k"
                else [2 * chunk + i // 8 for i in range(16)]
            )
            lane_scales = _shuffle(builder, sc_pairs, lanes_of)
            byte0 = builder.add(builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk))
            for r in range(rows):
                act = load_vec(builder, builder.gep(xq_rows[r], [byte0]), _V64I8)
                sums[r] = add_scaled_lanes(builder, path, wide, sums[r], quants, act, lane_scales)
        sixteen0 = builder.mul(sb, ir.Constant(_I64, 16))
        totals, mins, scales = [], [], ir.Constant(fty, None)
        for r in range(rows):
            xd = builder.load(builder.gep(xd_rows[r], [sb]))
            xb = load_vec(builder, builder.gep(xb_rows[r], [sixteen0]), _V16I32)
            total = sums[r]
            if kind == "q6_k":  # (q - 32) * sc: minus 32 * sc * (sum of the 16 xq), all exact integers
                total = small_products(builder, path, wide, total, xb, q6_offsets)
            totals.append(total)
            scales = builder.insert_element(scales, builder.fmul(d, xd), ir.Constant(_I32, r))
            if kind != "q6_k":  # sum_j m[j] * xb32[j]: each 16-lane run of xb against its sub-block's min
                mins.append(small_products(builder, path, wide, ir.Constant(_V16I32, None), xb, min_factors))
                scales = builder.insert_element(scales, builder.fmul(dmin, xd), ir.Constant(_I32, rows + r))
        # A and M of every row, each summed over its 16 lanes (exact), in one transposing tree
        exact = sum_int_lanes_of(builder, totals + mins)  # padded to `width` lanes with zeros
        new_acc = fma(builder, scales, builder.sitofp(exact, fty), acc_phi)
        following = builder.add(sb, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_sb), loop, done)
        sb.add_incoming(ir.Constant(_I64, 0), entry)
        sb.add_incoming(following, loop_end)
        acc_phi.add_incoming(zero, entry)
        acc_phi.add_incoming(new_acc, loop_end)

        builder.position_at_end(done)
        final = builder.phi(fty)
        final.add_incoming(zero, entry)
        final.add_incoming(new_acc, loop_end)
        results = []
        for r in range(rows):
            value = builder.extract_element(final, ir.Constant(_I32, r))
            if kind != "q6_k":
                value = builder.fsub(value, builder.extract_element(final, ir.Constant(_I32, rows + r)))
            results.append(value)
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _make(kind: str, rows: int, path: int):
    def typer(typingctx, row, xq, xd, xb, b0):
        arrays = ((row, types.uint8, 1), (xq, types.int8, 2), (xd, types.float32, 2), (xb, types.int32, 2))
        if not (all(is_c_array(a, t, d) for a, t, d in arrays) and isinstance(b0, types.Integer)):
            return None
        signature = types.UniTuple(types.float32, rows)(row, xq, xd, xb, types.int64)
        return signature, _codegen(kind, rows, path)

    typer.__name__ = f"{kind}_i8dot{rows}_{('portable', 'avx2', 'vnni')[path]}"
    typer.__doc__ = f"""(row uint8, xq int8 [B, n], xd float32 [B, n // 256], xb int32 [B, n // 16], b0) ->
    the {rows} int8-activation dot products of the {kind.upper()} row with rows b0.. (the activations:
    activations.quantize_activations_k)."""
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
