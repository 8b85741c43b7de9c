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
with A and M exact int32 sums, whichever instructions compute them: on VNNI and portable 16 lanes wide
(lane l summing weights 4l..4l+3 of each 64-weight chunk; vpmaddubsw, then vpdpwssd against the lanes'
scales, or widening multiplies: `simd_int8.add_scaled_lanes`; the mins and Q6_K's offsets through
`simd_int8.small_products`); on AVX2 8 lanes wide, llama.cpp's dot (`_avx2_superblock`: per 32 weights
one vpmaddubsw and one vpmaddwd against the scale splat by one vpshufb, the mins and offsets against the
activation sums packed to int16).
The float part is fixed: the lanes of A (and M) are added into one exact int32 per super-block,
then acc = fma(d * xd, float(A), acc) and (Q4_K, Q5_K) accm = fma(dmin * xd, float(M), accm), scalars,
super-block after super-block; the result is acc - accm. That per-super-block form is also what the
tiled kernels of kquants_tiles_int8.py compute for each (weight row, activation row), with activation
rows in the lanes, so a row's bits are the same whichever of the two kernels a call takes.

The `*_pair` intrinsics (`_make_pair`) run two weight rows against one activation row in one loop
(decode): the same integers and float steps for each (weight row, activation row), in lanes of one vector.
That order is written here, fixed for every row and call, and nothing in it depends on B or on the other
rows of a call: a row's result is bit-identical alone, in any batch, as a verify row, and on every path
(the integer lanes are the same numbers). The cache entries of kquants_int8.py hold this file's code;
cache_freshness.py drops them when it changes.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .features import cpu_features
from .simd import (
    call_intrinsic,
    fma,
    is_c_array,
    load_vec,
    prefetch_weight_rows,
    sum_int_lanes_of,
)
from .simd_int8 import (
    AVX2,
    PATH_NAMES,
    PORTABLE,
    add_scaled_lanes,
    available_paths,
    concat,
    const_vec,
    half,
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
_V16I8 = ir.VectorType(_I8, 16)
_V4I32 = ir.VectorType(_I32, 4)
_V8I32 = ir.VectorType(_I32, 8)
_V16I16 = ir.VectorType(ir.IntType(16), 16)

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


def _block_halves(builder: ir.IRBuilder, kind: str, block: ir.Value) -> tuple[ir.Value, ir.Value | None]:
    """(d, dmin) of the super-block at `block` as floats (Q6_K: d, None). The halves are loaded into the
    low bits of a zeroed vector and widened there: inserted into an undefined register, LLVM picked the
    float accumulator's, which chained every super-block's conversion behind the previous fma."""
    if kind == "q6_k":
        ptr = builder.bitcast(builder.gep(block, [ir.Constant(_I64, 208)]), ir.IntType(16).as_pointer())
        bits = builder.zext(builder.load(ptr, align=1), _I32)
    else:
        bits = builder.load(builder.bitcast(block, _I32.as_pointer()), align=1)
    vec = builder.insert_element(ir.Constant(_V4I32, None), bits, ir.Constant(_I32, 0))
    halves = builder.shuffle_vector(
        builder.bitcast(vec, ir.VectorType(ir.HalfType(), 8)),
        ir.Constant(ir.VectorType(ir.HalfType(), 8), None),
        ir.Constant(ir.VectorType(_I32, 2), [0, 1]),
    )
    floats = builder.fpext(halves, ir.VectorType(_F32, 2))
    d = builder.extract_element(floats, ir.Constant(_I32, 0))
    if kind == "q6_k":
        return d, None
    return d, builder.extract_element(floats, ir.Constant(_I32, 1))


def _superblock_scales(builder: ir.IRBuilder, kind: str, block: ir.Value, second: ir.Value | None = None):
    """(sc, m) of the super-block at `block`: Q4_K, Q5_K: the 8 six-bit sub-block scales and mins as
    <8 x i32>, unpacked from the 12 scale bytes; Q6_K: the 16 signed scales as <16 x i32>, None.
    With a `second` super-block (Q4_K, Q5_K: the other row of a pair) both rows' in one <16 x i32> each,
    lanes 0-7 the first row's and 8-15 the second's: one 512-bit pass instead of two 256-bit ones, the
    same integers (a decode pair's loop spent a third of its vector instructions on the scales)."""
    if kind == "q6_k":
        scales = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 192)]), ir.VectorType(_I8, 16))
        return builder.sext(scales, _V16I32), None

    def scale_bytes(at: ir.Value) -> ir.Value:  # the 12 scale bytes s0..s11 (and 4 nibble bytes, unused)
        raw_bytes = load_vec(builder, builder.gep(at, [ir.Constant(_I64, 4)]), ir.VectorType(_I8, 16))
        return builder.zext(raw_bytes, _V16I32)

    raws = [scale_bytes(at) for at in (block, second) if at is not None]
    rows = len(raws)
    vty = ir.VectorType(_I32, 8 * rows)

    def pick(indices: list[int]) -> ir.Value:  # the same byte indices in each row's lanes
        every = [16 * r + i for r in range(rows) for i in indices]
        return builder.shuffle_vector(raws[0], raws[-1], ir.Constant(ir.VectorType(_I32, len(every)), every))

    def consts(values: list[int]) -> ir.Constant:
        return ir.Constant(vty, values * rows)

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
    return sc, mn


def _lanes_superblock(
    builder, kind: str, path: int, wide: bool, block, rows: int, xq_rows, xb_rows, sb, joint=None, lane0=0
):
    """Portable and VNNI: per activation row the exact A (Q6_K: A - 32 * sum_k sc[k] xb[k]) and M of one
    super-block as <16 x i32> lanes to be summed, through `add_scaled_lanes` and `small_products`.
    `joint`: (sc, m) of a weight pair from `_superblock_scales`, this block's from lane `lane0`."""
    sc, mn = joint if joint is not None else _superblock_scales(builder, kind, block)
    if kind == "q6_k":  # signed scales: `small_products` wants their high halves clear
        q6_offsets = low_halves(builder, path, builder.mul(sc, const_vec(_V16I32, -32)))
        sc = low_halves(builder, path, sc)
    else:
        min_factors = _shuffle(builder, mn, [lane0 + i // 2 for i in range(16)])
    sc_pairs = pair_scales(builder, path, sc)  # once per super-block, each chunk shuffles its lanes
    sums = [ir.Constant(_V16I32, None)] * rows
    for chunk in range(4):
        quants = _chunk_quants(builder, kind, block, chunk)
        # the scale of each lane of four weights: per 32 weights (Q4_K, Q5_K) or per 16 (Q6_K)
        lanes_of = (
            [4 * chunk + i // 4 for i in range(16)]
            if kind == "q6_k"
            else [lane0 + 2 * chunk + i // 8 for i in range(16)]
        )
        lane_scales = _shuffle(builder, sc_pairs, lanes_of)
        byte0 = builder.add(builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk))
        for r in range(rows):
            act = load_vec(builder, builder.gep(xq_rows[r], [byte0]), _V64I8)
            sums[r] = add_scaled_lanes(builder, path, wide, sums[r], quants, act, lane_scales)
    sixteen0 = builder.mul(sb, ir.Constant(_I64, 16))
    totals, mins = [], []
    for r in range(rows):
        xb = load_vec(builder, builder.gep(xb_rows[r], [sixteen0]), _V16I32)
        if kind == "q6_k":  # (q - 32) * sc: minus 32 * sc * (sum of the 16 xq), all exact integers
            totals.append(small_products(builder, path, wide, sums[r], xb, q6_offsets))
        else:  # sum_j m[j] * xb32[j]: each 16-lane run of xb against its sub-block's min
            totals.append(sums[r])
            mins.append(small_products(builder, path, wide, ir.Constant(_V16I32, None), xb, min_factors))
    return totals, mins


def _vpshufb(builder: ir.IRBuilder, vec: ir.Value, mask: list[int]) -> ir.Value:
    """vpshufb of a 256-bit vector by constant byte indices (each inside its own 128-bit half), as inline
    assembly: LLVM turns the intrinsic with a constant mask back into a generic shuffle and lowers a
    splat of lane j > 0 to a move to lane 0 and a broadcast, two µops on the shuffle ports."""
    shuffle = ir.InlineAsm(ir.FunctionType(_V32I8, [_V32I8, _V32I8]), "vpshufb $2, $1, $0", "=x,x,xm")
    out = builder.call(shuffle, [builder.bitcast(vec, _V32I8), ir.Constant(_V32I8, mask)])
    return builder.bitcast(out, vec.type)


def _pmaddwd(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """<8 x i32>: the sums of each two int16 products of a and b (<16 x i16>), vpmaddwd."""
    return call_intrinsic(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [a, b])


def _packed_sums(builder: ir.IRBuilder, xb_row: ir.Value, sixteen0: ir.Value) -> ir.Value:
    """A super-block's 16 activation sums xb (int32, each |xb| <= 16 * 127 < 2**15) as <16 x i16> in
    vpackssdw's order: xb 0-3, 8-11 in the low 128 bits, 4-7, 12-15 in the high ones (exact)."""
    lo, hi = (
        load_vec(builder, builder.gep(xb_row, [builder.add(sixteen0, ir.Constant(_I64, 8 * h))]), _V8I32)
        for h in (0, 1)
    )
    return call_intrinsic(builder, "llvm.x86.avx2.packssdw", _V16I16, [lo, hi])


def _avx2_scales(builder: ir.IRBuilder, kind: str, block: ir.Value) -> tuple[list, ir.Value]:
    """A super-block's scales for the AVX2 kernel: the int16 splat for each of the eight 32-weight
    halves of its chunks (<16 x i16>), and the factors of `_packed_sums`, in its order.
    Q4_K, Q5_K: the splats are sc[j], the factors [m0 m0 m1 m1 m4 m4 m5 m5 | m2 m2 m3 m3 m6 m6 m7 m7];
    the unsigned scale and min bytes are unpacked once into one 128-bit vector and copied to both
    halves, and each splat or factor vector is one vpshufb of it (a zero byte above each). Q6_K: the
    splat of half t is sc[2t] in the low 128 bits and sc[2t + 1] in the high ones (its two 16-weight
    groups), picked by vpshufb from the signed scales widened once as [sc0 sc2 .. sc14 | sc1 .. sc15];
    the factors are [sc0..sc3 sc8..sc11 | sc4..sc7 sc12..sc15]."""
    v16 = ir.VectorType(_I32, 16)

    def word_mask(low: list[int], high: list[int], wide_bytes: bool) -> list[int]:
        # bytes of int16 lanes: (byte j, 0) from byte sources, (2j, 2j + 1) from int16 ones
        if wide_bytes:
            return [2 * w + b for w in low for b in (0, 1)] + [2 * w + b for w in high for b in (0, 1)]
        return [v for w in low for v in (w, 0x80)] + [v for w in high for v in (w, 0x80)]

    if kind == "q6_k":
        raw = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 192)]), _V16I8)
        even_odd = builder.shuffle_vector(raw, raw, ir.Constant(v16, [*range(0, 16, 2), *range(1, 16, 2)]))
        by_sums = builder.shuffle_vector(
            raw, raw, ir.Constant(v16, [0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15])
        )
        words = builder.sext(even_odd, _V16I16)
        splats = [_vpshufb(builder, words, word_mask([t] * 8, [t] * 8, True)) for t in range(8)]
        return splats, builder.sext(by_sums, _V16I16)
    # the 12 scale bytes as four int32 u0..u3 (u3: four quant bytes, unused); llama.cpp's unpack in
    # vector lanes: [sc0-3, sc4-7, m0-3, m4-7] = [u0 & 63s, (u2 & 15s) | ((u0 >> 6) & 3s) << 4,
    # u1 & 63s, ((u2 >> 4) & 15s) | ((u1 >> 6) & 3s) << 4], bytes in parallel
    u = load_vec(builder, builder.gep(block, [ir.Constant(_I64, 4)]), _V4I32)

    def pick(indices: list[int]) -> ir.Value:
        return builder.shuffle_vector(u, u, ir.Constant(_V4I32, indices))

    def consts(values: list[int]) -> ir.Constant:
        return ir.Constant(_V4I32, values)

    low_bits = builder.and_(
        builder.lshr(pick([0, 2, 1, 2]), consts([0, 0, 0, 4])),
        consts([0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F]),
    )
    top_bits = builder.and_(builder.lshr(pick([0, 0, 1, 1]), consts([2] * 4)), consts([0, 0x30303030] * 2))
    unpacked = builder.or_(low_bits, top_bits)  # bytes sc0..sc7, m0..m7
    both = builder.bitcast(
        builder.shuffle_vector(unpacked, unpacked, ir.Constant(ir.VectorType(_I32, 8), [*range(4)] * 2)),
        _V32I8,
    )
    splats = [
        builder.bitcast(_vpshufb(builder, both, word_mask([j] * 8, [j] * 8, False)), _V16I16)
        for j in range(8)
    ]
    mins = _vpshufb(
        builder, both, word_mask([8, 8, 9, 9, 12, 12, 13, 13], [10, 10, 11, 11, 14, 14, 15, 15], False)
    )
    return splats, builder.bitcast(mins, _V16I16)


def _avx2_superblock(builder, kind: str, block, rows: int, xq_rows, xb_rows, sb) -> tuple[list, list]:
    """AVX2: per activation row the exact A (Q6_K: A - 32 * sum_k sc[k] xb[k]) and M of one super-block,
    each as <8 x i32> lanes to be summed. Per 32 weights and row one vpmaddubsw and one vpmaddwd against
    the sub-block's scale splat by one vpshufb (llama.cpp's AVX2 K-quant dot), into one 8-lane
    accumulator; the sums' term is one vpackssdw and one vpmaddwd per row. The same integers as
    `add_scaled_lanes`, so the same bits."""
    splats, factors = _avx2_scales(builder, kind, block)
    sums = [ir.Constant(_V8I32, None)] * rows
    for chunk in range(4):
        quants = _chunk_quants(builder, kind, block, chunk)
        for h in (0, 1):
            sub = 2 * chunk + h  # 32 weights: Q4_K/Q5_K sub-block `sub`, Q6_K groups 2 * sub, 2 * sub + 1
            weights = half(builder, quants, h)
            byte0 = builder.add(
                builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk + 32 * h)
            )
            for r in range(rows):
                act = load_vec(builder, builder.gep(xq_rows[r], [byte0]), _V32I8)
                pairs = call_intrinsic(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [weights, act])
                sums[r] = builder.add(sums[r], _pmaddwd(builder, pairs, splats[sub]))
    sixteen0 = builder.mul(sb, ir.Constant(_I64, 16))
    terms = [_pmaddwd(builder, _packed_sums(builder, xb_rows[r], sixteen0), factors) for r in range(rows)]
    if kind == "q6_k":  # (q - 32) * sc: minus 32 * (sc . xb), exact
        return [
            builder.sub(s, builder.shl(t, const_vec(_V8I32, 5))) for s, t in zip(sums, terms, strict=True)
        ], []
    return sums, terms


def _codegen(kind: str, rows: int, path: int, weight_rows: int = 1):
    if path not in available_paths():
        path = PORTABLE
    wide = cpu_features().avx512_vnni
    block_bytes = BLOCK_BYTES[kind]
    pairs = weight_rows * rows  # (weight row w, activation row r) -> lane w * rows + r

    def codegen(context, builder, signature, args):
        weights = [
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:weight_rows], args[:weight_rows], strict=True)
        ]
        xqa, xda, xba = (
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[weight_rows:-1], args[weight_rows:-1], strict=True)
        )
        b0 = args[-1]
        row_ptrs = [builder.bitcast(w.data, _I8.as_pointer()) for w in weights]
        n = builder.extract_value(xqa.shape, 1)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        sixteens = builder.udiv(n, ir.Constant(_I64, 16))
        # two weight rows (o, o + 1 of one matrix): the prefetch reads ahead in rows o + 2 and o + 3
        row_bytes = builder.extract_value(weights[-1].shape, 0) if weight_rows > 1 else None
        xq_rows, xd_rows, xb_rows = [], [], []
        for r in range(rows):
            b = builder.add(b0, ir.Constant(_I64, r))
            xq_rows.append(builder.gep(builder.bitcast(xqa.data, _I8.as_pointer()), [builder.mul(b, n)]))
            xd_rows.append(builder.gep(builder.bitcast(xda.data, _F32.as_pointer()), [builder.mul(b, n_sb)]))
            xb_rows.append(
                builder.gep(builder.bitcast(xba.data, _I32.as_pointer()), [builder.mul(b, sixteens)])
            )
        # the float accumulators: lane k = pair k's acc, lane pairs + k its accm (Q4_K, Q5_K)
        sums_per_pair = 1 if kind == "q6_k" else 2
        width = 1
        while width < sums_per_pair * pairs:
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
        offset = builder.mul(sb, ir.Constant(_I64, block_bytes))
        blocks = [builder.gep(ptr, [offset]) for ptr in row_ptrs]
        prefetch_weight_rows(builder, blocks, row_bytes, lines=(block_bytes + 63) // 64, next_group=True)
        totals, mins, halves = [], [], []
        joint = None
        if weight_rows == 2 and path != AVX2 and kind != "q6_k":  # both rows' scales in one pass
            joint = _superblock_scales(builder, kind, blocks[0], blocks[1])
        for w, block in enumerate(blocks):
            if path == AVX2:
                t, m = _avx2_superblock(builder, kind, block, rows, xq_rows, xb_rows, sb)
            else:
                t, m = _lanes_superblock(
                    builder, kind, path, wide, block, rows, xq_rows, xb_rows, sb, joint, 8 * w if joint else 0
                )
            totals += t
            mins += m
            halves.append(_block_halves(builder, kind, block))
        # lane k = (w, r): d_w * xd_r; lane pairs + k: dmin_w * xd_r (one vector multiply)
        xd_of = [builder.load(builder.gep(xd_rows[r], [sb])) for r in range(rows)]
        xd = ir.Constant(fty, None)
        factors = ir.Constant(fty, None)
        for lane in range(sums_per_pair * pairs):
            w, r = divmod(lane % pairs, rows)
            xd = builder.insert_element(xd, xd_of[r], ir.Constant(_I32, lane))
            value = halves[w][0] if lane < pairs else halves[w][1]
            factors = builder.insert_element(factors, value, ir.Constant(_I32, lane))
        scales = builder.fmul(factors, xd)
        lanes = totals + mins
        if len(lanes) <= 4 and lanes[0].type.count == 8:  # AVX2: fold 8 lanes to 4 (xmm work after)
            lanes = [
                builder.add(_shuffle(builder, v, [0, 1, 2, 3]), _shuffle(builder, v, [4, 5, 6, 7]))
                for v in lanes
            ]
        # A and M of every pair, each summed over its lanes (exact), in one transposing tree
        exact = sum_int_lanes_of(builder, lanes)  # padded to `width` lanes with zeros
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
        for k in range(pairs):
            value = builder.extract_element(final, ir.Constant(_I32, k))
            if kind != "q6_k":
                value = builder.fsub(value, builder.extract_element(final, ir.Constant(_I32, pairs + k)))
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

    typer.__name__ = f"{kind}_i8dot{rows}_{PATH_NAMES[path]}"
    typer.__doc__ = f"""(row uint8, xq int8 [B, n], xd float32 [B, n // 256], xb int32 [B, n // 16], b0) ->
    the {rows} int8-activation dot products of the {kind.upper()} row with rows b0.. (the activations:
    activations.quantize_activations_k)."""
    return intrinsic(typer)


def _make_pair(kind: str, path: int):
    def typer(typingctx, row0, row1, xq, xd, xb, b0):
        arrays = (
            (row0, types.uint8, 1),
            (row1, types.uint8, 1),
            (xq, types.int8, 2),
            (xd, types.float32, 2),
            (xb, types.int32, 2),
        )
        if not (all(is_c_array(a, t, d) for a, t, d in arrays) and isinstance(b0, types.Integer)):
            return None
        signature = types.UniTuple(types.float32, 2)(row0, row1, xq, xd, xb, types.int64)
        return signature, _codegen(kind, 1, path, weight_rows=2)

    typer.__name__ = f"{kind}_i8pair_{PATH_NAMES[path]}"
    typer.__doc__ = f"""(row0, row1 uint8: weight rows o and o + 1 of one C-ordered matrix, xq, xd, xb, b) ->
    the int8-activation dot products of both {kind.upper()} rows with activation row b, each computed
    exactly as the one-row kernel computes it (decode: two rows share a loop and its reduction)."""
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
q4_k_portable_pair, q4_k_avx2_pair, q4_k_vnni_pair = (_make_pair("q4_k", p) for p in (0, 1, 2))
q5_k_portable_pair, q5_k_avx2_pair, q5_k_vnni_pair = (_make_pair("q5_k", p) for p in (0, 1, 2))
q6_k_portable_pair, q6_k_avx2_pair, q6_k_vnni_pair = (_make_pair("q6_k", p) for p in (0, 1, 2))
