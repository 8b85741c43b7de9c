"""Int8-activation row dot products on raw legacy blocks, as LLVM vector IR (numba @intrinsic).

Per 32-weight block and activation row: the 32 weight bytes against the 32 int8 activations give eight
exact int32 lane sums (lane j = bytes 4j..4j+3), computed by one of three paths:
    vnni:     vpdpbusd (unsigned weight bytes x signed activations), AVX-512 VNNI or AVX-VNNI
    avx2:     vpmaddubsw + vpmaddwd (Q8_0 through vpsignb, as llama.cpp does)
    portable: widen to int32, multiply, add in fours (LLVM picks the instructions)
Unsigned weight bytes need a correction from the activation lane sums `xl` (Q4_0: q - 8 -> -8 * xl;
Q8_0 on vnni: w + 128 -> -128 * xl). Integer sums are exact, so the three paths give the same lanes and
the same float results bit for bit. Then, in float32 and in a fixed order: per block
acc = fma(d * xs, lanes, acc) (Q4_1 also accm = fma(m * xs, xl, accm)), alternate blocks in two
chains, chains added, the eight lanes summed by a fixed tree. A path the host lacks compiles as portable.
As for simd.py, numba's cache does not see edits here: touch legacy.py after changing this file.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .features import cpu_features
from .simd import fma, load_half, load_vec, splat, sum_lanes

PORTABLE, AVX2, VNNI = 0, 1, 2
"""int8 paths (the `path` argument of the int8 kernels)."""

_I8 = ir.IntType(8)
_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_I64 = ir.IntType(64)
_F32 = ir.FloatType()
_V16I8 = ir.VectorType(_I8, 16)
_V32I8 = ir.VectorType(_I8, 32)
_V16I16 = ir.VectorType(_I16, 16)
_V8I32 = ir.VectorType(_I32, 8)
_V32I32 = ir.VectorType(_I32, 32)
_V8F = ir.VectorType(_F32, 8)

_LAYOUTS = {"q4_0": (18, 2, False, True), "q4_1": (20, 4, True, True), "q8_0": (34, 2, False, False)}


def available_paths() -> tuple[int, ...]:
    """The int8 paths this host can run, best last."""
    features = cpu_features()
    paths = [PORTABLE]
    if features.avx2:
        paths.append(AVX2)
    if features.avx512_vnni or features.avx_vnni:
        paths.append(VNNI)
    return tuple(paths)


def _const(vty: ir.VectorType, value: int) -> ir.Constant:
    return ir.Constant(vty, [value] * vty.count)


def _intrinsic_call(builder, name, ret, args):
    module = builder.module
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, [a.type for a in args]), name)
    return builder.call(fn, args)


def _lane_sums(builder, kind: str, path: int, weights, xv, xl):
    """Exact int32 lanes: lane j = sum over bytes 4j..4j+3 of weight * activation (true weight values)."""
    nibbles = kind != "q8_0"
    if path == PORTABLE:
        if nibbles:
            w32 = builder.zext(weights, _V32I32)
            if kind == "q4_0":
                w32 = builder.sub(w32, _const(_V32I32, 8))
        else:
            w32 = builder.sext(weights, _V32I32)
        prod = builder.mul(w32, builder.sext(xv, _V32I32))
        lanes = None
        for t in range(4):
            part = builder.shuffle_vector(
                prod, prod, ir.Constant(ir.VectorType(_I32, 8), [4 * j + t for j in range(8)])
            )
            lanes = part if lanes is None else builder.add(lanes, part)
        return lanes
    if path == VNNI:
        unsigned = weights if nibbles else builder.xor(weights, _const(_V32I8, 0x80))
        lanes = _intrinsic_call(
            builder, "llvm.x86.avx512.vpdpbusd.256", _V8I32, [ir.Constant(_V8I32, None), unsigned, xv]
        )
        if kind == "q4_0":
            lanes = builder.sub(lanes, builder.shl(xl, _const(_V8I32, 3)))
        elif kind == "q8_0":
            lanes = builder.sub(lanes, builder.shl(xl, _const(_V8I32, 7)))
        return lanes
    # AVX2
    if nibbles:
        unsigned, signed = weights, xv
    else:
        unsigned = _intrinsic_call(builder, "llvm.x86.avx2.psign.b", _V32I8, [weights, weights])
        signed = _intrinsic_call(builder, "llvm.x86.avx2.psign.b", _V32I8, [xv, weights])
    pairs = _intrinsic_call(builder, "llvm.x86.avx2.pmadd.ub.sw", _V16I16, [unsigned, signed])
    lanes = _intrinsic_call(builder, "llvm.x86.avx2.pmadd.wd", _V8I32, [pairs, _const(_V16I16, 1)])
    if kind == "q4_0":
        lanes = builder.sub(lanes, builder.shl(xl, _const(_V8I32, 3)))
    return lanes


def _codegen(kind: str, rows: int, path: int):
    block_bytes, quant_offset, has_min, nibbles = _LAYOUTS[kind]
    if path not in available_paths():
        path = PORTABLE

    def codegen(context, builder, signature, args):
        row_ty, xq_ty, xl_ty, xs_ty = signature.args[:4]
        row = context.make_array(row_ty)(context, builder, args[0])
        xqa = context.make_array(xq_ty)(context, builder, args[1])
        xla = context.make_array(xl_ty)(context, builder, args[2])
        xsa = context.make_array(xs_ty)(context, builder, args[3])
        b0 = args[4]
        row_ptr = builder.bitcast(row.data, _I8.as_pointer())
        n = builder.extract_value(xqa.shape, 1)
        n_blocks = builder.udiv(n, ir.Constant(_I64, 32))
        xq_rows, xl_rows, xs_rows = [], [], []
        for r in range(rows):
            b = builder.add(b0, ir.Constant(_I64, r))
            xq_rows.append(builder.gep(builder.bitcast(xqa.data, _I8.as_pointer()), [builder.mul(b, n)]))
            xl_rows.append(
                builder.gep(
                    builder.bitcast(xla.data, _I32.as_pointer()),
                    [builder.mul(b, builder.mul(n_blocks, ir.Constant(_I64, 8)))],
                )
            )
            xs_rows.append(
                builder.gep(builder.bitcast(xsa.data, _F32.as_pointer()), [builder.mul(b, n_blocks)])
            )
        zero = ir.Constant(_V8F, None)
        chains = 4 if has_min else 2

        entry = builder.block
        loop = builder.append_basic_block("blocks")
        done = builder.append_basic_block("reduce")
        builder.cbranch(builder.icmp_unsigned(">", n_blocks, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        k = builder.phi(_I64)
        accs = [[builder.phi(_V8F) for _ in range(chains)] for _ in range(rows)]
        blk = builder.gep(row_ptr, [builder.mul(k, ir.Constant(_I64, block_bytes))])
        d = load_half(builder, blk)
        m = load_half(builder, builder.gep(blk, [ir.Constant(_I64, 2)])) if has_min else None
        qp = builder.gep(blk, [ir.Constant(_I64, quant_offset)])
        if nibbles:
            q = load_vec(builder, qp, _V16I8)
            lo = builder.and_(q, _const(_V16I8, 15))
            hi = builder.lshr(q, _const(_V16I8, 4))
            weights = builder.shuffle_vector(lo, hi, ir.Constant(ir.VectorType(_I32, 32), list(range(32))))
        else:
            weights = load_vec(builder, qp, _V32I8)
        new_accs = []
        for r in range(rows):
            xv = load_vec(builder, builder.gep(xq_rows[r], [builder.mul(k, ir.Constant(_I64, 32))]), _V32I8)
            xl = load_vec(builder, builder.gep(xl_rows[r], [builder.mul(k, ir.Constant(_I64, 8))]), _V8I32)
            xs = builder.load(builder.gep(xs_rows[r], [k]))
            lanes = _lane_sums(builder, kind, path, weights, xv, xl)
            new = [
                fma(builder, splat(builder, builder.fmul(d, xs), 8), builder.sitofp(lanes, _V8F), accs[r][0])
            ]
            if has_min:
                new.append(
                    fma(builder, splat(builder, builder.fmul(m, xs), 8), builder.sitofp(xl, _V8F), accs[r][2])
                )
            new_accs.append(new)
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
        finals = []
        for r in range(rows):
            row_finals = []
            for pair in range(chains // 2):
                for value in (accs[r][2 * pair + 1], new_accs[r][pair]):
                    phi = builder.phi(_V8F)
                    phi.add_incoming(zero, entry)
                    phi.add_incoming(value, loop_end)
                    row_finals.append(phi)
            finals.append(row_finals)
        results = []
        for row_finals in finals:
            total = builder.fadd(row_finals[0], row_finals[1])
            if has_min:
                total = builder.fadd(total, builder.fadd(row_finals[2], row_finals[3]))
            results.append(sum_lanes(builder, total))
        return context.make_tuple(builder, signature.return_type, results)

    return codegen


def _check(row, xq, xl, xs, b0) -> bool:
    arrays = ((row, types.uint8, 1), (xq, types.int8, 2), (xl, types.int32, 2), (xs, types.float32, 2))
    return isinstance(b0, types.Integer) and all(
        isinstance(a, types.Array) and a.dtype == dtype and a.ndim == ndim and a.layout == "C"
        for a, dtype, ndim in arrays
    )


def _make(kind: str, rows: int, path: int):
    def typer(typingctx, row, xq, xl, xs, b0):
        if not _check(row, xq, xl, xs, b0):
            return None
        sig = types.UniTuple(types.float32, rows)(row, xq, xl, xs, types.int64)
        return sig, _codegen(kind, rows, path)

    typer.__name__ = f"{kind}_i8dot{rows}_{('portable', 'avx2', 'vnni')[path]}"
    typer.__doc__ = f"""(row uint8, xq int8 [B, n], xl int32 [B, n // 4], xs float32 [B, n // 32], b0) -> the
    {rows} int8-activation dot products of the {kind.upper()} row with rows b0.. of xq."""
    return intrinsic(typer)


# module-level names (numba resolves intrinsics as globals): <type>_<path><rows>, 1 to 4 rows
q4_0_portable1, q4_0_portable2, q4_0_portable3, q4_0_portable4 = (
    _make("q4_0", r, PORTABLE) for r in (1, 2, 3, 4)
)
q4_0_avx21, q4_0_avx22, q4_0_avx23, q4_0_avx24 = (_make("q4_0", r, AVX2) for r in (1, 2, 3, 4))
q4_0_vnni1, q4_0_vnni2, q4_0_vnni3, q4_0_vnni4 = (_make("q4_0", r, VNNI) for r in (1, 2, 3, 4))
q4_1_portable1, q4_1_portable2, q4_1_portable3, q4_1_portable4 = (
    _make("q4_1", r, PORTABLE) for r in (1, 2, 3, 4)
)
q4_1_avx21, q4_1_avx22, q4_1_avx23, q4_1_avx24 = (_make("q4_1", r, AVX2) for r in (1, 2, 3, 4))
q4_1_vnni1, q4_1_vnni2, q4_1_vnni3, q4_1_vnni4 = (_make("q4_1", r, VNNI) for r in (1, 2, 3, 4))
q8_0_portable1, q8_0_portable2, q8_0_portable3, q8_0_portable4 = (
    _make("q8_0", r, PORTABLE) for r in (1, 2, 3, 4)
)
q8_0_avx21, q8_0_avx22, q8_0_avx23, q8_0_avx24 = (_make("q8_0", r, AVX2) for r in (1, 2, 3, 4))
q8_0_vnni1, q8_0_vnni2, q8_0_vnni3, q8_0_vnni4 = (_make("q8_0", r, VNNI) for r in (1, 2, 3, 4))
