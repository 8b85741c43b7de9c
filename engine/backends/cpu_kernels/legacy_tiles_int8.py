"""Tiled int8 products of legacy-block weights (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1) with many activation rows:
prefill and batches of streams, where the row dots of simd_int8.py spend, for every activation row, a
conversion, a multiply and an fma on each 64 products (8 float lanes a block pair) on 256-bit vectors.

Here one vector lane holds one activation row (16 with AVX-512 VNNI, else 8), as in kquants_tiles_int8.py.
Each tile of TILE weight rows is unpacked once per call into signed bytes (Q4_0: q - 8, Q5_0: q - 16, the
others q) with its block scales as float32 and, per row lane of the row dots, -128 * the lane's weight sum;
the activations are packed once per call, four bytes of each row side by side, xq + 128 (unsigned, what
vpdpbusd and vpmaddubsw multiply). Then for lane k of block j (weights 4k..4k+3 and 16 + 4k..16 + 4k + 3)
two dot products of four bytes, a weight row's broadcast against every activation row's, give
    sum_i w_i (xq_i + 128) - 128 * sum_i w_i = sum_i w_i xq_i
the same exact int32 as the row dot's lane k, and the same float part follows in the same order: the
float lane (chain) 4 * (j % 2) + k gets acc = fma(d * xs, float(lane), acc) (Q4_1, Q5_1 and k = 0: then
acc = fma(m, xs * (the block's xq sum), acc), which in the row dots' other three lanes adds +0 to an
accumulator that is never -0), an odd last block goes to chains 0-3, and the eight chains are summed by
simd.sum_lanes' tree. So every out[b, o] has the bits the row dots give it, whichever kernel a call takes.
AVX2 has no vpdpbusd: vpmaddubsw of A and B, one vpaddw (|w| <= 31 against xq + 128 <= 255: every int16
sum stays exact), one vpmaddwd; Q8_0's |w| reaches 128 there, so it meets xq signed as llama.cpp does
(vpsignb, vpmaddubsw of |w|, A and B apart) and needs no -128 correction.
legacy_int8's bound kernels compile this file's driver into their own cache files; cache_freshness.py
drops them when this file changes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic, overload

from .kquants_tiles_int8 import _dot4, path_lanes
from .simd import fma, is_c_array, load_vec, splat, store_tile, tile_signature
from .simd_int8 import (
    _LAYOUTS,
    _OFFSETS,
    AVX2,
    PATH_NAMES,
    PORTABLE,
    VNNI,
    _halves_avx2,
    _pmaddubsw,
    _pmaddwd_ones,
    _psignb,
    available_paths,
    block_quants,
    concat,
    const_vec,
    half,
)

TILE = 16
"""Weight rows unpacked together (a work item)."""

NEVER = 1 << 62
"""`min_rows` where the row dots always win."""


def min_rows(kind: str, path: int) -> int:
    """Activation rows from which legacy_int8 takes the tiled kernel on int8 path `path` (fewer: the row
    dots, which decode each weight pair in registers for up to 8 rows, where a tile writes its unpacked
    rows out and reads them back). Measured by `scripts/bench_legacy_tiles.py --rows 16,24,32,64,128,256`
    (an 8192 x 2048 matrix, 2 threads, an Intel Xeon with AVX-512 VNNI), tiled / row-dot speed: VNNI Q4_0
    1.06x at 16 rows, 1.43x at 32, 1.68x at 256; Q8_0 1.09x, 1.19x, 1.63x; Q4_1 1.11x, 1.51x, 1.64x. The
    AVX2 path on the same CPU: Q4_0 0.92x at 16, 1.05x at 32, 1.07x at 64, 1.13x at 256; Q4_1 0.87x,
    1.00x, 1.04x, 1.12x; Q8_0 (vpsignb, A and B apart) 0.75-0.90x, so never. That one matrix stays in
    cache; decode steps of 16 streams read theirs from memory, where the row dots win below 32 rows
    (30 matrices of 16384 x 2048, 570 MB, 2 threads, medians of 5: VNNI Q4_0 0.82x at 16 rows, 0.85x at
    24, 1.23x at 32; Q8_0 0.81x, 0.91x, 1.16x; Q4_1 0.94x, 0.95x, 1.42x; 17 to 31 rows fill a second
    16-lane group only partly, so a tile costs what 32 rows do)."""
    paths = available_paths()
    if path == VNNI and VNNI in paths:
        return 32
    if path == AVX2 and AVX2 in paths and kind != "q8_0":
        return 64
    return NEVER


_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()

KINDS = tuple(_LAYOUTS)


def signed_activations(kind: str, path: int) -> bool:
    """Whether the kernel of (kind, path) reads xq as it is (AVX2's Q8_0) rather than xq + 128."""
    return kind == "q8_0" and path == AVX2 and AVX2 in available_paths()


def rows_per_call(lanes: int) -> int:
    """Weight rows one kernel call computes, sharing each load of packed activations: 2 in AVX-512's 32
    vector registers (16 accumulators), 1 in AVX2's 16."""
    return 2 if lanes == 16 else 1


def _lane_sum(builder, path, sign_trick, xa, wa, xb, wb, init):
    """init + the products of four bytes at A (xa, wa) and at B (xb, wb) per int32 lane (exact)."""
    lanes = init.type.count
    if path == VNNI:
        return _dot4(builder, path, _dot4(builder, path, init, xa, wa), xb, wb)
    if path == AVX2 and sign_trick:  # Q8_0: |w| x (xq signed as w), A and B apart (a pair reaches 2**15)
        halves = [
            _pmaddwd_ones(builder, _pmaddubsw(builder, _psignb(builder, w, w), _psignb(builder, x, w)))
            for w, x in ((wa, xa), (wb, xb))
        ]
        return builder.add(halves[0], halves[1])
    if path == AVX2 and lanes == 8:
        return builder.add(init, _halves_avx2(builder, xa, wa, xb, wb))
    return _dot4(builder, PORTABLE, _dot4(builder, PORTABLE, init, xa, wa), xb, wb)


def _codegen(kind: str, path: int, lanes: int, rows: int):
    has_min = _LAYOUTS[kind][2]
    sign_trick = signed_activations(kind, path)
    ity = ir.VectorType(_I32, lanes)
    fty = ir.VectorType(_F32, lanes)
    bty = ir.VectorType(_I8, 4 * lanes)
    chains = 8

    def codegen(context, builder, signature, args):
        wq, init, dd, dm, xp, xsp, xssp, res = (
            context.make_array(t)(context, builder, a)
            for t, a in zip(signature.args[:8], args[:8], strict=True)
        )
        g, r0 = args[8], args[9]
        n = builder.extract_value(wq.shape, 1)
        n_blocks = builder.udiv(n, ir.Constant(_I64, 32))
        n_pairs = builder.lshr(n_blocks, ir.Constant(_I64, 1))
        wq_ptr = builder.bitcast(wq.data, _I8.as_pointer())
        init_ptr = builder.bitcast(init.data, _I32.as_pointer())
        dd_ptr = builder.bitcast(dd.data, _F32.as_pointer())
        dm_ptr = builder.bitcast(dm.data, _F32.as_pointer())
        # this group's packed activations (n bytes of each of `lanes` rows), its xs and xs * sum per block
        xp_ptr = builder.gep(
            builder.bitcast(xp.data, _I8.as_pointer()),
            [builder.mul(g, builder.mul(n, ir.Constant(_I64, lanes)))],
        )
        group_blocks = builder.mul(g, builder.mul(n_blocks, ir.Constant(_I64, lanes)))
        xs_ptr = builder.gep(builder.bitcast(xsp.data, _F32.as_pointer()), [group_blocks])
        xss_ptr = builder.gep(builder.bitcast(xssp.data, _F32.as_pointer()), [group_blocks])
        row_ids = [builder.add(r0, ir.Constant(_I64, r)) for r in range(rows)]

        def block(k, accs, first_chain):
            """Each row's chains after block k, which adds into chains first_chain .. + 3."""
            accs = [list(a) for a in accs]
            x_blk = builder.gep(xp_ptr, [builder.mul(k, ir.Constant(_I64, 32 * lanes))])
            xs = load_vec(builder, builder.gep(xs_ptr, [builder.mul(k, ir.Constant(_I64, lanes))]), fty)
            xss = None
            if has_min:
                xss = load_vec(builder, builder.gep(xss_ptr, [builder.mul(k, ir.Constant(_I64, lanes))]), fty)
            xv = [
                load_vec(builder, builder.gep(x_blk, [ir.Constant(_I64, 4 * lanes * q)]), bty)
                for q in range(8)
            ]
            for r, row in enumerate(row_ids):
                at = builder.add(builder.mul(row, n_blocks), k)  # [rows, n_blocks]
                scale = builder.fmul(splat(builder, builder.load(builder.gep(dd_ptr, [at])), lanes), xs)
                w_blk = builder.gep(
                    wq_ptr, [builder.add(builder.mul(row, n), builder.mul(k, ir.Constant(_I64, 32)))]
                )
                init_at = builder.mul(at, ir.Constant(_I64, 4))
                for lane in range(4):

                    def weights(q, w_blk=w_blk):
                        ptr = builder.bitcast(
                            builder.gep(w_blk, [ir.Constant(_I64, 4 * q)]), _I32.as_pointer()
                        )
                        return builder.bitcast(splat(builder, builder.load(ptr, align=1), lanes), bty)

                    start = ir.Constant(ity, None)
                    if not sign_trick:
                        lane_init = builder.load(
                            builder.gep(init_ptr, [builder.add(init_at, ir.Constant(_I64, lane))])
                        )
                        start = splat(builder, lane_init, lanes)
                    total = _lane_sum(
                        builder,
                        path,
                        sign_trick,
                        xv[lane],
                        weights(lane),
                        xv[4 + lane],
                        weights(4 + lane),
                        start,
                    )
                    c = first_chain + lane
                    accs[r][c] = fma(builder, scale, builder.sitofp(total, fty), accs[r][c])
                    if has_min and lane == 0:
                        m = splat(builder, builder.load(builder.gep(dm_ptr, [at])), lanes)
                        accs[r][c] = fma(builder, m, xss, accs[r][c])
            return accs

        zero = ir.Constant(fty, None)
        entry = builder.block
        loop = builder.append_basic_block("pairs")
        after = builder.append_basic_block("after_pairs")
        tail = builder.append_basic_block("odd_block")
        done = builder.append_basic_block("store")
        builder.cbranch(builder.icmp_unsigned(">", n_pairs, ir.Constant(_I64, 0)), loop, after)

        builder.position_at_end(loop)
        p = builder.phi(_I64)
        phis = [[builder.phi(fty) for _ in range(chains)] for _ in range(rows)]
        k = builder.shl(p, ir.Constant(_I64, 1))
        new = block(k, phis, 0)
        new = block(builder.add(k, ir.Constant(_I64, 1)), new, 4)
        following = builder.add(p, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_pairs), loop, after)
        p.add_incoming(ir.Constant(_I64, 0), entry)
        p.add_incoming(following, loop_end)
        for row_phis, row_new in zip(phis, new, strict=True):
            for phi, value in zip(row_phis, row_new, strict=True):
                phi.add_incoming(zero, entry)
                phi.add_incoming(value, loop_end)

        builder.position_at_end(after)
        paired = []
        for row_new in new:
            merged = []
            for value in row_new:
                phi = builder.phi(fty)
                phi.add_incoming(zero, entry)
                phi.add_incoming(value, loop_end)
                merged.append(phi)
            paired.append(merged)
        odd = builder.trunc(builder.and_(n_blocks, ir.Constant(_I64, 1)), ir.IntType(1))
        builder.cbranch(odd, tail, done)

        builder.position_at_end(tail)  # the odd last block: chains 0-3, as the row dots' lanes 0-3
        with_tail = block(builder.sub(n_blocks, ir.Constant(_I64, 1)), paired, 0)
        tail_end = builder.block
        builder.branch(done)

        builder.position_at_end(done)
        all_finals = []  # every phi first, at the top of the block
        for r in range(rows):
            finals = []
            for c in range(chains):
                phi = builder.phi(fty)
                phi.add_incoming(paired[r][c], after)
                phi.add_incoming(with_tail[r][c], tail_end)
                finals.append(phi)
            all_finals.append(finals)
        res_ptr = builder.bitcast(res.data, _F32.as_pointer())
        for r, finals in enumerate(all_finals):
            # simd.sum_lanes' tree over the row dots' eight lanes: (0 + 4, 1 + 5, 2 + 6, 3 + 7), then
            # (those 0 + 2, 1 + 3), then 0 + 1
            fours = [builder.fadd(finals[c], finals[c + 4]) for c in range(4)]
            twos = [builder.fadd(fours[c], fours[c + 2]) for c in range(2)]
            total = builder.fadd(twos[0], twos[1])
            target = builder.gep(res_ptr, [ir.Constant(_I64, r * lanes)])
            builder.store(total, builder.bitcast(target, fty.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _make(kind: str, path: int):
    lanes = path_lanes(path)
    if path not in available_paths():
        path = PORTABLE
    rows = rows_per_call(lanes)

    def typer(typingctx, wq, init, dd, dm, xp, xsp, xssp, res, g, r0):
        arrays = (
            (wq, types.int8, 2),
            (init, types.int32, 2),
            (dd, types.float32, 2),
            (dm, types.float32, 2),
            (xp, types.uint32, 3),
            (xsp, types.float32, 3),
            (xssp, types.float32, 3),
            (res, types.float32, 2),
        )
        sig = tile_signature(arrays, g, r0)
        return None if sig is None else (sig, _codegen(kind, path, lanes, rows))

    typer.__name__ = f"{kind}_legacy_tile_{PATH_NAMES[path]}"
    return intrinsic(typer)


TILES = {(kind, path): _make(kind, path) for kind in KINDS for path in (PORTABLE, AVX2, VNNI)}
"""The tile intrinsics by (kind, int8 path)."""

SHAPES = {path: (path_lanes(path), rows_per_call(path_lanes(path))) for path in (PORTABLE, AVX2, VNNI)}
"""path -> (lanes, weight rows per call), read once (cpu_features() asks LLVM, 0.6 ms a call)."""


@njit(cache=True, parallel=True)
def pack_activations(xq, xs, lanes, signed):
    """(xp uint32 [G, n // 4, lanes], xsp float32 [G, n // 32, lanes], xssp float32 [G, n // 32, lanes])
    for G = ceil(B / lanes) groups: each four bytes of a row (+ 128 in every byte unless `signed`), each
    row's block scale xs, and xs * (the block's xq sum) as the row dots compute it. Lanes past B are 0."""
    n_b, n = xq.shape
    n_blocks = n // 32
    groups = (n_b + lanes - 1) // lanes
    xp = np.zeros((groups, n // 4, lanes), np.uint32)
    xsp = np.zeros((groups, n_blocks, lanes), np.float32)
    xssp = np.zeros((groups, n_blocks, lanes), np.float32)
    flip = np.uint32(0) if signed else np.uint32(0x80808080)
    for b in prange(n_b):
        g = b // lanes
        lane = b - g * lanes
        row = xq[b].view(np.uint32)
        for k in range(n // 4):
            xp[g, k, lane] = row[k] ^ flip
        for k in range(n_blocks):
            total = np.int32(0)
            for i in range(32 * k, 32 * k + 32):
                total += np.int32(xq[b, i])
            xsp[g, k, lane] = xs[b, k]
            xssp[g, k, lane] = xs[b, k] * np.float32(total)
    return xp, xsp, xssp


def _unpack_codegen(kind: str):
    block_bytes, _, has_min, _ = _LAYOUTS[kind]
    offset = _OFFSETS.get(kind, 0)
    v32 = ir.VectorType(_I8, 32)
    v4 = ir.VectorType(_I32, 4)
    fast_sums = AVX2 in available_paths()

    def codegen(context, builder, signature, args):
        row, wq, init, dd, dm = (
            context.make_array(t)(context, builder, a) for t, a in zip(signature.args, args, strict=True)
        )
        n_blocks = builder.udiv(builder.extract_value(wq.shape, 0), ir.Constant(_I64, 32))
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        wq_ptr = builder.bitcast(wq.data, _I8.as_pointer())
        init_ptr = builder.bitcast(init.data, _I32.as_pointer())
        dd_ptr = builder.bitcast(dd.data, _F32.as_pointer())
        dm_ptr = builder.bitcast(dm.data, _F32.as_pointer())

        def half_at(blk, at):
            bits = builder.load(builder.bitcast(builder.gep(blk, [ir.Constant(_I64, at)]), _I16.as_pointer()))
            return builder.fpext(builder.bitcast(bits, ir.HalfType()), _F32)

        entry = builder.block
        loop = builder.append_basic_block("unpack")
        done = builder.append_basic_block("unpacked")
        builder.cbranch(builder.icmp_unsigned(">", n_blocks, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(_I64)
        blk = builder.gep(row_ptr, [builder.mul(k, ir.Constant(_I64, block_bytes))])
        builder.store(half_at(blk, 0), builder.gep(dd_ptr, [k]))
        if has_min:  # d, then m
            builder.store(half_at(blk, 2), builder.gep(dm_ptr, [k]))
        weights = concat(builder, *block_quants(builder, kind, blk))
        if offset:
            weights = builder.sub(weights, const_vec(v32, offset))
        w_at = builder.gep(wq_ptr, [builder.mul(k, ir.Constant(_I64, 32))])
        builder.store(weights, builder.bitcast(w_at, v32.as_pointer()), align=1)
        # per row-dot lane l: -128 * (weights 4l..4l+3 + weights 16 + 4l..16 + 4l + 3); with AVX2 the
        # sums of four by one vpmaddubsw against ones and one vpmaddwd (a third of the widening's time)
        if fast_sums:
            quads = _pmaddwd_ones(builder, _pmaddubsw(builder, const_vec(v32, 1), weights))
            lanes = builder.add(half(builder, quads, 0), half(builder, quads, 1))
        else:
            wide = builder.sext(weights, ir.VectorType(_I32, 32))
            lanes = None
            for part in range(8):
                picked = builder.shuffle_vector(
                    wide, wide, ir.Constant(v4, [4 * lane + part % 4 + 16 * (part // 4) for lane in range(4)])
                )
                lanes = picked if lanes is None else builder.add(lanes, picked)
        correction = builder.mul(lanes, const_vec(v4, -128))
        i_at = builder.gep(init_ptr, [builder.mul(k, ir.Constant(_I64, 4))])
        builder.store(correction, builder.bitcast(i_at, v4.as_pointer()), align=4)
        following = builder.add(k, ir.Constant(_I64, 1))
        loop_end = builder.block
        builder.cbranch(builder.icmp_unsigned("<", following, n_blocks), loop, done)
        k.add_incoming(ir.Constant(_I64, 0), entry)
        k.add_incoming(following, loop_end)
        builder.position_at_end(done)
        return context.get_dummy_value()

    return codegen


def _make_unpack(kind: str):
    def typer(typingctx, row, wq, init, dd, dm):
        arrays = (
            (row, types.uint8, 1),
            (wq, types.int8, 1),
            (init, types.int32, 1),
            (dd, types.float32, 1),
            (dm, types.float32, 1),
        )
        if not all(is_c_array(a, t, n) for a, t, n in arrays):
            return None
        return types.void(row, wq, init, dd, dm), _unpack_codegen(kind)

    typer.__name__ = f"{kind}_legacy_unpack"
    typer.__doc__ = f"""(row uint8, wq int8 [n], init int32 [n // 8], dd float32 [n // 32], dm) -> None: the
    {kind.upper()} row's weights as signed bytes, per row-dot lane -128 * its weight sum, the block
    scales (and mins) as float32."""
    return intrinsic(typer)


UNPACKS = {kind: _make_unpack(kind) for kind in KINDS}
"""The row unpack intrinsics by kind."""


def _tile(kind, path, wq, init, dd, dm, xp, xsp, xssp, res, g, r0):
    """The tile intrinsic of type `kind` on int8 path `path` (literals), resolved at compile time."""
    raise NotImplementedError  # only called from compiled code


@overload(_tile, inline="always")
def _tile_of(kind, path, wq, init, dd, dm, xp, xsp, xssp, res, g, r0):
    """The intrinsic `_tile` names, from TILES."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(path, types.IntegerLiteral)):
        return None
    tile = TILES[(kind.literal_value, path.literal_value)]

    def call(kind, path, wq, init, dd, dm, xp, xsp, xssp, res, g, r0):
        tile(wq, init, dd, dm, xp, xsp, xssp, res, g, r0)

    return call


def _unpack(kind, row, wq, init, dd, dm):
    """The unpack intrinsic of type `kind` (a literal), resolved at compile time."""
    raise NotImplementedError  # only called from compiled code


@overload(_unpack, inline="always")
def _unpack_of(kind, row, wq, init, dd, dm):
    """The intrinsic `_unpack` names, from UNPACKS."""
    if not isinstance(kind, types.StringLiteral):
        return None
    unpack = UNPACKS[kind.literal_value]

    def call(kind, row, wq, init, dd, dm):
        unpack(row, wq, init, dd, dm)

    return call


def tiled_from(kind, path):
    """min_rows(kind, path) for literal kind and path, in compiled code."""
    raise NotImplementedError  # only called from compiled code


@overload(tiled_from, inline="always")
def _tiled_from_of(kind, path):
    """The constant min_rows(kind, path)."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(path, types.IntegerLiteral)):
        return None
    rows = min_rows(kind.literal_value, path.literal_value)
    return lambda kind, path: rows


def _plan(kind, path):
    raise NotImplementedError  # only called from compiled code


@overload(_plan, inline="always")
def _plan_of(kind, path):
    """(whether the activations go in signed, lanes, weight rows per call) for literal
    kind and path, as the tile intrinsic of (kind, path) expects them."""
    if not (isinstance(kind, types.StringLiteral) and isinstance(path, types.IntegerLiteral)):
        return None
    signed = signed_activations(kind.literal_value, path.literal_value)
    lanes, rows = SHAPES[path.literal_value]
    return lambda kind, path: (signed, lanes, rows)


WORKERS = 16
"""Parallel work items per call: each takes every WORKERS-th tile with one scratch tile (allocated once)."""


# Not cached itself (legacy_int8._matmul, its caller, says why): compiled into each bound kernel.
@njit(parallel=True)
def tiled_matmul(blocks, xq, xs, out, kind, path):
    """out = the int8 product of legacy `blocks` of type `kind` with the activations (xq, xs), every
    activation row in a vector lane; the bits of the row dots (simd_int8.py)."""
    numba.literally(kind)
    numba.literally(path)
    signed, lanes, rows = _plan(kind, path)
    xp, xsp, xssp = pack_activations(xq, xs, lanes, signed)
    n_b, n = xq.shape
    n_blocks = n // 32
    n_out = blocks.shape[0]
    groups = xp.shape[0]
    tiles = (n_out + TILE - 1) // TILE
    workers = min(WORKERS, tiles)
    for worker in prange(workers):
        wq = np.zeros((TILE, n), np.int8)
        init = np.zeros((TILE, 4 * n_blocks), np.int32)
        dd = np.zeros((TILE, n_blocks), np.float32)
        dm = np.zeros((TILE, n_blocks), np.float32)
        res = np.empty((rows, lanes), np.float32)
        for t in range(worker, tiles, workers):
            o0 = t * TILE
            count = min(TILE, n_out - o0)
            for r in range(count):
                _unpack(kind, blocks[o0 + r], wq[r], init[r], dd[r], dm[r])
            for g in range(groups):
                valid = min(lanes, n_b - g * lanes)
                for r0 in range(0, count, rows):
                    _tile(kind, path, wq, init, dd, dm, xp, xsp, xssp, res, g, r0)
                    store_tile(out, res, g * lanes, o0 + r0, min(rows, count - r0), valid)


@functools.cache
def tiled_kernel(kind: str, path: int) -> Callable[..., None]:
    """`tiled_matmul` for one type (a simd_int8 kind name) and int8 path as a compiled function (blocks,
    xq, xs, out), whatever the number of activation rows (legacy_int8's kernels take it from
    `min_rows`): for the tests and the benchmark, which hold it against the row dots."""

    def bound(blocks, xq, xs, out):
        tiled_matmul(blocks, xq, xs, out, kind, path)

    bound.__qualname__ = f"{kind}_tiled_{PATH_NAMES[path]}"
    return njit(cache=True)(bound)
