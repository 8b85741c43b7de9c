"""Row dot products on raw legacy blocks, written as LLVM vector IR (numba @intrinsic).

Plain @njit loops over the bytes of a block get scalarised or gathered by LLVM; these emit the vector
code directly. Each block's 16 nibble bytes are loaded as one <16 x i8>, split into the low nibbles
(weights 0..15 of the block, against x[0:16]) and the high nibbles (weights 16..31, against x[16:32])
by and/shift, widened to <16 x float> and dequantized in registers (Q4_1: fma(d, q, m); Q4_0:
d * (q - 8); Q8_0: d * q; Q5_0: d * ((nibble | 5th bit from qh << 4) - 16)). One decoded block serves
1 to 6 activation rows.

The reduction order is written here and is the same for every row and every call: per activation row
four 16-lane float32 accumulators, low halves and high halves of the blocks each in two chains taking
alternate blocks (k % 2), acc = fma(w, x, acc); then (low even + low odd) + (high even + high odd) and
the 16 lanes summed by a fixed tree. Nothing depends on B or on the other rows of a group, so a row's
result is bit-identical alone or in any batch. LLVM selects the instructions for the host (AVX-512: one
zmm per 16 lanes; AVX2: two ymm; otherwise SSE); the arithmetic and its order are the same on all.

The cached functions live in the drivers (legacy.py...); cache_freshness.py drops their entries when this
file changes.
"""

from __future__ import annotations

from collections.abc import Callable

from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_I32 = ir.IntType(32)
_V16I8 = ir.VectorType(_I8, 16)
_V16I32 = ir.VectorType(_I32, 16)
_V16F = ir.VectorType(_F32, 16)

# block bytes, offset of the quants, scales (d only, or d and m), nibbles (True) or int8 (False)
_LAYOUTS = {
    "q4_0": (18, 2, False, True),
    "q4_1": (20, 4, True, True),
    "q8_0": (34, 2, False, False),
    "q5_0": (22, 6, False, True),  # d f16, qh u32 (the 5th bit of each weight), qs[16]
    "q5_1": (24, 8, True, True),  # d f16, m f16, qh u32, qs[16]
}
_FIFTH_BITS = {"q5_0": 2, "q5_1": 4}
"""Where the 5-bit types keep qh."""


def splat(builder: ir.IRBuilder, value: ir.Value, width: int = 16) -> ir.Value:
    """<width x T> with every lane = value (a scalar of type T: a float, an int32)."""
    vty = ir.VectorType(value.type, width)
    vec = builder.insert_element(ir.Constant(vty, ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), width), None)
    return builder.shuffle_vector(vec, ir.Constant(vty, ir.Undefined), mask)


@njit(inline="always", cache=True)
def store_tile(out, res, first_row, first_out, rows, lanes):
    """out[first_row + lane, first_out + r] = res[r, lane] for r < rows, lane < lanes: a tiled kernel's
    results (res [weight rows, lanes], one activation row a lane) written into their output columns."""
    for r in range(rows):
        for lane in range(lanes):
            out[first_row + lane, first_out + r] = res[r, lane]


@njit(inline="always", cache=True)
def store_column(out, b, o, values):
    """out[b + i, o] = values[i]: one weight row's dot products with activation rows b, b + 1, ...
    (the tuple a row-dot intrinsic returns) written into the output column o."""
    for i in range(len(values)):
        out[b + i, o] = values[i]


def splat_half(builder: ir.IRBuilder, ptr: ir.Value, width: int = 16) -> ir.Value:
    """<width x float> with every lane = the IEEE half at byte pointer ptr: the half is splat first,
    then widened in one vector conversion (a broadcast load and one vcvtph2ps, where widening the
    scalar and then splatting it takes three instructions). The same value as fpext of the scalar."""
    bits = builder.load(builder.bitcast(ptr, _I16.as_pointer()), align=1)
    half = builder.bitcast(bits, ir.HalfType())
    vty = ir.VectorType(ir.HalfType(), width)
    vec = builder.insert_element(ir.Constant(vty, ir.Undefined), half, ir.Constant(ir.IntType(32), 0))
    mask = ir.Constant(ir.VectorType(ir.IntType(32), width), None)
    return builder.fpext(
        builder.shuffle_vector(vec, ir.Constant(vty, ir.Undefined), mask), ir.VectorType(_F32, width)
    )


def load_vec(builder: ir.IRBuilder, ptr: ir.Value, vty: ir.Type) -> ir.Value:
    """Unaligned vector load of type vty at ptr."""
    return builder.load(builder.bitcast(ptr, vty.as_pointer()), align=1)


def call_intrinsic(builder: ir.IRBuilder, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
    """Call the LLVM intrinsic `name` (declared once per module)."""
    module = builder.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


PREFETCH_BYTES = 2048
"""How far ahead of the block being read the weight kernels prefetch. Decode at size streams every weight
byte from memory once; one thread's demand misses alone keep too few lines in flight to reach the
memory's speed (cold Q4_K rows read at about half the speed of the same rows in cache)."""


def prefetch(builder: ir.IRBuilder, ptr: ir.Value, offset: int, lines: int = 1, locality: int = 3) -> None:
    """Prefetch `lines` cache lines starting `offset` bytes past `ptr` (an i8 pointer) into every cache
    level (`locality` 3; 2: L2 and out, prefetcht1); a prefetch never faults, so past the end of an array
    is harmless."""
    i8p = ir.IntType(8).as_pointer()
    name = "llvm.prefetch.p0"
    fn = builder.module.globals.get(name)
    if fn is None:
        i32 = ir.IntType(32)
        fn = ir.Function(builder.module, ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32]), name)
    for line in range(lines):
        target = builder.gep(ptr, [ir.Constant(ir.IntType(64), offset + 64 * line)])
        builder.call(
            fn,
            [
                target,
                ir.Constant(ir.IntType(32), 0),
                ir.Constant(ir.IntType(32), locality),
                ir.Constant(ir.IntType(32), 1),
            ],
        )


@intrinsic
def _prefetch_line_to_l2(typingctx, array, offset):
    """Prefetch the cache line at byte `offset` of C-contiguous `array` into the L2 cache."""
    if not (isinstance(array, types.Array) and array.layout == "C" and isinstance(offset, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        data = context.make_array(signature.args[0])(context, builder, args[0]).data
        at = context.cast(builder, args[1], signature.args[1], types.int64)
        prefetch(builder, builder.gep(builder.bitcast(data, _I8.as_pointer()), [at]), 0, locality=2)
        return context.get_dummy_value()

    return types.void(array, offset), codegen


@njit(inline="always", cache=True)
def prefetch_rows_part(blocks, first_row, rows, part, parts):
    """Prefetch part `part` of `parts` (equal runs of cache lines) of rows first_row .. first_row + rows -
    1 of `blocks` (2-D, C order) into the L2 cache. The K-quant tiled kernel spreads its next tile's
    rows over its work on this one, so unpacking that tile reads from cache, not memory: 256-row
    products of matrices read from memory, alternating in one process (2 threads, medians of 6), Q5_K
    16384 x 2048 1.034x faster, Q4_K 1.025x, Q6_K 3072 x 2048 1.033x, Q6_K 2048 x 8192 0.986x (its tile
    is 107 KB beside 1 MB of packed activations in L2). The legacy tiles gained nothing (Q4_0).
    Spread over each kernel call of the tile (not each activation group) it gains again where the
    groups are few: Q4_K 16384 x 2048 from memory (huge pages, 2 threads, medians of 8 alternating),
    16 rows 3.29 -> 3.00 ms and 2.93 -> 2.72, 32 rows 5.09 -> 4.91, 64 rows 6.98 -> 6.71, 256 rows
    26.36 -> 25.63 (from cache, 16 rows: 2.47-2.74 ms)."""
    row_bytes = blocks.shape[1]
    lines = (rows * row_bytes + 63) // 64
    per = (lines + parts - 1) // parts
    start = first_row * row_bytes
    for line in range(part * per, min(lines, (part + 1) * per)):
        _prefetch_line_to_l2(blocks, start + 64 * line)


def prefetch_weight_rows(
    builder: ir.IRBuilder,
    blocks: list[ir.Value],
    row_bytes: ir.Value | None,
    lines: int,
    next_group: bool = False,
) -> None:
    """The weight stream's prefetch for a loop over consecutive rows of one matrix (`blocks`: the block
    read now in each, i8 pointers): `lines` lines PREFETCH_BYTES past the last row's block, and with
    several rows (`row_bytes` their length) the same past the row after them, where the next group of
    rows starts, so a thread streams the rows it reads together and the next group's first bytes.
    `next_group` (the K-quant decode pairs): instead, the same block of each row of the next group, one
    group ahead, so every row's bytes are asked for from their first line on, in the order they will be
    read. On the 8B Q4_K_M shape that beat the scheme above (which leaves part of each group's first row
    to the hardware prefetcher): a decode step's products 182-188 ms against 196-219, its 4096-column
    matrices 25.9-26.2 GB/s against 20.6-23.2 (alternating, 2 threads, from memory; a 2 KB or 4 KB lead
    carried into the next group gave nothing), `infer bench -n 32` 5.45 against 5.28 tok/s (medians of 3
    alternating); for the legacy pairs on the 8B Q4_0 shape it was 1 % slower (5.97 against 6.02)."""
    if next_group and len(blocks) > 1 and row_bytes is not None:
        ahead = builder.mul(row_bytes, ir.Constant(row_bytes.type, len(blocks)))
        for block in blocks:
            prefetch(builder, builder.gep(block, [ahead]), 0, lines=lines)
        return
    prefetch(builder, blocks[-1], PREFETCH_BYTES, lines=lines)
    if len(blocks) > 1 and row_bytes is not None:
        prefetch(builder, builder.gep(blocks[-1], [row_bytes]), PREFETCH_BYTES, lines=lines)


def fma(builder: ir.IRBuilder, a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    """a * b + c lane-wise, one rounding (llvm.fma on <N x float>)."""
    return call_intrinsic(builder, f"llvm.fma.v{a.type.count}f32", a.type, [a, b, c])


def sum_int_lanes_of(builder: ir.IRBuilder, vecs: list[ir.Value]) -> ir.Value:
    """One integer vector whose lane i is the sum of the lanes of vecs[i] (exact in any order while it
    does not overflow). The vectors are added pairwise while they are folded, a transposing tree: k
    vectors of N lanes cost about 3k shuffles and adds, where reducing each alone costs k * 3 log2 N.
    len(vecs) is padded with zero vectors to a power of two, at most N."""
    return _transposed_sums(builder, vecs, builder.add)


def sum_float_lanes_of(builder: ir.IRBuilder, vecs: list[ir.Value]) -> ir.Value:
    """`sum_int_lanes_of` for float vectors: lane i is the sum of the lanes of vecs[i], in the same
    order for every i (8 lanes: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))), whatever the other
    vectors hold: the tree only ever adds lanes of one vector, never a padding zero to a lane."""
    return _transposed_sums(builder, vecs, builder.fadd)


def _transposed_sums(
    builder: ir.IRBuilder, vecs: list[ir.Value], add: Callable[[ir.Value, ir.Value], ir.Value]
) -> ir.Value:
    vty = vecs[0].type
    width = vty.count
    idx = ir.IntType(32)
    count = 1
    while count < len(vecs):
        count *= 2
    vecs = list(vecs) + [ir.Constant(vty, None)] * (count - len(vecs))
    # level by level: pair (a, b) -> [a's runs folded in half, then b's], so each vector holds ever more
    # sums (in input order) in ever fewer lanes; then the last vector's runs are summed
    lanes = width
    while len(vecs) > 1:
        half = lanes // 2
        runs = width // lanes
        lows = [r * lanes + i for r in range(runs) for i in range(half)]
        highs = [r * lanes + half + i for r in range(runs) for i in range(half)]
        lo_ty = ir.Constant(ir.VectorType(idx, width), lows + [i + width for i in lows])
        hi_ty = ir.Constant(ir.VectorType(idx, width), highs + [i + width for i in highs])
        vecs = [
            add(builder.shuffle_vector(a, b, lo_ty), builder.shuffle_vector(a, b, hi_ty))
            for a, b in zip(vecs[0::2], vecs[1::2], strict=True)
        ]
        lanes = half
    vec = vecs[0]
    # now `count` sums, sum i spread over lanes i * lanes .. (i + 1) * lanes - 1 of `vec`
    while lanes > 1:
        half = lanes // 2
        lo_idx = [run * lanes + i for run in range(count) for i in range(half)]
        hi_idx = [run * lanes + half + i for run in range(count) for i in range(half)]
        size = len(lo_idx)
        lo = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(idx, size), lo_idx))
        hi = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(idx, size), hi_idx))
        vec = add(lo, hi)
        lanes = half
    return vec


def sum_lanes(builder: ir.IRBuilder, vec: ir.Value) -> ir.Value:
    """Sum of the lanes by a fixed tree: lanes i and i + N/2, then i and i + N/4, ..., then 0 and 1."""
    width = vec.type.count
    idx = ir.IntType(32)
    while width > 1:
        half = width // 2
        low = builder.shuffle_vector(vec, vec, ir.Constant(ir.VectorType(idx, half), list(range(half))))
        high = builder.shuffle_vector(
            vec, vec, ir.Constant(ir.VectorType(idx, half), list(range(half, width)))
        )
        vec = builder.fadd(low, high)
        width = half
    return builder.extract_element(vec, ir.Constant(idx, 0))


def tile_signature(arrays: tuple, g: types.Type, r0: types.Type) -> types.Type | None:
    """void(the arrays, int64 g, int64 r0) for a tiled kernel's typer when each (type, dtype, ndim) of
    `arrays` is a C-contiguous array of that dtype and rank and g and r0 are integers; else None."""
    if not all(is_c_array(a, t, n) for a, t, n in arrays):
        return None
    if not (isinstance(g, types.Integer) and isinstance(r0, types.Integer)):
        return None
    return types.void(*(a for a, _, _ in arrays), types.int64, types.int64)


def is_c_array(value: types.Type, dtype: types.Type, ndim: int) -> bool:
    """Whether a numba type is a C-contiguous array of `dtype` with `ndim` dimensions (what the
    intrinsics' pointer arithmetic assumes)."""
    if not isinstance(value, types.Array):
        return False
    return value.dtype == dtype and value.ndim == ndim and value.layout == "C"


def activation_rows(builder: ir.IRBuilder, xa: ir.Value, b0: ir.Value, rows: int) -> tuple[ir.Value, list]:
    """(n, pointers to x[b0], ..., x[b0 + rows - 1]) for x, a C-contiguous float32 [B, n] array."""
    n = builder.extract_value(xa.shape, 1)
    x_base = builder.gep(builder.bitcast(xa.data, _F32.as_pointer()), [builder.mul(b0, n)])
    return n, [builder.gep(x_base, [builder.mul(ir.Constant(_I64, r), n)]) for r in range(rows)]


def exit_values(builder: ir.IRBuilder, values: list, entry: ir.Block, loop_end: ir.Block) -> list:
    """At the top of the block after a loop that may run zero times: each of `values` (vectors the
    last iteration computed) as a phi, zero when the loop was skipped. LLVM wants every phi before
    any other instruction of the block, so call this before emitting anything else there."""
    finals = []
    for value in values:
        phi = builder.phi(value.type)
        phi.add_incoming(ir.Constant(value.type, None), entry)
        phi.add_incoming(value, loop_end)
        finals.append(phi)
    return finals


def _rows_dot_codegen(kind: str, rows: int):
    """IR for `rows` activation rows x[b0 .. b0 + rows - 1] against one weight row: each block is
    decoded once and used for every activation row, each row with its own accumulators (the arithmetic
    of each row is exactly that of rows == 1)."""
    block_bytes, quant_offset, has_min, nibbles = _LAYOUTS[kind]

    def codegen(context, builder, signature, args):
        row_ty, x_ty = signature.args[0], signature.args[1]
        row = context.make_array(row_ty)(context, builder, args[0])
        xa = context.make_array(x_ty)(context, builder, args[1])
        b0 = args[2]
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        n, x_rows = activation_rows(builder, xa, b0, rows)
        n_blocks = builder.udiv(n, ir.Constant(_I64, 32))
        zero = ir.Constant(_V16F, None)

        entry = builder.block
        loop = builder.append_basic_block("blocks")
        done = builder.append_basic_block("reduce")
        builder.cbranch(builder.icmp_unsigned(">", n_blocks, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        k = builder.phi(_I64)
        # per activation row: a chain for the low 16 weights of a block and one for the high 16, each
        # split in two used by alternate blocks (block k goes to k % 2): one FMA per chain every other block
        chains = 4
        accs = [[builder.phi(_V16F) for _ in range(chains)] for _ in range(rows)]
        blk = builder.gep(row_ptr, [builder.mul(k, ir.Constant(_I64, block_bytes))])
        prefetch(builder, blk, PREFETCH_BYTES)
        d = splat_half(builder, blk)
        m = splat_half(builder, builder.gep(blk, [ir.Constant(_I64, 2)])) if has_min else None
        qp = builder.gep(blk, [ir.Constant(_I64, quant_offset)])
        if nibbles:
            q = load_vec(builder, qp, _V16I8)
            # Widened to 32 bits once, then split: one byte-to-dword shuffle per block instead of one
            # per half, and the and/shift (and Q5_0's fifth bits) on dwords: the same integers as on
            # bytes, converted to float straight from the dwords
            q32 = builder.zext(q, _V16I32)
            lo = builder.and_(q32, ir.Constant(_V16I32, [15] * 16))
            hi = builder.lshr(q32, ir.Constant(_V16I32, [4] * 16))
            if kind in _FIFTH_BITS:  # 5th bits from qh: weight j takes bit j, weight j + 16 bit j + 16
                qh_at = builder.gep(blk, [ir.Constant(_I64, _FIFTH_BITS[kind])])
                qh = builder.load(builder.bitcast(qh_at, _I32.as_pointer()), align=1)
                qh_lanes = builder.shuffle_vector(
                    builder.insert_element(ir.Constant(_V16I32, ir.Undefined), qh, ir.Constant(_I32, 0)),
                    ir.Constant(_V16I32, ir.Undefined),
                    ir.Constant(_V16I32, None),
                )
                fifth = ir.Constant(_V16I32, [16] * 16)
                sixteen = ir.Constant(_V16I32, [16] * 16)
                weights = []
                for first, low_bits in ((0, lo), (16, hi)):
                    # bit (first + j) of qh, moved to bit 4: (qh >> (first + j)) << 4, masked to 16
                    shifted = builder.lshr(qh_lanes, ir.Constant(_V16I32, list(range(first, first + 16))))
                    bit = builder.and_(builder.shl(shifted, ir.Constant(_V16I32, [4] * 16)), fifth)
                    value = builder.or_(low_bits, bit)
                    if has_min:  # Q5_1: d * q + m, one rounding (as Q4_1)
                        weights.append(fma(builder, d, builder.sitofp(value, _V16F), m))
                    else:  # Q5_0: d * (q - 16), q - 16 exact
                        weights.append(builder.fmul(d, builder.sitofp(builder.sub(value, sixteen), _V16F)))
                w0, w1 = weights
            elif has_min:  # Q4_1: d * q + m, one rounding
                w0 = fma(builder, d, builder.sitofp(lo, _V16F), m)
                w1 = fma(builder, d, builder.sitofp(hi, _V16F), m)
            else:  # Q4_0: d * (q - 8), q - 8 exact
                eight = ir.Constant(_V16I32, [8] * 16)
                w0 = builder.fmul(d, builder.sitofp(builder.sub(lo, eight), _V16F))
                w1 = builder.fmul(d, builder.sitofp(builder.sub(hi, eight), _V16F))
        else:  # Q8_0: d * q over two runs of 16 signed bytes
            w0 = builder.fmul(d, builder.sitofp(load_vec(builder, qp, _V16I8), _V16F))
            q1 = load_vec(builder, builder.gep(qp, [ir.Constant(_I64, 16)]), _V16I8)
            w1 = builder.fmul(d, builder.sitofp(q1, _V16F))
        offset = builder.mul(k, ir.Constant(_I64, 32))
        new_accs = []
        for r in range(rows):
            xb = builder.gep(x_rows[r], [offset])
            x0 = load_vec(builder, xb, _V16F)
            x1 = load_vec(builder, builder.gep(xb, [ir.Constant(_I64, 16)]), _V16F)
            new_accs.append([fma(builder, w0, x0, accs[r][0]), fma(builder, w1, x1, accs[r][2])])
        k_next = builder.add(k, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", k_next, n_blocks), loop, done)
        k.add_incoming(ir.Constant(_I64, 0), entry)
        k.add_incoming(k_next, loop_end)
        for r in range(rows):
            for pair in range(chains // 2):  # rotate: (first, second) <- (second, new)
                first, second = accs[r][2 * pair], accs[r][2 * pair + 1]
                for phi in (first, second):
                    phi.add_incoming(zero, entry)
                first.add_incoming(second, loop_end)
                second.add_incoming(new_accs[r][pair], loop_end)

        builder.position_at_end(done)
        finals = [
            exit_values(
                builder,
                [v for pair in range(chains // 2) for v in (accs[r][2 * pair + 1], new_accs[r][pair])],
                entry,
                loop_end,
            )
            for r in range(rows)
        ]
        results = []
        for row_finals in finals:
            low = builder.fadd(row_finals[0], row_finals[1])
            total = builder.fadd(low, builder.fadd(row_finals[2], row_finals[3]))
            results.append(sum_lanes(builder, total))
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _check(row, x, b0):
    rows_ok = is_c_array(row, types.uint8, 1) and is_c_array(x, types.float32, 2)
    return rows_ok and isinstance(b0, types.Integer)


def _make(kind: str, rows: int):
    def typer(typingctx, row, x, b0):
        if not _check(row, x, b0):
            return None
        return types.UniTuple(types.float32, rows)(row, x, types.int64), _rows_dot_codegen(kind, rows)

    typer.__name__ = f"{kind}_dot{rows}"
    typer.__doc__ = f"""(row uint8 [row_bytes], x float32 [B, n], b0) -> the {rows} dot products of the
    {kind.upper()} weight row with x[b0], ..., x[b0 + {rows - 1}] (n a multiple of 32)."""
    return intrinsic(typer)


DOTS = {(kind, rows): _make(kind, rows) for kind in _LAYOUTS for rows in range(1, 7)}
"""The exact dot intrinsics by (kind, activation rows), 1 to 6 rows per call: 6 rows of 4 chains are 24
accumulators, which leaves registers for the decoded block (at 8 rows, 32 accumulators fill the register
file and the kernels ran 1.3x slower than in groups of 4). What legacy.py's driver calls."""
