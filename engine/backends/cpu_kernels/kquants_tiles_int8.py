"""Tiled int8 products of K-quant weights (Q4_K, Q5_K, Q6_K) with many activation rows: prefill and
batches of streams, where the row dots of kquants_simd_int8.py would decode every super-block's quants
and scales again for each four activation rows, and spend two multiplies on every 64 products.

Here one lane holds one activation row. Each tile of TILE weight rows is unpacked once per call into
signed bytes (Q4_K, Q5_K: q; Q6_K: q - 32) with its scales as int32, and the activations are packed once
per call, LANES rows at a time, four bytes of each row side by side (xq + 128: unsigned, what vpdpbusd
multiplies). Then one vpdpbusd adds four products of a weight row, broadcast, into every activation row's
lane; a sub-block's sums are multiplied by its scale (vpmulld), and the exact integers of a super-block are
    A = sum_j sc[j] * sum_i q_i (xq_i + 128) - 128 * sum_j sc[j] * sum_i q_i  (= sum_j sc[j] sum_i q_i xq_i)
    M = sum_j m[j] * xb32[j]                                                  (Q4_K, Q5_K)
the same A and M the row dots compute (all exact int32), followed by the same float part, lane by lane:
acc = fma(d * xd, float(A), acc), accm = fma(dmin * xd, float(M), accm), super-block after super-block,
result acc - accm. So every out[b, o] has the bits the row dots give it, whichever kernel a call takes,
on every path (AVX-512 VNNI: 16 lanes; AVX-VNNI, AVX2 (vpmaddubsw + vpmaddwd) and portable: 8).

With 16 lanes a call takes two groups of them where two are left (a last odd group alone): each
broadcast quad of a weight row goes into both groups' sums, and the super-block's sub-blocks run in a
loop of a few at a time (QUADS_PER_STEP) instead of unrolled whole. The vpdpbusd core runs two a cycle
on the Intel VM of the README (413 GMAC/s a core, measured with a chain-free loop), where one group of
four rows ran at about 40 % of that; with the pairs, 256 activation rows against K-quant matrices in
memory (each tile read once per call, the packed activations from L2), 2 threads, 8192 x 2048: Q4_K
275-291 against 247-284 GMAC/s, Q6_K 280-319 against 239-283; 2048 x 8192: Q4_K 320-324 against 272-298,
Q6_K 313-333 against 258-271 (alternating, 3 rounds).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from .features import cpu_features
from .kquants_simd_int8 import BLOCK_BYTES, _block_halves, _chunk_quants, _superblock_scales
from .simd import (
    call_intrinsic,
    fma,
    is_c_array,
    load_vec,
    prefetch_rows_part,
    splat,
    store_tile,
    tile_signature,
)
from .simd_int8 import (
    AVX2,
    PATH_NAMES,
    PORTABLE,
    VNNI,
    _dpwssd,
    _intrinsic_call,
    _vpdpbusd,
    available_paths,
    const_vec,
    half,
)

TILE = 16
"""Weight rows unpacked together (a parallel work item)."""

MIN_ROWS = 10
"""Activation rows from which a call takes the tiled kernel (fewer: the row dots). Measured on an
8192 x 2048 Q4_K matrix, one thread, AVX-512 VNNI: 8 rows cost the same both ways, 10 rows 0.78x the row
dots' time, 16 rows 0.51x, 64 rows 0.38x (the 8-lane AVX2 path: 0.60x at 8 rows)."""

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()

KINDS = ("q4_k", "q5_k", "q6_k")
SUB_BLOCKS = {"q4_k": 8, "q5_k": 8, "q6_k": 16}
"""Scales per super-block: one per 32 weights (Q4_K, Q5_K) or per 16 (Q6_K)."""


def path_lanes(path: int) -> int:
    """Activation rows per vector on `path`: 16 with AVX-512 VNNI, else 8 (256-bit vectors; a path the
    host lacks runs as portable, 8)."""
    return 16 if path == VNNI and path in available_paths() and cpu_features().avx512_vnni else 8


def rows_per_call(lanes: int) -> int:
    """Weight rows one kernel call computes (sharing each load of packed activations): 4 in 32 zmm
    registers, 2 in AVX2's 16."""
    return 4 if lanes == 16 else 2


def _dot4(builder: ir.IRBuilder, path: int, acc: ir.Value, unsigned: ir.Value, signed: ir.Value) -> ir.Value:
    """acc + the sums of four unsigned x signed byte products per int32 lane (exact: |q| <= 32)."""
    lanes = acc.type.count
    if path == VNNI:
        return _vpdpbusd(builder, acc, unsigned, signed, lanes == 16)
    if path == AVX2:  # |pair| <= 2 * 255 * 32 < 2**15: vpmaddubsw never saturates here
        v16i16 = ir.VectorType(_I16, 16)
        pairs = _intrinsic_call(builder, "llvm.x86.avx2.pmadd.ub.sw", v16i16, [unsigned, signed])
        quads = _intrinsic_call(
            builder, "llvm.x86.avx2.pmadd.wd", ir.VectorType(_I32, 8), [pairs, const_vec(v16i16, 1)]
        )
        return builder.add(acc, quads)
    wide = ir.VectorType(_I32, 4 * lanes)
    prod = builder.mul(builder.zext(unsigned, wide), builder.sext(signed, wide))
    for part in range(4):
        picked = builder.shuffle_vector(
            prod, prod, ir.Constant(ir.VectorType(_I32, lanes), [4 * i + part for i in range(lanes)])
        )
        acc = builder.add(acc, picked)
    return acc


def _pair_products(builder: ir.IRBuilder, path: int, acc: ir.Value, a: ir.Value, b: ir.Value) -> ir.Value:
    """acc + lo16(a) * lo16(b) + hi16(a) * hi16(b) per int32 lane, the halves signed (exact)."""
    lanes = acc.type.count
    if path == VNNI and lanes == 16:
        return _dpwssd(builder, True, acc, a, b)
    v_i16 = ir.VectorType(_I16, 2 * lanes)
    pairs = [builder.bitcast(a, v_i16), builder.bitcast(b, v_i16)]
    if path == VNNI:  # AVX-VNNI, 8 lanes
        return _intrinsic_call(builder, "llvm.x86.avx512.vpdpwssd.256", acc.type, [acc, *pairs])
    if path == AVX2:  # 8 lanes
        return builder.add(acc, _intrinsic_call(builder, "llvm.x86.avx2.pmadd.wd", acc.type, pairs))
    sixteen = const_vec(acc.type, 16)

    def low(v: ir.Value) -> ir.Value:
        return builder.ashr(builder.shl(v, sixteen), sixteen)

    def high(v: ir.Value) -> ir.Value:
        return builder.ashr(v, sixteen)

    return builder.add(acc, builder.add(builder.mul(low(a), low(b)), builder.mul(high(a), high(b))))


QUADS_PER_STEP = 8
"""With two groups a call: quads (four weights) of each row a step of the loop over a super-block's
sub-blocks (Q4_K, Q5_K: one sub-block; Q6_K: two). Unrolled whole (one step), LLVM interleaved the
sub-blocks' products and spilled the running sums."""


def _codegen(kind: str, path: int, lanes: int, rows: int, groups: int):
    subs = SUB_BLOCKS[kind]
    quads_per_sub = 256 // subs // 4
    has_min = kind != "q6_k"
    ity = ir.VectorType(_I32, lanes)
    fty = ir.VectorType(_F32, lanes)
    bty = ir.VectorType(_I8, 4 * lanes)
    subs_per_step = max(1, QUADS_PER_STEP // quads_per_sub) if groups > 1 else subs

    def codegen(context, builder, signature, args):
        wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res = (
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:10], args[:10], strict=True)
        )
        g, r0 = args[10], args[11]
        n = builder.extract_value(wq.shape, 1)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        wq_ptr = builder.bitcast(wq.data, _I8.as_pointer())
        sc_ptr = builder.bitcast(sc.data, _I32.as_pointer())
        corr_ptr = builder.bitcast(corr.data, _I32.as_pointer())
        dd_ptr = builder.bitcast(dd.data, _F32.as_pointer())
        dm_ptr = builder.bitcast(dm.data, _F32.as_pointer())
        mp_ptr = builder.bitcast(mp.data, _I32.as_pointer())
        # each group's packed activations: n bytes of each of `lanes` rows; xd and the xb pairs per sb
        xp_ptrs, xd_ptrs, xb_ptrs = [], [], []
        for gi in range(groups):
            gg = builder.add(g, ir.Constant(_I64, gi))
            xp_ptrs.append(
                builder.gep(
                    builder.bitcast(xp.data, _I8.as_pointer()),
                    [builder.mul(gg, builder.mul(n, ir.Constant(_I64, lanes)))],
                )
            )
            xd_ptrs.append(
                builder.gep(
                    builder.bitcast(xdp.data, _F32.as_pointer()),
                    [builder.mul(gg, builder.mul(n_sb, ir.Constant(_I64, lanes)))],
                )
            )
            xb_ptrs.append(
                builder.gep(
                    builder.bitcast(xbp.data, _I32.as_pointer()),
                    [builder.mul(gg, builder.mul(n_sb, ir.Constant(_I64, 4 * lanes)))],
                )
            )
        row_ids = [builder.add(r0, ir.Constant(_I64, r)) for r in range(rows)]
        zero_f = ir.Constant(fty, None)
        keys = [(r, gi) for r in range(rows) for gi in range(groups)]

        entry = builder.block
        loop = builder.append_basic_block("superblocks")
        done = builder.append_basic_block("store")
        builder.cbranch(builder.icmp_unsigned(">", n_sb, ir.Constant(_I64, 0)), loop, done)

        builder.position_at_end(loop)
        sb = builder.phi(_I64)
        acc_phis = {k: builder.phi(fty) for k in keys}
        min_phis = {k: builder.phi(fty) for k in keys} if has_min else {}
        row_sb = [builder.add(builder.mul(row, n_sb), sb) for row in row_ids]  # index into [rows, n_sb]
        w_rows = [
            builder.gep(wq_ptr, [builder.add(builder.mul(row, n), builder.mul(sb, ir.Constant(_I64, 256)))])
            for row in row_ids
        ]
        x_sbs = [builder.gep(xp_ptr, [builder.mul(sb, ir.Constant(_I64, 256 * lanes))]) for xp_ptr in xp_ptrs]
        pre = builder.block
        jloop = builder.append_basic_block("subs")
        jdone = builder.append_basic_block("subs_done")
        builder.branch(jloop)
        builder.position_at_end(jloop)
        first_sub = builder.phi(_I64)
        sum_phis = {k: builder.phi(ity) for k in keys}
        sums = dict(sum_phis)
        for step in range(subs_per_step):
            j = builder.add(first_sub, ir.Constant(_I64, step))
            parts = {k: ir.Constant(ity, None) for k in keys}
            for q in range(quads_per_sub):
                quad = builder.add(builder.mul(j, ir.Constant(_I64, quads_per_sub)), ir.Constant(_I64, q))
                xvs = [
                    load_vec(
                        builder, builder.gep(x_sb, [builder.mul(quad, ir.Constant(_I64, 4 * lanes))]), bty
                    )
                    for x_sb in x_sbs
                ]
                for r in range(rows):
                    wptr = builder.bitcast(
                        builder.gep(w_rows[r], [builder.mul(quad, ir.Constant(_I64, 4))]), _I32.as_pointer()
                    )
                    wv = builder.bitcast(splat(builder, builder.load(wptr, align=1), lanes), bty)
                    for gi in range(groups):
                        parts[(r, gi)] = _dot4(builder, path, parts[(r, gi)], xvs[gi], wv)
            for r in range(rows):
                index = builder.add(builder.mul(row_sb[r], ir.Constant(_I64, subs)), j)
                scale = splat(builder, builder.load(builder.gep(sc_ptr, [index])), lanes)
                for gi in range(groups):
                    sums[(r, gi)] = builder.add(sums[(r, gi)], builder.mul(parts[(r, gi)], scale))
        next_sub = builder.add(first_sub, ir.Constant(_I64, subs_per_step))
        jend = builder.block
        builder.cbranch(builder.icmp_unsigned("<", next_sub, ir.Constant(_I64, subs)), jloop, jdone)
        first_sub.add_incoming(ir.Constant(_I64, 0), pre)
        first_sub.add_incoming(next_sub, jend)
        for k in keys:
            sum_phis[k].add_incoming(ir.Constant(ity, None), pre)
            sum_phis[k].add_incoming(sums[k], jend)
        builder.position_at_end(jdone)
        finished = {}
        for k in keys:
            phi = builder.phi(ity)
            phi.add_incoming(sums[k], jend)
            finished[k] = phi
        sums = finished
        accs, mins = {}, {}
        for gi in range(groups):
            xd = load_vec(builder, builder.gep(xd_ptrs[gi], [builder.mul(sb, ir.Constant(_I64, lanes))]), fty)
            for r in range(rows):
                total = builder.sub(
                    sums[(r, gi)], splat(builder, builder.load(builder.gep(corr_ptr, [row_sb[r]])), lanes)
                )
                d = splat(builder, builder.load(builder.gep(dd_ptr, [row_sb[r]])), lanes)
                accs[(r, gi)] = fma(
                    builder, builder.fmul(d, xd), builder.sitofp(total, fty), acc_phis[(r, gi)]
                )
                if has_min:
                    m = ir.Constant(ity, None)
                    for p in range(4):
                        xb = load_vec(
                            builder,
                            builder.gep(
                                xb_ptrs[gi],
                                [
                                    builder.add(
                                        builder.mul(sb, ir.Constant(_I64, 4 * lanes)),
                                        ir.Constant(_I64, p * lanes),
                                    )
                                ],
                            ),
                            ity,
                        )
                        factor = builder.load(
                            builder.gep(
                                mp_ptr,
                                [
                                    builder.add(
                                        builder.mul(row_sb[r], ir.Constant(_I64, 4)), ir.Constant(_I64, p)
                                    )
                                ],
                            )
                        )
                        m = _pair_products(builder, path, m, xb, splat(builder, factor, lanes))
                    dmin = splat(builder, builder.load(builder.gep(dm_ptr, [row_sb[r]])), lanes)
                    mins[(r, gi)] = fma(
                        builder, builder.fmul(dmin, xd), builder.sitofp(m, fty), min_phis[(r, gi)]
                    )
        following = builder.add(sb, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_sb), loop, done)
        sb.add_incoming(ir.Constant(_I64, 0), entry)
        sb.add_incoming(following, loop_end)
        for k in keys:
            acc_phis[k].add_incoming(zero_f, entry)
            acc_phis[k].add_incoming(accs[k], loop_end)
            if has_min:
                min_phis[k].add_incoming(zero_f, entry)
                min_phis[k].add_incoming(mins[k], loop_end)

        builder.position_at_end(done)
        final_acc, final_min = {}, {}
        for k in keys:
            phi = builder.phi(fty)
            phi.add_incoming(zero_f, entry)
            phi.add_incoming(accs[k], loop_end)
            final_acc[k] = phi
        if has_min:
            for k in keys:
                phi = builder.phi(fty)
                phi.add_incoming(zero_f, entry)
                phi.add_incoming(mins[k], loop_end)
                final_min[k] = phi
        res_ptr = builder.bitcast(res.data, _F32.as_pointer())
        for r, gi in keys:
            final = builder.fsub(final_acc[(r, gi)], final_min[(r, gi)]) if has_min else final_acc[(r, gi)]
            target = builder.gep(res_ptr, [ir.Constant(_I64, (gi * rows + r) * lanes)])
            builder.store(final, builder.bitcast(target, fty.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _make(kind: str, path: int, groups: int = 1):
    """The tile kernel of `kind` on `path` for `groups` groups of lanes a call (2: group g and g + 1, each
    weight row's broadcast quads multiplied into both; res then holds group g's rows, then g + 1's)."""
    lanes = path_lanes(path)
    if path not in available_paths():
        path = PORTABLE
    rows = rows_per_call(lanes)

    def typer(typingctx, wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0):
        arrays = (
            (wq, types.int8, 2),
            (sc, types.int32, 3),
            (corr, types.int32, 2),
            (dd, types.float32, 2),
            (dm, types.float32, 2),
            (mp, types.int32, 3),
            (xp, types.uint32, 3),
            (xdp, types.float32, 3),
            (xbp, types.int32, 4),
            (res, types.float32, 2),
        )
        sig = tile_signature(arrays, g, r0)
        return None if sig is None else (sig, _codegen(kind, path, lanes, rows, groups))

    typer.__name__ = f"{kind}_tile{groups if groups > 1 else ''}_{PATH_NAMES[path]}"
    return intrinsic(typer)


def _byte_sums_of_eights(builder: ir.IRBuilder, quants: ir.Value) -> ir.Value:
    """<8 x i32>: the sums of each eight of 64 unsigned bytes (vpsadbw against zero where the host has
    it, else widening adds)."""
    features = cpu_features()
    v8i64 = ir.VectorType(_I64, 8)
    if features.avx512_vnni:  # implies AVX-512 BW (features.py)
        sad = _intrinsic_call(
            builder, "llvm.x86.avx512.psad.bw.512", v8i64, [quants, ir.Constant(quants.type, None)]
        )
    elif features.avx2:
        v32 = ir.VectorType(_I8, 32)
        halves = [
            _intrinsic_call(
                builder,
                "llvm.x86.avx2.psad.bw",
                ir.VectorType(_I64, 4),
                [half(builder, quants, h), ir.Constant(v32, None)],
            )
            for h in (0, 1)
        ]
        sad = builder.shuffle_vector(
            halves[0], halves[1], ir.Constant(ir.VectorType(_I32, 8), list(range(8)))
        )
    else:
        wide = builder.zext(quants, ir.VectorType(_I32, 64))
        total = None
        for i in range(8):
            picked = builder.shuffle_vector(
                wide, wide, ir.Constant(ir.VectorType(_I32, 8), [8 * g + i for g in range(8)])
            )
            total = picked if total is None else builder.add(total, picked)
        return total
    return builder.trunc(sad, ir.VectorType(_I32, 8))


def _unpack_codegen(kind: str):
    block_bytes = BLOCK_BYTES[kind]
    subs = SUB_BLOCKS[kind]
    run = 256 // subs  # weights per scale

    def codegen(context, builder, signature, args):
        row, wq, sc, corr, dd, dm, mp = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args, strict=True)
        )
        n = builder.extract_value(wq.shape, 0)
        n_sb = builder.udiv(n, ir.Constant(_I64, 256))
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        wq_ptr = builder.bitcast(wq.data, _I8.as_pointer())
        sc_ptr = builder.bitcast(sc.data, _I32.as_pointer())
        v64 = ir.VectorType(_I8, 64)
        vsub = ir.VectorType(_I32, subs)

        entry = builder.block
        loop = builder.append_basic_block("unpack")
        done = builder.append_basic_block("unpacked")
        builder.cbranch(builder.icmp_unsigned(">", n_sb, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        sb = builder.phi(_I64)
        block = builder.gep(row_ptr, [builder.mul(sb, ir.Constant(_I64, block_bytes))])
        scales, mins = _superblock_scales(builder, kind, block)
        d, dmin = _block_halves(builder, kind, block)
        # sum_j sc[j] * sum_i q_ij as eight lanes: each lane's eight quants' sum (vpsadbw) times the
        # scale of its sub-block, added over the chunks, reduced once (Q6_K: minus 32 * run * sum sc)
        v8 = ir.VectorType(_I32, 8)
        weighted_lanes = ir.Constant(v8, None)
        for chunk in range(4):
            quants = _chunk_quants(builder, kind, block, chunk)
            eights = _byte_sums_of_eights(builder, quants)  # <8 x i32>: each 8 unsigned quants' sum
            spread = builder.shuffle_vector(
                scales, scales, ir.Constant(v8, [chunk * (64 // run) + k // (run // 8) for k in range(8)])
            )
            weighted_lanes = builder.add(weighted_lanes, builder.mul(eights, spread))
            if kind == "q6_k":
                quants = builder.sub(quants, const_vec(v64, 32))
            target = builder.gep(
                wq_ptr, [builder.add(builder.mul(sb, ir.Constant(_I64, 256)), ir.Constant(_I64, 64 * chunk))]
            )
            builder.store(quants, builder.bitcast(target, v64.as_pointer()), align=1)
        at = builder.mul(sb, ir.Constant(_I64, subs))
        builder.store(scales, builder.bitcast(builder.gep(sc_ptr, [at]), vsub.as_pointer()), align=4)
        weighted = call_intrinsic(builder, "llvm.vector.reduce.add.v8i32", _I32, [weighted_lanes])
        if kind == "q6_k":
            scale_sum = call_intrinsic(builder, f"llvm.vector.reduce.add.v{subs}i32", _I32, [scales])
            weighted = builder.sub(weighted, builder.mul(scale_sum, ir.Constant(_I32, 32 * run)))
        corr_ptr = builder.gep(builder.bitcast(corr.data, _I32.as_pointer()), [sb])
        builder.store(builder.mul(weighted, ir.Constant(_I32, 128)), corr_ptr)
        builder.store(d, builder.gep(builder.bitcast(dd.data, _F32.as_pointer()), [sb]))
        if kind != "q6_k":
            builder.store(dmin, builder.gep(builder.bitcast(dm.data, _F32.as_pointer()), [sb]))
            v4 = ir.VectorType(_I32, 4)
            even = builder.shuffle_vector(mins, mins, ir.Constant(v4, [0, 2, 4, 6]))
            odd = builder.shuffle_vector(mins, mins, ir.Constant(v4, [1, 3, 5, 7]))
            pairs = builder.or_(even, builder.shl(odd, const_vec(v4, 16)))
            mp_ptr = builder.gep(
                builder.bitcast(mp.data, _I32.as_pointer()), [builder.mul(sb, ir.Constant(_I64, 4))]
            )
            builder.store(pairs, builder.bitcast(mp_ptr, v4.as_pointer()), align=4)
        following = builder.add(sb, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_sb), loop, done)
        sb.add_incoming(ir.Constant(_I64, 0), entry)
        sb.add_incoming(following, loop_end)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return codegen


def _make_unpack(kind: str):
    def typer(typingctx, row, wq, sc, corr, dd, dm, mp):
        arrays = (
            (row, types.uint8, 1),
            (wq, types.int8, 1),
            (sc, types.int32, 2),
            (corr, types.int32, 1),
            (dd, types.float32, 1),
            (dm, types.float32, 1),
            (mp, types.int32, 2),
        )
        if not all(is_c_array(a, t, n) for a, t, n in arrays):
            return None
        return types.void(row, wq, sc, corr, dd, dm, mp), _unpack_codegen(kind)

    typer.__name__ = f"{kind}_unpack"
    return intrinsic(typer)


q4_k_unpack, q5_k_unpack, q6_k_unpack = (_make_unpack(k) for k in KINDS)

# module-level names (numba resolves intrinsics as globals)
q4_k_tile_portable, q4_k_tile_avx2, q4_k_tile_vnni = (_make("q4_k", p) for p in (PORTABLE, AVX2, VNNI))
q5_k_tile_portable, q5_k_tile_avx2, q5_k_tile_vnni = (_make("q5_k", p) for p in (PORTABLE, AVX2, VNNI))
q6_k_tile_portable, q6_k_tile_avx2, q6_k_tile_vnni = (_make("q6_k", p) for p in (PORTABLE, AVX2, VNNI))
q4_k_tile2_vnni, q5_k_tile2_vnni, q6_k_tile2_vnni = (_make(k, VNNI, 2) for k in KINDS)


SHAPES = {path: (path_lanes(path), rows_per_call(path_lanes(path))) for path in (PORTABLE, AVX2, VNNI)}
"""path -> (lanes, weight rows per call) of its kernels, read once: cpu_features() asks LLVM for the
host's features, 0.6 ms a call, more than a decode step's matmul."""


@njit(cache=True, parallel=True)
def pack_activations(xq, xd, xb, lanes):
    """(xp uint32 [G, n // 4, lanes], xdp float32 [G, n // 256, lanes], xbp int32 [G, n // 256, 4,
    lanes]) for G = ceil(B / lanes) groups: each four bytes of a row + 128 (one uint32 a lane), each row's
    xd per super-block, and its pairs (xb32[2p], xb32[2p + 1]) as int16 halves (xb32[j]: the sum of 32
    xq). Lanes past B are zero."""
    n_b, n = xq.shape
    n_sb = n // 256
    groups = (n_b + lanes - 1) // lanes
    xp32 = np.zeros((groups, n // 4, lanes), np.uint32)
    xdp = np.zeros((groups, n_sb, lanes), np.float32)
    xbp = np.zeros((groups, n_sb, 4, lanes), np.int32)
    for b in prange(n_b):
        g = b // lanes
        lane = b - g * lanes
        row = xq[b].view(np.uint32)
        for k in range(n // 4):
            xp32[g, k, lane] = row[k] ^ np.uint32(0x80808080)  # + 128 in every byte
        for s in range(n_sb):
            xdp[g, s, lane] = xd[b, s]
            for p in range(4):
                lo = xb[b, s * 16 + 4 * p] + xb[b, s * 16 + 4 * p + 1]
                hi = xb[b, s * 16 + 4 * p + 2] + xb[b, s * 16 + 4 * p + 3]
                xbp[g, s, p, lane] = (lo & 0xFFFF) | (hi << 16)
    return xp32, xdp, xbp


@njit(cache=True)
def _pack_tile(blocks, o0, count, kind, wq, sc, corr, dd, dm, mp):
    """Unpack weight rows o0 .. o0 + count - 1 into rows 0.. of the tile arrays (see `_codegen`)."""
    for r in range(count):
        if kind == 0:
            q4_k_unpack(blocks[o0 + r], wq[r], sc[r], corr[r], dd[r], dm[r], mp[r])
        elif kind == 1:
            q5_k_unpack(blocks[o0 + r], wq[r], sc[r], corr[r], dd[r], dm[r], mp[r])
        else:
            q6_k_unpack(blocks[o0 + r], wq[r], sc[r], corr[r], dd[r], dm[r], mp[r])


@njit(inline="always", cache=True)
def _tile_call(kind, path, wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0):
    if kind == 0:
        if path == 2:
            q4_k_tile_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
        elif path == 1:
            q4_k_tile_avx2(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
        else:
            q4_k_tile_portable(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    elif kind == 1:
        if path == 2:
            q5_k_tile_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
        elif path == 1:
            q5_k_tile_avx2(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
        else:
            q5_k_tile_portable(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    elif path == 2:
        q6_k_tile_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    elif path == 1:
        q6_k_tile_avx2(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    else:
        q6_k_tile_portable(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)


@njit(inline="always", cache=True)
def _pair_call(kind, wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0):
    if kind == 0:
        q4_k_tile2_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    elif kind == 1:
        q5_k_tile2_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
    else:
        q6_k_tile2_vnni(wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)


@njit(cache=True, parallel=True)
def tiled_matmul(blocks, xp, xdp, xbp, n_b, out, kind, path, lanes, rows, threads):
    """out[:n_b] = the int8 product of K-quant `blocks` (kind 0 Q4_K, 1 Q5_K, 2 Q6_K) with the packed
    activations of `pack_activations`, through `path` (`lanes`, `rows`: its vector width and weight rows
    per call). `threads` workers (numba.get_num_threads(): read inside, it would keep the function from
    numba's cache) split the weight rows in tiles of TILE."""
    n_out = blocks.shape[0]
    n = xp.shape[1] * 4
    n_sb = n // 256
    subs = 16 if kind == 2 else 8
    groups = xp.shape[0]
    tiles = (n_out + TILE - 1) // TILE
    workers = max(1, min(threads, tiles))
    # 16 lanes (AVX-512 VNNI): two groups of lanes a call where two are left, sharing each broadcast
    paired = 2 if lanes == 16 else 1
    units = (groups + paired - 1) // paired
    for worker in prange(workers):  # one scratch tile per worker, reused: allocations cost microseconds
        wq = np.zeros((TILE, n), np.int8)
        sc = np.zeros((TILE, n_sb, subs), np.int32)
        corr = np.zeros((TILE, n_sb), np.int32)
        dd = np.zeros((TILE, n_sb), np.float32)
        dm = np.zeros((TILE, n_sb), np.float32)
        mp = np.zeros((TILE, n_sb, 4), np.int32)
        res = np.empty((2 * rows, lanes), np.float32)
        for t in range(worker, tiles, workers):
            o0 = t * TILE
            count = min(TILE, n_out - o0)
            _pack_tile(blocks, o0, count, kind, wq, sc, corr, dd, dm, mp)
            following = min(TILE, max(0, n_out - (t + workers) * TILE))  # this worker's next tile
            # the next tile's lines spread over every kernel call of this one: a burst of them at
            # once stalls the core until most arrive (measured at 16 activation rows, one group)
            calls = (count + rows - 1) // rows
            for u in range(units):
                g = u * paired
                together = min(paired, groups - g)
                for c in range(calls):
                    part = u * calls + c
                    prefetch_rows_part(blocks, (t + workers) * TILE, following, part, units * calls)
                    r0 = c * rows
                    if together == 2:
                        _pair_call(kind, wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
                    else:
                        _tile_call(kind, path, wq, sc, corr, dd, dm, mp, xp, xdp, xbp, res, g, r0)
                    for h in range(together):
                        valid = min(lanes, n_b - (g + h) * lanes)
                        store_tile(
                            out, res[h * rows :], (g + h) * lanes, o0 + r0, min(rows, count - r0), valid
                        )
