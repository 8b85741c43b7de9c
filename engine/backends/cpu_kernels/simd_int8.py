"""Int8-activation row dot products on raw legacy blocks, as LLVM vector IR (numba @intrinsic).

Blocks are taken in pairs (64 weights), each held in two halves: A, weights 0-15 of both blocks side by
side, and B, weights 16-31 (a nibble block's low and high nibbles, with no shuffle). The activations
are laid out to match once per call (`legacy_int8.int8_activations`). Per pair and activation row come
eight exact int32 lanes, lanes 0-3 for the first block and 4-7 for the second, lane k of a block = its
weight bytes 4k..4k+3 times the activations there plus the same of bytes 16 + 4k..16 + 4k + 3, computed
by one of three paths:
    vnni:     two vpdpbusd (unsigned bytes x signed bytes), A then B, 256-bit (AVX-512 VNNI or AVX-VNNI)
    avx2:     vpmaddubsw of A and of B, one vpaddw (the nibble types' pair sums stay below 2**15 even
              added) and one vpmaddwd; Q8_0 through vpsignb as llama.cpp does, A and B apart
    portable: widen to int32, multiply, add in fours (LLVM picks the instructions)
Everything about the weights is done once per pair for all the activation rows of a call (the few-row
case that verifying drafts needs): the nibble unpack, the block scales, and on vnni the correction that
signed weights need. There Q4_0, Q8_0 and Q5_0 run with signed weights (q - 8, q, q - 16) against
unsigned activations xu = xq + 128, the accumulator starting at -128 * (each lane's weight sum); Q4_1's
and Q5_1's quants are unsigned already and meet xq directly (at most 2 * 31 * 127 a vpmaddubsw pair);
avx2 multiplies Q4_0's and Q5_0's stored quants and takes offset * (the lane's xq sum) off. So a row
costs, per pair, two vpdpbusd (or three AVX2 multiplies), one conversion, one multiply and one fma (Q4_1,
Q5_1: one more fma).

Integer sums are exact, so the three paths give the same lanes and the same float results bit for bit.
The float part is fixed: per pair acc = fma(d * xs, float(lanes), acc) on 8 lanes (Q4_1, Q5_1 then acc =
fma(m, xs_sum, acc), xs_sum = xs * (the block's xq sum) in lane 0 and zero in lanes 1-3, which leaves
those lanes as they were: an accumulator that starts at +0 is never -0); d * xs is exact in float32 (two
halves). The even blocks go to lanes 0-3, the odd ones to 4-7, an odd last block to lanes 0-3; the
eight lanes are then summed by a fixed tree. The paired dots (PAIR_DOTS, one activation row: decode) run
two weight rows in one loop with each (weight row, row)'s own lanes and chains, the same operations.
Nothing depends on B or on the other rows of a call, so a
row's result is bit-identical alone or in any batch; a tiled kernel (one activation row per vector
lane) can give the same bits by keeping each of the eight lanes in a float chain of its own. A path
the host lacks compiles as portable. The drivers' cache entries hold this file's code:
cache_freshness.py drops them when it changes.
"""

from __future__ import annotations

import llvmlite.binding as llvm
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .features import cpu_features
from .simd import fma, load_vec, prefetch_weight_rows, sum_lanes

# numba's JIT initialises no assembly parser, and a module holding `_dpwssd`'s inline assembly can be
# emitted without `_dpwssd` running in this process (a caller compiled anew around cached callees)
llvm.initialize_native_asmparser()

PORTABLE, AVX2, VNNI = 0, 1, 2
"""int8 paths (the `path` argument of the int8 kernels)."""

PATH_NAMES = ("portable", "avx2", "vnni")
"""The name of each int8 path (PORTABLE, AVX2, VNNI), in the kernels' names."""

ROW_COUNTS = (1, 2, 3, 4, 5, 6, 7, 8)
"""Activation rows per intrinsic call: 8 rows' accumulators and the shared weight pair fit in the 32
vector registers of AVX-512; AVX2's 16 spill a few values a pair (Q4_0: 26 stack accesses among 144
instructions), still 4 cycles a pair and row on Zen 3 (llvm-mca), against 5.7 for one row alone."""

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V16I8 = ir.VectorType(_I8, 16)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V16I32 = ir.VectorType(_I32, 16)
_V8F = ir.VectorType(_F32, 8)

# block bytes, offset of the quants, has a min (Q4_1), nibbles (True) or int8 (False)
_LAYOUTS = {
    "q4_0": (18, 2, False, True),
    "q4_1": (20, 4, True, True),
    "q8_0": (34, 2, False, False),
    "q5_0": (22, 6, False, True),  # d f16, qh u32 (bit j: the fifth bit of weight j), qs[16]
    "q5_1": (24, 8, True, True),  # d f16, m f16, qh u32, qs[16]
}
_FIFTH_BITS = {"q5_0": 2, "q5_1": 4}
"""Where the 5-bit types keep qh (bit j: the fifth bit of weight j)."""
_OFFSETS = {"q4_0": 8, "q5_0": 16}
"""What the signed types with unsigned stored quants subtract: weight = d * (q - offset)."""


def available_paths() -> tuple[int, ...]:
    """The int8 paths this host can run, best last."""
    features = cpu_features()
    paths = [PORTABLE]
    if features.avx2:
        paths.append(AVX2)
    if features.avx512_vnni or features.avx_vnni:
        paths.append(VNNI)
    return tuple(paths)


def const_vec(vty: ir.VectorType, value: int) -> ir.Constant:
    """A vector constant with every lane = value."""
    return ir.Constant(vty, [value] * vty.count)


def _shuffle(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, indices: list[int]) -> ir.Value:
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(_I32, len(indices)), indices))


def concat(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """The lanes of a, then those of b (same vector type)."""
    return _shuffle(builder, a, b, list(range(2 * a.type.count)))


def half(builder: ir.IRBuilder, vec: ir.Value, which: int) -> ir.Value:
    """The low (0) or high (1) half of a vector's lanes."""
    count = vec.type.count // 2
    return _shuffle(builder, vec, vec, list(range(which * count, (which + 1) * count)))


def _intrinsic_call(builder, name, ret, args):
    module = builder.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _vpdpbusd(builder: ir.IRBuilder, acc: ir.Value, unsigned: ir.Value, signed: ir.Value, wide: bool):
    """acc + lane sums of unsigned x signed bytes; 16 lanes in one 512-bit instruction when `wide`
    (AVX-512 VNNI), else in 256-bit halves (also AVX-VNNI). 8- and 4-lane inputs take one 256- or
    128-bit call."""
    if acc.type.count == 4:
        return _intrinsic_call(
            builder, "llvm.x86.avx512.vpdpbusd.128", ir.VectorType(_I32, 4), [acc, unsigned, signed]
        )
    if acc.type.count == 8:
        return _intrinsic_call(builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [acc, unsigned, signed])
    if wide:
        return _intrinsic_call(builder, "llvm.x86.avx512.vpdpbusd.512", _V16I32, [acc, unsigned, signed])
    halves = [
        _intrinsic_call(
            builder,
            "llvm.x86.avx512.vpdpbusd.256",
            _V8I32,
            [half(builder, acc, h), half(builder, unsigned, h), half(builder, signed, h)],
        )
        for h in (0, 1)
    ]
    return concat(builder, halves[0], halves[1])


def _portable_lanes(builder, kind: str, weights, xv) -> ir.Value:
    """Widen to int32, multiply, sum each four (nibbles unsigned, Q4_0 minus 8; Q8_0 signed)."""
    lanes_count = weights.type.count // 4
    wide = ir.VectorType(_I32, weights.type.count)
    if kind == "q8_0":
        w32 = builder.sext(weights, wide)
    else:
        w32 = builder.zext(weights, wide)
        if kind in _OFFSETS:
            w32 = builder.sub(w32, const_vec(wide, _OFFSETS[kind]))
    prod = builder.mul(w32, builder.sext(xv, wide))
    lanes = None
    for t in range(4):
        part = _shuffle(builder, prod, prod, [4 * j + t for j in range(lanes_count)])
        lanes = part if lanes is None else builder.add(lanes, part)
    return lanes


def scaled_lanes(
    builder: ir.IRBuilder, path: int, wide: bool, weights: ir.Value, act: ir.Value, scales: ir.Value
) -> ir.Value:
    """Exact int32 lane sums of unsigned weight bytes times signed activation bytes (<64 x i8> each),
    each lane (bytes 4l..4l+3) times its integer scale (<16 x i32>, |scale| < 2**15), on `path` (VNNI with
    512-bit vectors when `wide`): vpdpbusd then a multiply; AVX2 vpmaddubsw, then vpmaddwd against the
    scales as int16 pairs (llama.cpp's K-quant dot); portable widening multiplies. The K-quant kernels'
    integer part (kquants_simd_int8.py)."""
    if path == AVX2:
        parts = []
        for h in (0, 1):
            pairs = _intrinsic_call(
                builder,
                "llvm.x86.avx2.pmadd.ub.sw",
                _V16I16,
                [half(builder, weights, h), half(builder, act, h)],
            )
            pair_scales = builder.trunc(
                _shuffle(builder, scales, scales, [8 * h + p // 2 for p in range(16)]), _V16I16
            )
            parts.append(_intrinsic_call(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, pair_scales]))
        return concat(builder, parts[0], parts[1])
    if path == VNNI:
        lanes = _vpdpbusd(builder, ir.Constant(_V16I32, None), weights, act, wide)
    else:
        lanes = _portable_lanes(builder, "q4_1", weights, act)
    return builder.mul(lanes, scales)


def low_halves(builder: ir.IRBuilder, path: int, values: ir.Value) -> ir.Value:
    """int32 lanes with their high 16 bits cleared (unchanged on the portable path, which multiplies
    int32s): the form `small_products` and `add_scaled_lanes` want for the factor whose values are all in
    [-2**15, 2**15)."""
    if path == PORTABLE:
        return values
    return builder.and_(values, const_vec(values.type, 0xFFFF))


def _dpwssd(builder: ir.IRBuilder, wide: bool, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """acc + the int16-pair dot products of a and b (all <16 x i32>, a and b read as 32 int16): vpdpwssd,
    one 512-bit instruction when `wide` (AVX-512 VNNI), else two 256-bit ones (also AVX-VNNI). The wide
    one is inline assembly: LLVM rewrites the vpdpwssd intrinsic into vpmaddwd + vpaddd, one more µop
    on the two ports that run 512-bit instructions, which the multi-row kernels are bound by."""
    if wide:
        dpwssd = ir.InlineAsm(ir.FunctionType(_V16I32, [_V16I32] * 3), "vpdpwssd $3, $2, $0", "=v,0,v,v")
        return builder.call(dpwssd, [acc, a, b])
    parts = [
        _intrinsic_call(
            builder,
            "llvm.x86.avx512.vpdpwssd.256",
            _V8I32,
            [
                half(builder, acc, h),
                builder.bitcast(half(builder, a, h), _V16I16),
                builder.bitcast(half(builder, b, h), _V16I16),
            ],
        )
        for h in (0, 1)
    ]
    return concat(builder, parts[0], parts[1])


def small_products(
    builder: ir.IRBuilder, path: int, wide: bool, acc: ir.Value, values: ir.Value, factors: ir.Value
) -> ir.Value:
    """acc + values * factors on <16 x i32>, exact, when every value and factor is in [-2**15, 2**15)
    and `factors` went through `low_halves`: then an int32 lane read as two int16 is (its value, its sign
    bits) against (factor, 0), so one vpdpwssd (VNNI) or vpmaddwd (AVX2) gives the product, where a 32-bit
    multiply costs two µops and twice the latency. Portable: a multiply."""
    if path == PORTABLE:
        return builder.add(acc, builder.mul(values, factors))
    if path == VNNI:
        return _dpwssd(builder, wide, acc, values, factors)
    parts = []
    for h in (0, 1):
        a, v, f = (half(builder, x, h) for x in (acc, values, factors))
        prod = _intrinsic_call(
            builder,
            "llvm.x86.avx2.pmadd.wd",
            _V8I32,
            [builder.bitcast(v, _V16I16), builder.bitcast(f, _V16I16)],
        )
        parts.append(builder.add(a, prod))
    return concat(builder, parts[0], parts[1])


def pair_scales(builder: ir.IRBuilder, path: int, scales: ir.Value) -> ir.Value:
    """Integer scales (<16 x i32>, each in [-2**15, 2**15), through `low_halves` when negative ones occur)
    in the form `add_scaled_lanes` takes on `path`: on VNNI each scale in both int16 halves of its lane
    (what vpdpwssd multiplies two pairs by); elsewhere as they are. Shuffling the result moves whole
    lanes, so a kernel can form it once per super-block and pick each chunk's lanes from it."""
    if path != VNNI:
        return scales
    return builder.or_(scales, builder.shl(scales, const_vec(scales.type, 16)))


def add_scaled_lanes(
    builder: ir.IRBuilder,
    path: int,
    wide: bool,
    acc: ir.Value,
    weights: ir.Value,
    act: ir.Value,
    scales: ir.Value,
) -> ir.Value:
    """acc + `scaled_lanes`, the same integers, `scales` through `pair_scales`. On VNNI two instructions
    per row: vpmaddubsw (pairs of weight x activation bytes, |pair| <= 2 * 63 * 128 < 2**15, so never
    saturating) then vpdpwssd of the pairs against the scale repeated in both halves of each lane, which
    adds the two pairs of each lane of four times its scale into acc."""
    if path != VNNI:
        return builder.add(acc, scaled_lanes(builder, path, wide, weights, act, scales))
    if wide:
        pairs = _intrinsic_call(
            builder, "llvm.x86.avx512.pmaddubs.w.512", ir.VectorType(_I16, 32), [weights, act]
        )
    else:
        halves = [
            _intrinsic_call(
                builder,
                "llvm.x86.avx2.pmadd.ub.sw",
                _V16I16,
                [half(builder, weights, h), half(builder, act, h)],
            )
            for h in (0, 1)
        ]
        pairs = concat(builder, halves[0], halves[1])
    return _dpwssd(builder, wide, acc, builder.bitcast(pairs, _V16I32), scales)


def _pmaddubsw(builder: ir.IRBuilder, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    """int16 sums of each two unsigned x signed byte products (vpmaddubsw, 128 or 256 bits)."""
    if unsigned.type.count == 32:
        return _intrinsic_call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [unsigned, signed])
    return _intrinsic_call(
        builder, "llvm.x86.ssse3.pmadd.ub.sw.128", ir.VectorType(_I16, 8), [unsigned, signed]
    )


def _pmaddwd_ones(builder: ir.IRBuilder, pairs: ir.Value) -> ir.Value:
    """int32 sums of each two int16 lanes (vpmaddwd against ones)."""
    count = pairs.type.count
    name = "llvm.x86.avx2.pmadd.wd" if count == 16 else "llvm.x86.sse2.pmadd.wd"
    return _intrinsic_call(builder, name, ir.VectorType(_I32, count // 2), [pairs, const_vec(pairs.type, 1)])


def _psignb(builder: ir.IRBuilder, a: ir.Value, b: ir.Value) -> ir.Value:
    """a with the sign of b applied byte by byte (zero where b is zero)."""
    name = "llvm.x86.avx2.psign.b" if a.type.count == 32 else "llvm.x86.ssse3.psign.b.128"
    return _intrinsic_call(builder, name, a.type, [a, b])


def _halves_avx2(builder: ir.IRBuilder, unsigned_a, signed_a, unsigned_b, signed_b) -> ir.Value:
    """int32 lanes of A's and B's unsigned x signed byte products (vpmaddubsw of each, one vpaddw, one
    vpmaddwd against ones): lane k = bytes 4k..4k+3 of A plus the same of B. Exact while each int16 pair
    sum and the sum of A's and B's stay below 2**15, which the callers' operand ranges guarantee."""
    pairs = builder.add(_pmaddubsw(builder, unsigned_a, signed_a), _pmaddubsw(builder, unsigned_b, signed_b))
    return _pmaddwd_ones(builder, pairs)


def _halves_vnni(builder: ir.IRBuilder, acc, unsigned_a, signed_a, unsigned_b, signed_b) -> ir.Value:
    """acc + A's and then B's unsigned x signed byte products in lanes of four (two vpdpbusd, 256 or 128
    bits): lane k gets bytes 4k..4k+3 of A and of B."""
    return _vpdpbusd(
        builder, _vpdpbusd(builder, acc, unsigned_a, signed_a, False), unsigned_b, signed_b, False
    )


def _fifth_bits(builder: ir.IRBuilder, qh: ir.Value, first: int) -> ir.Value:
    """<16 x i8>: 16 in byte j where bit first + j of a 5-bit block's qh (i32) is set, else 0: qh's
    bytes spread eight times each (vpshufb), each byte tested against its own bit."""
    qh_bytes = builder.bitcast(qh, ir.VectorType(_I8, 4))
    spread = _shuffle(builder, qh_bytes, qh_bytes, [first // 8 + j // 8 for j in range(16)])
    bits = ir.Constant(_V16I8, [1 << (j % 8) for j in range(16)])
    isset = builder.icmp_unsigned("!=", builder.and_(spread, bits), ir.Constant(_V16I8, None))
    return builder.select(isset, const_vec(_V16I8, 16), ir.Constant(_V16I8, None))


def block_quants(builder: ir.IRBuilder, kind: str, start: ir.Value) -> tuple[ir.Value, ir.Value]:
    """A block's stored quants as two <16 x i8>, weights 0-15 and 16-31: a nibble block's low and high
    nibbles as loaded (the 5-bit types' fifth bits or-ed in from qh), Q8_0's bytes as they are."""
    _, quant_offset, _, nibbles = _LAYOUTS[kind]
    quants = builder.gep(start, [ir.Constant(_I64, quant_offset)])
    if not nibbles:
        return load_vec(builder, quants, _V16I8), load_vec(
            builder, builder.gep(quants, [ir.Constant(_I64, 16)]), _V16I8
        )
    q = load_vec(builder, quants, _V16I8)
    low = builder.and_(q, const_vec(_V16I8, 15))
    high = builder.lshr(q, const_vec(_V16I8, 4))
    if kind in _FIFTH_BITS:  # bit j of the block's qh is the fifth bit of its weight j
        qh_at = builder.gep(start, [ir.Constant(_I64, _FIFTH_BITS[kind])])
        qh = builder.load(builder.bitcast(qh_at, _I32.as_pointer()), align=1)
        low = builder.or_(low, _fifth_bits(builder, qh, 0))
        high = builder.or_(high, _fifth_bits(builder, qh, 16))
    return low, high


class _Blocks:
    """The weight side of a block pair (`count` 64 bytes of weights) or of the odd last block (32),
    shared by every activation row of a call: the quants in two halves, A (weights 0-15 of each block)
    and B (weights 16-31), the blocks side by side in each, and the block scales."""

    def __init__(self, builder, kind: str, path: int, blk, count: int, signed: bool):
        block_bytes, _, has_min, _ = _LAYOUTS[kind]
        blocks = count // 32
        starts = [builder.gep(blk, [ir.Constant(_I64, i * block_bytes)]) for i in range(blocks)]
        # the block scales (Q4_1: d and m, one 32-bit load per block) as halves in one vector: [d0, d1,
        # -, -] or, with a min, [d0, m0, d1, m1], each block's inserted whole (Q4_1's d and m split into
        # 16-bit parts cost a shift and two inserts a block); `scale_lanes` widens them
        per_block = 2 if has_min else 1
        bits_ty = ir.IntType(16 * per_block)
        packed_ty = ir.VectorType(bits_ty, 4 // per_block)
        scale_bits = ir.Constant(packed_ty, ir.Undefined)
        for i, start in enumerate(starts):
            bits = builder.load(builder.bitcast(start, bits_ty.as_pointer()), align=1)
            scale_bits = builder.insert_element(scale_bits, bits, ir.Constant(_I32, i))
        self.scales = builder.bitcast(scale_bits, ir.VectorType(ir.HalfType(), 4))
        part_a, part_b = zip(*(block_quants(builder, kind, start) for start in starts), strict=True)
        self.wa = part_a[0] if blocks == 1 else concat(builder, part_a[0], part_a[1])
        self.wb = part_b[0] if blocks == 1 else concat(builder, part_b[0], part_b[1])
        self.init = None
        self.signed = signed
        if signed:  # signed weights against xq + 128: start from -128 * (each lane's weights)
            if kind in _OFFSETS:
                self.wa = builder.sub(self.wa, const_vec(self.wa.type, _OFFSETS[kind]))
                self.wb = builder.sub(self.wb, const_vec(self.wb.type, _OFFSETS[kind]))
            ity = ir.VectorType(_I32, 4 * blocks)
            ones = const_vec(self.wa.type, 1)
            if path == VNNI:
                sums = _halves_vnni(builder, ir.Constant(ity, None), ones, self.wa, ones, self.wb)
            else:
                sums = _halves_avx2(builder, ones, self.wa, ones, self.wb)
            self.init = builder.sub(ir.Constant(ity, None), builder.shl(sums, const_vec(ity, 7)))


def _row_lanes(builder, kind: str, path: int, weights: _Blocks, xa, xb) -> ir.Value:
    """Exact int32 lanes of one activation row (halves xa, xb laid out as the weights' A and B) against
    the blocks: four per block, lane k = bytes 4k..4k+3 of A plus the same of B. Signed weights meet
    xq + 128; otherwise AVX2 multiplies the stored quants of Q4_0 / Q5_0 (the caller takes the offset
    off)."""
    if weights.signed and path == VNNI:
        return _halves_vnni(builder, weights.init, xa, weights.wa, xb, weights.wb)
    if weights.signed:  # AVX2, |q - offset| <= 16 against xq + 128 <= 255: pairs and their sum exact
        return builder.add(_halves_avx2(builder, xa, weights.wa, xb, weights.wb), weights.init)
    if path == VNNI:  # Q4_1: unsigned nibbles against xq
        ity = ir.VectorType(_I32, weights.wa.type.count // 4)
        return _halves_vnni(builder, ir.Constant(ity, None), weights.wa, xa, weights.wb, xb)
    if path == PORTABLE:
        return builder.add(
            _portable_lanes(builder, kind, weights.wa, xa), _portable_lanes(builder, kind, weights.wb, xb)
        )
    if kind == "q8_0":  # |w| x (x signed as w): a pair reaches 2 * 128 * 127, so A and B apart
        halves = [
            _pmaddwd_ones(builder, _pmaddubsw(builder, _psignb(builder, w, w), _psignb(builder, x, w)))
            for w, x in ((weights.wa, xa), (weights.wb, xb))
        ]
        return builder.add(halves[0], halves[1])
    # quants below 32 against |xq| <= 127: each int16 pair sum and the sum of A's and B's stay exact
    return _halves_avx2(builder, weights.wa, xa, weights.wb, xb)


def scale_lanes(builder: ir.IRBuilder, halves: ir.Value, indices: list[int]) -> ir.Value:
    """float32 lanes of the half-precision `halves` picked by `indices`, spread before widening (one byte
    shuffle and one vcvtph2ps): widened first, the spread of a Q4_1 pair's d and m took a move and a
    cross-lane permute each, and a one-row Q4_1 dot ran 12 % slower on Zen 3."""
    ty = ir.VectorType(_F32, len(indices))
    return builder.fpext(_shuffle(builder, halves, halves, indices), ty)


LANES_PER_BLOCK = 4
"""Float lanes a block adds into: lane k gets its int32 lane k (`_row_lanes`)."""


def _codegen(kind: str, rows: int, path: int, weight_rows: int = 1):
    block_bytes, _, has_min, _ = _LAYOUTS[kind]
    if path not in available_paths():
        path = PORTABLE
    # signed weights against xq + 128: VNNI (one instruction a half) and, from two rows, AVX2 for Q4_0
    # and Q5_0, whose lane correction per pair then serves every row; one AVX2 row multiplies their
    # stored (unsigned) quants and takes offset * (the lane's xq sum) off
    signed = (path == VNNI and kind in ("q4_0", "q8_0", "q5_0")) or (
        path == AVX2 and kind in _OFFSETS and rows > 1
    )
    offset_shift = (
        _OFFSETS[kind].bit_length() - 1 if path == AVX2 and kind in _OFFSETS and not signed else None
    )
    per_block = 2 if has_min else 1

    def codegen(context, builder, signature, args):
        arrays = [
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:-1], args[:-1], strict=True)
        ]
        weight_arrays = arrays[:weight_rows]
        xaa, xua, xsuma, xs_suma, xs4a = arrays[weight_rows:]
        b0 = args[-1]
        row_ptrs = [builder.bitcast(w.data, _I8.as_pointer()) for w in weight_arrays]
        # two weight rows (o, o + 1 of one matrix): the prefetch also covers the row after the pair
        row_bytes = builder.extract_value(weight_arrays[-1].shape, 0) if weight_rows > 1 else None
        n = builder.extract_value(xaa.shape, 1)
        n_blocks = builder.udiv(n, ir.Constant(_I64, 32))
        n_lanes = builder.mul(n_blocks, ir.Constant(_I64, LANES_PER_BLOCK))
        act_src = xua if signed else xaa
        acts, xsums, xs_sums, xss = [], [], [], []
        for r in range(rows):
            b = builder.add(b0, ir.Constant(_I64, r))
            acts.append(builder.gep(builder.bitcast(act_src.data, _I8.as_pointer()), [builder.mul(b, n)]))
            lane0 = builder.mul(b, n_lanes)
            xsums.append(builder.gep(builder.bitcast(xsuma.data, _I32.as_pointer()), [lane0]))
            xs_sums.append(builder.gep(builder.bitcast(xs_suma.data, _F32.as_pointer()), [lane0]))
            xss.append(builder.gep(builder.bitcast(xs4a.data, _F32.as_pointer()), [lane0]))

        def step(weights: list[_Blocks], k, accs, count: int):
            """Every (weight row, activation row)'s accumulator (index w * rows + r) after the blocks
            from block k (count bytes of weights a row)."""
            lanes = count // 8
            vty = ir.VectorType(_F32, lanes)
            ity = ir.VectorType(_I32, lanes)
            half_ty = ir.VectorType(_I8, count // 2)
            byte0 = builder.mul(k, ir.Constant(_I64, 32))
            lane0 = builder.mul(k, ir.Constant(_I64, LANES_PER_BLOCK))
            scales = []
            for w in weights:
                d = scale_lanes(builder, w.scales, [per_block * (i // 4) for i in range(lanes)])
                m = None
                if has_min:
                    m = scale_lanes(builder, w.scales, [per_block * (i // 4) + 1 for i in range(lanes)])
                scales.append((d, m))
            new = list(accs)
            for r in range(rows):
                xa = load_vec(builder, builder.gep(acts[r], [byte0]), half_ty)
                xb = load_vec(
                    builder,
                    builder.gep(acts[r], [builder.add(byte0, ir.Constant(_I64, count // 2))]),
                    half_ty,
                )
                xsum = None
                if offset_shift is not None:
                    xsum = load_vec(builder, builder.gep(xsums[r], [lane0]), ity)
                xs = load_vec(builder, builder.gep(xss[r], [lane0]), vty)
                xs_sum = None
                if has_min:
                    xs_sum = load_vec(builder, builder.gep(xs_sums[r], [lane0]), vty)
                for w_index, (w, (d, m)) in enumerate(zip(weights, scales, strict=True)):
                    index = w_index * rows + r
                    isum = _row_lanes(builder, kind, path, w, xa, xb)
                    if xsum is not None:
                        isum = builder.sub(isum, builder.shl(xsum, const_vec(ity, offset_shift)))
                    acc = fma(builder, builder.fmul(d, xs), builder.sitofp(isum, vty), accs[index])
                    if m is not None:
                        acc = fma(builder, m, xs_sum, acc)
                    new[index] = acc
            return new

        sums = weight_rows * rows
        zero = ir.Constant(_V8F, None)
        entry = builder.block
        loop = builder.append_basic_block("pairs")
        after = builder.append_basic_block("after_pairs")
        tail = builder.append_basic_block("odd_block")
        done = builder.append_basic_block("reduce")
        n_pairs = builder.lshr(n_blocks, ir.Constant(_I64, 1))
        builder.cbranch(builder.icmp_unsigned(">", n_pairs, ir.Constant(_I64, 0)), loop, after)

        builder.position_at_end(loop)
        p = builder.phi(_I64)
        accs = [builder.phi(_V8F) for _ in range(sums)]
        k = builder.shl(p, ir.Constant(_I64, 1))
        offset = builder.mul(k, ir.Constant(_I64, block_bytes))
        blks = [builder.gep(ptr, [offset]) for ptr in row_ptrs]
        prefetch_weight_rows(builder, blks, row_bytes, lines=(2 * block_bytes + 63) // 64)
        new = step([_Blocks(builder, kind, path, blk, 64, signed) for blk in blks], k, accs, 64)
        p_next = builder.add(p, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", p_next, n_pairs), loop, after)
        p.add_incoming(ir.Constant(_I64, 0), entry)
        p.add_incoming(p_next, loop_end)
        for acc, value in zip(accs, new, strict=True):
            acc.add_incoming(zero, entry)
            acc.add_incoming(value, loop_end)

        builder.position_at_end(after)
        paired = []
        for value in new:
            phi = builder.phi(_V8F)
            phi.add_incoming(zero, entry)
            phi.add_incoming(value, loop_end)
            paired.append(phi)
        odd = builder.trunc(builder.and_(n_blocks, ir.Constant(_I64, 1)), ir.IntType(1))
        builder.cbranch(odd, tail, done)

        builder.position_at_end(tail)  # the odd last block: lanes 0-3 (the even blocks' lanes)
        k_last = builder.sub(n_blocks, ir.Constant(_I64, 1))
        offset = builder.mul(k_last, ir.Constant(_I64, block_bytes))
        low = [half(builder, acc, 0) for acc in paired]
        last_blocks = [
            _Blocks(builder, kind, path, builder.gep(ptr, [offset]), 32, signed) for ptr in row_ptrs
        ]
        tail_new = step(last_blocks, k_last, low, 32)
        merged = [
            _shuffle(builder, concat(builder, v, v), acc, [0, 1, 2, 3, 12, 13, 14, 15])
            for v, acc in zip(tail_new, paired, strict=True)
        ]
        tail_end = builder.block
        builder.branch(done)

        builder.position_at_end(done)
        finals = []
        for before, value in zip(paired, merged, strict=True):
            phi = builder.phi(_V8F)
            phi.add_incoming(before, after)
            phi.add_incoming(value, tail_end)
            finals.append(phi)
        results = [sum_lanes(builder, acc) for acc in finals]
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _check(row, xa, xu, xsum, xs_sum, xs4, b0) -> bool:
    arrays = (
        (row, types.uint8, 1),
        (xa, types.int8, 2),
        (xu, types.uint8, 2),
        (xsum, types.int32, 2),
        (xs_sum, types.float32, 2),
        (xs4, types.float32, 2),
    )
    return isinstance(b0, types.Integer) and all(
        isinstance(a, types.Array) and a.dtype == dtype and a.ndim == ndim and a.layout == "C"
        for a, dtype, ndim in arrays
    )


def _make(kind: str, rows: int, path: int):
    def typer(typingctx, row, xa, xu, xsum, xs_sum, xs4, b0):
        if not _check(row, xa, xu, xsum, xs_sum, xs4, b0):
            return None
        sig = types.UniTuple(types.float32, rows)(row, xa, xu, xsum, xs_sum, xs4, types.int64)
        return sig, _codegen(kind, rows, path)

    typer.__name__ = f"{kind}_i8dot{rows}_{PATH_NAMES[path]}"
    typer.__doc__ = f"""(row uint8, xa int8 [B, n], xu uint8 [B, n], xsum int32 [B, n // 8],
    xs_sum float32 [B, n // 8], xs4 float32 [B, n // 8], b0) -> the {rows} int8-activation dot products
    of the {kind.upper()} row with rows b0.. (the activation arrays: legacy_int8.int8_activations)."""
    return intrinsic(typer)


ROW_DOTS = {
    (kind, path, rows): _make(kind, rows, path)
    for kind in _LAYOUTS
    for path in (PORTABLE, AVX2, VNNI)
    for rows in ROW_COUNTS
}
"""The row-dot intrinsics by (kind, int8 path, activation rows): what legacy_int8's driver calls."""


def _make_pair(kind: str, path: int):
    def typer(typingctx, row0, row1, xa, xu, xsum, xs_sum, xs4, b0):
        if not all(_check(row, xa, xu, xsum, xs_sum, xs4, b0) for row in (row0, row1)):
            return None
        sig = types.UniTuple(types.float32, 2)(row0, row1, xa, xu, xsum, xs_sum, xs4, types.int64)
        return sig, _codegen(kind, 1, path, weight_rows=2)

    typer.__name__ = f"{kind}_i8pair_{PATH_NAMES[path]}"
    typer.__doc__ = f"""(row0, row1 uint8: weight rows o and o + 1 of one C-ordered matrix, the activation
    arrays as the row dots take them, b) -> both {kind.upper()} rows' int8-activation dot products with
    activation row b, each computed exactly as the one-row dot computes it (a decode row: two rows share a
    loop, and the stream runs one row further ahead)."""
    return intrinsic(typer)


PAIR_DOTS = {(kind, path): _make_pair(kind, path) for kind in _LAYOUTS for path in (PORTABLE, AVX2, VNNI)}
"""The paired row-dot intrinsics by (kind, int8 path): one activation row against two weight rows."""
