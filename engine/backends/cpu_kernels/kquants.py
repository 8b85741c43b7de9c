"""Numba kernels on raw GGUF K-quant blocks: Q4_K, Q5_K and Q6_K (256-weight super-blocks).

Block layouts (little endian, as gguf/quants.py and llama.cpp's ggml-common.h define them):
- Q4_K, 144 bytes: d f16, dmin f16, 12 bytes of 6-bit sub-block scales and mins packed as below,
  128 bytes of nibbles. Sub-block j (32 weights) is the low (j even) or high (j odd) nibble of
  bytes 32 * (j // 2) .. +31; weight = d * sc[j] * q - dmin * m[j].
- Q5_K, 176 bytes: d, dmin, the same 12 scale bytes, qh 32 bytes (bit j of qh[i] is the fifth bit of
  weight i of sub-block j), then the 128 nibble bytes as in Q4_K.
- Q6_K, 210 bytes: ql 128 bytes (low nibbles), qh 64 bytes (2 high bits), 16 int8 scales (one per 16
  weights), d f16 last; weight = d * scale[w // 16] * (q - 32).

How the matmuls work: each task (ROWS_PER_TASK output rows, `prange` over tasks, so over output rows
only) works out one weight row's sub-block scales and mins (exactly as gguf rounds them), then decodes
the row 64 weights at a time in vector registers and dots them with 1 to 4 activation rows at once
(kquants_simd.py). Each weight is exactly gguf's dequantized value, and each dot runs in one order
fixed in the code (64 lanes in order, a fixed tree), so out[b, o] is bit-identical however the batch is
composed (batch invariance). `_matmul` is the kernels' first form, kept as the tests' reference: the
same bits through a dequantized float32 row and `_vdot`. The int8 kernels run the same dot on xq * xs
(see the note above them).
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.extending import intrinsic

from infer.engine.backends.cpu_kernels import kquants_simd
from infer.engine.backends.cpu_kernels.bits import half_to_f32
from infer.engine.backends.cpu_kernels.registry import QuantKernels
from infer.engine.backends.cpu_kernels.simd import exit_values, store_column, sum_lanes

QK_K = 256
"""Weights per super-block."""
Q4_K_BYTES = 144
Q5_K_BYTES = 176
Q6_K_BYTES = 210
ROWS_PER_TASK = 8
"""Output rows per parallel task: scratch buffers are allocated once per task, not once per row."""


# ---------------------------------------------------------------------------------------------------
# Shared helpers
# ---------------------------------------------------------------------------------------------------


@njit(cache=True, inline="always")
def _scales_mins(row: np.ndarray, off: int, ds: np.ndarray, dm: np.ndarray, at: int) -> None:
    """Q4_K/Q5_K: ds[at + j] = d * sc[j], dm[at + j] = dmin * m[j] (float32, rounded as gguf does) for
    the eight sub-blocks of the super-block at byte `off`."""
    d = half_to_f32(row[off], row[off + 1])
    dmin = half_to_f32(row[off + 2], row[off + 3])
    s = off + 4
    for j in range(4):
        ds[at + j] = d * np.float32(row[s + j] & 0x3F)
        dm[at + j] = dmin * np.float32(row[s + 4 + j] & 0x3F)
    for j in range(4, 8):
        sc = (row[s + j + 4] & 0x0F) | ((row[s + j - 4] >> 6) << 4)
        mn = (row[s + j + 4] >> 4) | ((row[s + j] >> 6) << 4)
        ds[at + j] = d * np.float32(sc)
        dm[at + j] = dmin * np.float32(mn)


@njit(cache=True, inline="always")
def _scales_q6(row: np.ndarray, off: int, ds: np.ndarray, at: int) -> None:
    """Q6_K: ds[at + k] = d * scale[k] (float32) for the 16 sub-blocks of the super-block at `off`."""
    d = half_to_f32(row[off + 208], row[off + 209])
    for k in range(16):
        sc = np.int32(row[off + 192 + k])
        if sc >= 128:
            sc -= 256
        ds[at + k] = d * np.float32(sc)


# The unpack loops below run over i (a byte position within a group) with all groups of the super-block
# in the body, on slices that start at 0: the body is too large for LLVM to unroll the loop fully (numba
# leaves SLP vectorisation off, so a fully unrolled loop stays scalar) and every index is provably
# non-negative (no wrap-around select, so contiguous vector loads/stores instead of gathers). Bit fields
# are cut with exact float32 arithmetic (floor(v / 2**k)) rather than integer shifts and masks: numba
# widens integer scalars to 64 bits, which would quarter the vector width.

_F16 = np.float32(16.0)
_F32 = np.float32(32.0)
_F4 = np.float32(4.0)


@njit(cache=True)
def _shr(v: np.float32, k: int) -> np.float32:
    """floor(v / 2**k) for a non-negative integer-valued float32 v: the integer shift v >> k, exactly."""
    return np.floor(v * np.float32(1.0 / (1 << k)))


@njit(cache=True)
def _deq_q4(row: np.ndarray, off: int, w: np.ndarray, ds: np.ndarray, dm: np.ndarray) -> None:
    """Q4_K super-block at `off` -> 256 float32 weights in w (a 256-slice): ds[j] * q - dm[j]."""
    qs = row[off + 16 : off + 144]
    for i in range(32):
        for g in range(4):
            v = np.float32(qs[32 * g + i])
            up = _shr(v, 4)
            lo = v - _F16 * up
            w[64 * g + i] = ds[2 * g] * lo - dm[2 * g]
            w[64 * g + 32 + i] = ds[2 * g + 1] * up - dm[2 * g + 1]


@njit(cache=True)
def _put_q5(
    w: np.ndarray,
    ds: np.ndarray,
    dm: np.ndarray,
    g: int,
    i: int,
    v: np.float32,
    b0: np.float32,
    b1: np.float32,
) -> None:
    """Q5_K: the two weights byte i of nibble group g gives, high bits b0 (sub-block 2g), b1 (2g + 1)."""
    up = _shr(v, 4)
    lo = v - _F16 * up
    w[64 * g + i] = ds[2 * g] * (lo + _F16 * b0) - dm[2 * g]
    w[64 * g + 32 + i] = ds[2 * g + 1] * (up + _F16 * b1) - dm[2 * g + 1]


@njit(cache=True)
def _deq_q5(row: np.ndarray, off: int, w: np.ndarray, ds: np.ndarray, dm: np.ndarray) -> None:
    """Q5_K super-block at `off` -> 256 float32 weights in w: ds[j] * (low nibble + 16 * bit j) - dm[j]."""
    qh = row[off + 16 : off + 48]
    qs = row[off + 48 : off + 176]
    two = np.float32(2.0)
    for i in range(32):
        h0 = np.float32(qh[i])
        h1 = _shr(h0, 1)
        h2 = _shr(h0, 2)
        h3 = _shr(h0, 3)
        h4 = _shr(h0, 4)
        h5 = _shr(h0, 5)
        h6 = _shr(h0, 6)
        h7 = _shr(h0, 7)
        _put_q5(w, ds, dm, 0, i, np.float32(qs[i]), h0 - two * h1, h1 - two * h2)
        _put_q5(w, ds, dm, 1, i, np.float32(qs[32 + i]), h2 - two * h3, h3 - two * h4)
        _put_q5(w, ds, dm, 2, i, np.float32(qs[64 + i]), h4 - two * h5, h5 - two * h6)
        _put_q5(w, ds, dm, 3, i, np.float32(qs[96 + i]), h6 - two * h7, h7)


@njit(cache=True)
def _deq_q6(row: np.ndarray, off: int, w: np.ndarray, ds: np.ndarray) -> None:
    """Q6_K super-block at `off` -> 256 float32 weights in w: ds[w // 16] * (q - 32)."""
    ql = row[off : off + 128]
    qh = row[off + 128 : off + 192]
    for i in range(16):
        for h in range(2):
            for u in range(2):
                # weight 128h + 32s + 16u + i lies in sub-block 8h + 2s + u
                c = 16 * u + i
                v0 = np.float32(ql[64 * h + c])
                v1 = np.float32(ql[64 * h + 32 + c])
                hb = np.float32(qh[32 * h + c])
                u0 = _shr(v0, 4)
                u1 = _shr(v1, 4)
                t2 = _shr(hb, 2)
                t4 = _shr(hb, 4)
                t6 = _shr(hb, 6)
                q0 = (v0 - _F16 * u0) + _F16 * (hb - _F4 * t2) - _F32
                q1 = (v1 - _F16 * u1) + _F16 * (t2 - _F4 * t4) - _F32
                q2 = u0 + _F16 * (t4 - _F4 * t6) - _F32
                q3 = u1 + _F16 * t6 - _F32
                sub = 8 * h + u
                w[128 * h + c] = ds[sub] * q0
                w[128 * h + 32 + c] = ds[sub + 2] * q1
                w[128 * h + 64 + c] = ds[sub + 4] * q2
                w[128 * h + 96 + c] = ds[sub + 6] * q3


@njit(cache=True)
def _deq_row(row: np.ndarray, kind: int, w: np.ndarray, ds: np.ndarray, dm: np.ndarray) -> None:
    """One whole row of `kind` (0 Q4_K, 1 Q5_K, 2 Q6_K) -> float32 w [len(w)], exactly as gguf rounds."""
    n_sb = w.shape[0] // QK_K
    for sb in range(n_sb):
        ws = w[QK_K * sb : QK_K * sb + QK_K]
        if kind == 0:
            off = sb * Q4_K_BYTES
            _scales_mins(row, off, ds, dm, 0)
            _deq_q4(row, off, ws, ds, dm)
        elif kind == 1:
            off = sb * Q5_K_BYTES
            _scales_mins(row, off, ds, dm, 0)
            _deq_q5(row, off, ws, ds, dm)
        else:
            off = sb * Q6_K_BYTES
            _scales_q6(row, off, ds, 0)
            _deq_q6(row, off, ws, ds)


DOT_LANES = 16
"""float32 lanes per LLVM vector in the dot."""
DOT_VECTORS = 4
"""Independent vector accumulators (hides the add latency): 64 lanes in all."""


def _dot_codegen(context, builder, signature, args):
    """LLVM IR of _vdot. Vector fmul/fadd are exact IEEE per element, so each lane's chain is the scalar
    chain written here, whatever the target's register width."""
    wa = context.make_array(signature.args[0])(context, builder, args[0])
    xa = context.make_array(signature.args[1])(context, builder, args[1])
    n = args[2]
    i64 = ir.IntType(64)
    vec = ir.VectorType(ir.FloatType(), DOT_LANES)
    zero = ir.Constant(vec, [0.0] * DOT_LANES)
    entry = builder.basic_block
    loop = builder.append_basic_block("vdot.loop")
    done = builder.append_basic_block("vdot.done")
    builder.cbranch(builder.icmp_signed(">", n, ir.Constant(i64, 0)), loop, done)
    builder.position_at_end(loop)
    i = builder.phi(i64)
    i.add_incoming(ir.Constant(i64, 0), entry)
    accs = [builder.phi(vec) for _ in range(DOT_VECTORS)]  # LLVM wants the phis first in the block
    new = []
    for j, acc in enumerate(accs):
        acc.add_incoming(zero, entry)
        off = builder.add(i, ir.Constant(i64, DOT_LANES * j))
        wv = builder.load(builder.bitcast(builder.gep(wa.data, [off]), vec.as_pointer()), align=4)
        xv = builder.load(builder.bitcast(builder.gep(xa.data, [off]), vec.as_pointer()), align=4)
        new.append(builder.fadd(acc, builder.fmul(wv, xv)))
    nxt = builder.add(i, ir.Constant(i64, DOT_LANES * DOT_VECTORS))
    body_end = builder.basic_block
    i.add_incoming(nxt, body_end)
    for acc, v in zip(accs, new, strict=True):
        acc.add_incoming(v, body_end)
    builder.cbranch(builder.icmp_signed("<", nxt, n), loop, done)
    builder.position_at_end(done)
    fin = exit_values(builder, new, entry, body_end)
    return sum_lanes(builder, builder.fadd(builder.fadd(fin[0], fin[1]), builder.fadd(fin[2], fin[3])))


@intrinsic
def _vdot(typingctx, w, x, n):
    """sum_i w[i] * x[i] for i < n (n a multiple of 64; w, x C-contiguous float32) in one fixed order:
    64 lanes (four vectors of 16), lane l takes i = l mod 64 in order; then (v0 + v1) + (v2 + v3) and a
    halving tree over the 16 lanes (8, 4, 2, 1). Emitted as LLVM vector IR: numba's plain loops get no
    SLP vectorisation and cannot vectorise a float reduction without reassociation, which would leave
    the order to the compiler."""
    for arr in (w, x):
        if not (isinstance(arr, types.Array) and arr.ndim == 1 and arr.layout == "C"):
            return None
        if arr.dtype != types.float32:
            return None
    if not isinstance(n, types.Integer):
        return None
    return types.float32(w, x, types.int64), _dot_codegen


@njit(cache=True)
def check_shapes(blocks: np.ndarray, n_in: int, block_bytes: int, n_b: int, out: np.ndarray) -> None:
    """Refuse shapes the kernels cannot serve (K-quant rows are whole 256-weight super-blocks)."""
    if n_in % QK_K != 0:
        raise ValueError("K-quant kernels need an input width that is a multiple of 256")
    if blocks.shape[1] != (n_in // QK_K) * block_bytes:
        raise ValueError("blocks row length does not match the input width")
    if out.shape[0] != n_b or out.shape[1] != blocks.shape[0]:
        raise ValueError("out must be [B, out_rows]")


@njit(cache=True, parallel=True)
def _matmul(blocks: np.ndarray, x: np.ndarray, out: np.ndarray, kind: int) -> None:
    """out = x @ W.T: each weight row dequantized once into an L1-resident float32 buffer (the values
    gguf's dequantizer gives), then one fixed-order dot per activation row. The reference the
    register-decoding kernels below are tested against, bit for bit (3x slower at B = 1)."""
    n_b, n_in = x.shape
    n_out = blocks.shape[0]
    n_tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for t in prange(n_tasks):
        w = np.empty(n_in, np.float32)
        ds = np.empty(16, np.float32)
        dm = np.empty(8, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            _deq_row(blocks[o], kind, w, ds, dm)
            for b in range(n_b):
                out[b, o] = _vdot(w, x[b], n_in)


@njit(inline="always", cache=True)
def _q4_k_rows(row, ds, dm, x, b, count, o, out):
    """out[b .. b + count - 1, o] for Q4_K weight row `row`: one call of the `count`-row dot (1..6)."""
    if count == 6:
        store_column(out, b, o, kquants_simd.q4_k_dot6(row, ds, dm, x, b))
    elif count == 5:
        store_column(out, b, o, kquants_simd.q4_k_dot5(row, ds, dm, x, b))
    elif count == 4:
        store_column(out, b, o, kquants_simd.q4_k_dot4(row, ds, dm, x, b))
    elif count == 3:
        store_column(out, b, o, kquants_simd.q4_k_dot3(row, ds, dm, x, b))
    elif count == 2:
        store_column(out, b, o, kquants_simd.q4_k_dot2(row, ds, dm, x, b))
    else:
        store_column(out, b, o, kquants_simd.q4_k_dot1(row, ds, dm, x, b))


@njit(inline="always", cache=True)
def _q5_k_rows(row, ds, dm, x, b, count, o, out):
    """As `_q4_k_rows`, for Q5_K."""
    if count == 6:
        store_column(out, b, o, kquants_simd.q5_k_dot6(row, ds, dm, x, b))
    elif count == 5:
        store_column(out, b, o, kquants_simd.q5_k_dot5(row, ds, dm, x, b))
    elif count == 4:
        store_column(out, b, o, kquants_simd.q5_k_dot4(row, ds, dm, x, b))
    elif count == 3:
        store_column(out, b, o, kquants_simd.q5_k_dot3(row, ds, dm, x, b))
    elif count == 2:
        store_column(out, b, o, kquants_simd.q5_k_dot2(row, ds, dm, x, b))
    else:
        store_column(out, b, o, kquants_simd.q5_k_dot1(row, ds, dm, x, b))


@njit(inline="always", cache=True)
def _q6_k_rows(row, ds, x, b, count, o, out):
    """As `_q4_k_rows`, for Q6_K (no mins: its scales are passed twice)."""
    if count == 6:
        store_column(out, b, o, kquants_simd.q6_k_dot6(row, ds, ds, x, b))
    elif count == 5:
        store_column(out, b, o, kquants_simd.q6_k_dot5(row, ds, ds, x, b))
    elif count == 4:
        store_column(out, b, o, kquants_simd.q6_k_dot4(row, ds, ds, x, b))
    elif count == 3:
        store_column(out, b, o, kquants_simd.q6_k_dot3(row, ds, ds, x, b))
    elif count == 2:
        store_column(out, b, o, kquants_simd.q6_k_dot2(row, ds, ds, x, b))
    else:
        store_column(out, b, o, kquants_simd.q6_k_dot1(row, ds, ds, x, b))


@njit(cache=True, parallel=True)
def _q45_k_matmul(blocks: np.ndarray, x: np.ndarray, out: np.ndarray, kind: int) -> None:
    """out = x @ W.T for Q4_K (kind 0) or Q5_K (kind 1) with the weights decoded in registers
    (kquants_simd.py), activation rows in groups of 6 (the last 1 to 5 in one group) sharing each
    decoded chunk: the same bits as `_matmul`, faster."""
    n_b, n_in = x.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    block_bytes = Q4_K_BYTES if kind == 0 else Q5_K_BYTES
    for t in prange((n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ds = np.empty(8 * n_sb, np.float32)
        dm = np.empty(8 * n_sb, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            for sb in range(n_sb):
                _scales_mins(row, sb * block_bytes, ds, dm, 8 * sb)
            for b in range(0, n_b, 6):
                if kind == 0:
                    _q4_k_rows(row, ds, dm, x, b, min(6, n_b - b), o, out)
                else:
                    _q5_k_rows(row, ds, dm, x, b, min(6, n_b - b), o, out)


@njit(cache=True, parallel=True)
def _q6_k_matmul(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """out = x @ W.T for Q6_K with the weights decoded in registers (kquants_simd.py), activation rows
    in groups of 6 (the last 1 to 5 in one group) sharing each decoded chunk: the same bits as
    `_matmul` (kind 2), faster."""
    n_b, n_in = x.shape
    n_out = blocks.shape[0]
    n_sb = n_in // QK_K
    for t in prange((n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK):
        ds = np.empty(16 * n_sb, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = blocks[o]
            for sb in range(n_sb):
                _scales_q6(row, sb * Q6_K_BYTES, ds, 16 * sb)
            for b in range(0, n_b, 6):
                _q6_k_rows(row, ds, x, b, min(6, n_b - b), o, out)


@njit(cache=True, parallel=True)
def _segments(stack, experts, starts, x, out, kind):
    """The products of an expert stack's segments in one parallel loop over (segment, task): segment s
    multiplies rows starts[s] .. starts[s + 1] - 1 of x by matrix experts[s]. Each row goes through the
    dots `_q45_k_matmul` and `_q6_k_matmul` use, whose bits do not depend on the rows grouped with it,
    so a row gets what it gets alone; one launch instead of one per expert (a mixture of experts runs
    8 small matrices per layer and token)."""
    n_in = x.shape[1]
    n_out = stack.shape[1]
    n_sb = n_in // QK_K
    block_bytes = (Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES)[kind]
    tasks = (n_out + ROWS_PER_TASK - 1) // ROWS_PER_TASK
    for job in prange(experts.shape[0] * tasks):
        s = job // tasks
        t = job - s * tasks
        e, lo, hi = experts[s], starts[s], starts[s + 1]
        ds = np.empty(16 * n_sb, np.float32)
        dm = np.empty(8 * n_sb, np.float32)
        for o in range(t * ROWS_PER_TASK, min(n_out, (t + 1) * ROWS_PER_TASK)):
            row = stack[e, o]
            for sb in range(n_sb):
                if kind == 2:
                    _scales_q6(row, sb * block_bytes, ds, 16 * sb)
                else:
                    _scales_mins(row, sb * block_bytes, ds, dm, 8 * sb)
            for b in range(lo, hi, 6):
                count = min(6, hi - b)
                if kind == 0:
                    _q4_k_rows(row, ds, dm, x, b, count, o, out)
                elif kind == 1:
                    _q5_k_rows(row, ds, dm, x, b, count, o, out)
                else:
                    _q6_k_rows(row, ds, x, b, count, o, out)


@njit(cache=True)
def check_segments(stack, experts, starts, n_in, block_bytes, n_p, out):
    """Refuse segments the kernels cannot serve: a [E, out, row_bytes] stack, one start per segment
    and a last one at P, rising, experts within the stack."""
    if stack.ndim != 3 or n_in % QK_K != 0 or stack.shape[2] != (n_in // QK_K) * block_bytes:
        raise ValueError("the expert stack must be [experts, out, row_bytes] for the input width")
    if starts.shape[0] != experts.shape[0] + 1 or starts[0] != 0 or starts[-1] != n_p:
        raise ValueError("starts must hold one start per segment and end at the row count")
    for s in range(experts.shape[0]):
        if starts[s + 1] < starts[s] or not 0 <= experts[s] < stack.shape[0]:
            raise ValueError("segments must rise and name experts of the stack")
    if out.shape[0] != n_p or out.shape[1] != stack.shape[1]:
        raise ValueError("out must be [rows, out]")


@njit(cache=True)
def _run_segments(stack, experts, starts, x, out, kind):
    block_bytes = (Q4_K_BYTES, Q5_K_BYTES, Q6_K_BYTES)[kind]
    check_segments(stack, experts, starts, x.shape[1], block_bytes, x.shape[0], out)
    _segments(stack, experts, starts, np.ascontiguousarray(x), out, kind)


def q4_k_segments_exact(stack, experts, starts, x, out) -> None:
    """Q4_K expert stack: out[starts[s]:starts[s + 1]] = x[starts[s]:starts[s + 1]] @ W[experts[s]].T."""
    _run_segments(stack, experts, starts, x, out, 0)


def q5_k_segments_exact(stack, experts, starts, x, out) -> None:
    """As q4_k_segments_exact, for a Q5_K stack."""
    _run_segments(stack, experts, starts, x, out, 1)


def q6_k_segments_exact(stack, experts, starts, x, out) -> None:
    """As q4_k_segments_exact, for a Q6_K stack."""
    _run_segments(stack, experts, starts, x, out, 2)


@njit(cache=True)
def _int8_acts(xq: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """xq * xs per 32-block as float32 [B, in]: the activations the int8 contract multiplies."""
    n_b, n_in = xq.shape
    x = np.empty((n_b, n_in), np.float32)
    for b in range(n_b):
        for blk in range(n_in // 32):
            s = xs[b, blk]
            src = xq[b, 32 * blk : 32 * blk + 32]
            dst = x[b, 32 * blk : 32 * blk + 32]
            for i in range(32):
                dst[i] = np.float32(src[i]) * s
    return x


# ---------------------------------------------------------------------------------------------------
# Public kernels (the KERNELS.md interface)
# ---------------------------------------------------------------------------------------------------


@njit(cache=True)
def q4_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q4_K: out[B, out] = x[B, in] @ W.T, weights dequantized in cache, float32 accumulation."""
    check_shapes(blocks, x.shape[1], Q4_K_BYTES, x.shape[0], out)
    _q45_k_matmul(blocks, np.ascontiguousarray(x), out, 0)


@njit(cache=True)
def q5_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q5_K: out[B, out] = x[B, in] @ W.T, weights dequantized in cache, float32 accumulation."""
    check_shapes(blocks, x.shape[1], Q5_K_BYTES, x.shape[0], out)
    _q45_k_matmul(blocks, np.ascontiguousarray(x), out, 1)


@njit(cache=True)
def q6_k_matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
    """Q6_K: out[B, out] = x[B, in] @ W.T, weights dequantized in cache, float32 accumulation."""
    check_shapes(blocks, x.shape[1], Q6_K_BYTES, x.shape[0], out)
    _q6_k_matmul(blocks, np.ascontiguousarray(x), out)


# These int8 kernels multiply the quantized activations (xq * xs, rounded to float32 once per call) with
# the same fixed-order float dot as the exact kernels: the int8 contract in float arithmetic, at the cost
# of the exact kernels. The engine's int8 mode runs the integer kernels of kquants_int8.py instead (the
# registry there); these stay as the tests' float reference for them.


@njit(cache=True)
def q4_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q4_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    check_shapes(blocks, xq.shape[1], Q4_K_BYTES, xq.shape[0], out)
    _q45_k_matmul(blocks, _int8_acts(xq, xs), out, 0)


@njit(cache=True)
def q5_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q5_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    check_shapes(blocks, xq.shape[1], Q5_K_BYTES, xq.shape[0], out)
    _q45_k_matmul(blocks, _int8_acts(xq, xs), out, 1)


@njit(cache=True)
def q6_k_matmul_int8(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
    """Q6_K: out = (xq * xs) @ W.T with activations quantized per 32-block."""
    check_shapes(blocks, xq.shape[1], Q6_K_BYTES, xq.shape[0], out)
    _q6_k_matmul(blocks, _int8_acts(xq, xs), out)


@njit(cache=True, parallel=True)
def _dequant(blocks: np.ndarray, start: int, stop: int, out: np.ndarray, kind: int) -> None:
    """Rows start..stop-1 of `kind` as float32 into out, bit-identical to gguf.quants.dequantize."""
    for r in prange(stop - start):
        ds = np.empty(16, np.float32)
        dm = np.empty(8, np.float32)
        _deq_row(blocks[start + r], kind, out[r], ds, dm)


@njit(cache=True)
def q4_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q4_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant(blocks, start, stop, out, 0)


@njit(cache=True)
def q5_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q5_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant(blocks, start, stop, out, 1)


@njit(cache=True)
def q6_k_dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
    """Q6_K rows start..stop-1 into out float32 [stop - start, in]."""
    _dequant(blocks, start, stop, out, 2)


KQUANT_KERNELS: dict[str, QuantKernels] = {
    name: QuantKernels(name, QK_K, size, exact, int8, dequantize_rows, segments_exact=segments)
    for name, size, exact, int8, dequantize_rows, segments in (
        ("Q4_K", Q4_K_BYTES, q4_k_matmul_exact, q4_k_matmul_int8, q4_k_dequantize_rows, q4_k_segments_exact),
        ("Q5_K", Q5_K_BYTES, q5_k_matmul_exact, q5_k_matmul_int8, q5_k_dequantize_rows, q5_k_segments_exact),
        ("Q6_K", Q6_K_BYTES, q6_k_matmul_exact, q6_k_matmul_int8, q6_k_dequantize_rows, q6_k_segments_exact),
    )
}
"""GGUF K-quant type name -> its kernels."""
