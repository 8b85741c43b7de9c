"""Attention of single rows against their own sequence's cache, one row at a time, in a fixed order.

A row's result depends only on its query, its slot and how many positions it sees: each score is one
compiled dot-product loop over the head (its summation order fixed by the head width alone), the softmax
and the weighted sum of values walk the positions in order. So a decode row, a row verifying drafts and
the same row recomputed alone give the same bits whatever else is in the batch (batched BLAS over padded
widths cannot promise that: its blocking, and so its summation order, follows the batch's shape).

The weighted sum of values is an LLVM intrinsic (`weighted_rows_64/16`) that keeps the sums in vector
registers through the position loop, with the plain loop's arithmetic (mul, then add, per position).

The cache may hold float32 or IEEE halves (as uint16 bits, `kv_cache_dtype: f16`): every element is
widened to float32 as it is loaded (kv_storage.py), so the arithmetic and its order are the same for
both; numba compiles one specialization per element type.

numba's cache tracks only the source file of the cached function: after editing rowops.exp_f32, which
the softmax inlines, or simd.py's splat and kv_storage.py's loads, which the kernels emit, touch this
file so the kernel is recompiled.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic

from .kv_storage import KV_ELEMENT_TYPES, element_pointer_type, kv_load, load_kv_vector
from .rowops import exp_f32
from .simd import exit_values, is_c_array, splat

_F32 = ir.FloatType()
_I64 = ir.IntType(64)
_V16F = ir.VectorType(_F32, 16)


def _weighted_rows_codegen(vectors: int):
    """IR for out[col : col + 16 * vectors] = sum over p of weights[p] * values[p, col : ...], the
    positions in order, each sum held in a <16 x float> register through the loop (a loop over out in
    memory waited on a store and a reload per position). mul then add, two roundings, as the plain
    loop `out[j] += w * v[j]` gives: the same bits as the loop this replaced."""

    def codegen(context, builder, signature, args):
        weights = context.make_array(signature.args[0])(context, builder, args[0])
        element = signature.args[1].dtype
        values = context.make_array(signature.args[1])(context, builder, args[1])
        out = context.make_array(signature.args[3])(context, builder, args[3])
        col = args[2]
        count = builder.extract_value(weights.shape, 0)
        width = builder.extract_value(values.shape, 1)
        weight_ptr = builder.bitcast(weights.data, _F32.as_pointer())
        value_ptr = builder.gep(builder.bitcast(values.data, element_pointer_type(element)), [col])
        out_ptr = builder.gep(builder.bitcast(out.data, _F32.as_pointer()), [col])
        zero = ir.Constant(_V16F, None)
        entry = builder.block
        loop = builder.append_basic_block("positions")
        done = builder.append_basic_block("store")
        builder.cbranch(builder.icmp_signed(">", count, ir.Constant(_I64, 0)), loop, done)
        builder.position_at_end(loop)
        p = builder.phi(_I64)
        sums = [builder.phi(_V16F) for _ in range(vectors)]
        w = splat(builder, builder.load(builder.gep(weight_ptr, [p])))
        row = builder.gep(value_ptr, [builder.mul(p, width)])
        updated = [
            builder.fadd(
                acc,
                builder.fmul(
                    w, load_kv_vector(builder, builder.gep(row, [ir.Constant(_I64, 16 * c)]), element)
                ),
            )
            for c, acc in enumerate(sums)
        ]
        following = builder.add(p, ir.Constant(_I64, 1))
        p.add_incoming(ir.Constant(_I64, 0), entry)
        p.add_incoming(following, loop)
        for acc, value in zip(sums, updated, strict=True):
            acc.add_incoming(zero, entry)
            acc.add_incoming(value, loop)
        builder.cbranch(builder.icmp_signed("<", following, count), loop, done)
        builder.position_at_end(done)
        for c, final in enumerate(exit_values(builder, updated, entry, loop)):
            target = builder.gep(out_ptr, [ir.Constant(_I64, 16 * c)])
            builder.store(final, builder.bitcast(target, _V16F.as_pointer()), align=4)
        return context.get_dummy_value()

    return codegen


def _weighted_rows(vectors: int):
    def typer(typingctx, weights, values, col, out):
        if not (
            is_c_array(weights, types.float32, 1)
            and any(is_c_array(values, element, 2) for element in KV_ELEMENT_TYPES)
            and is_c_array(out, types.float32, 1)
            and isinstance(col, types.Integer)
        ):
            return None
        return types.void(weights, values, types.int64, out), _weighted_rows_codegen(vectors)

    typer.__name__ = f"weighted_rows_{16 * vectors}"
    typer.__doc__ = f"""(weights float32 [count], values [count, width] (float32 or half bits), col,
    out float32 [width]): out[col : col + {16 * vectors}] = weights @ values[:, col : col + {16 * vectors}],
    positions in order."""
    return intrinsic(typer)


weighted_rows_64 = _weighted_rows(4)
weighted_rows_16 = _weighted_rows(1)


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """sum(a * b) over one head. LLVM may reassociate (vector lanes, unrolled chains) and fuse: the
    order it picks depends only on the length, never on the batch. Not inlined at numba's level, so
    these flags stay on its own instructions and never reach the caller's softmax arithmetic."""
    acc = np.float32(0.0)
    for j in range(a.shape[0]):
        acc += a[j] * kv_load(b[j])
    return acc


def row_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    slots: np.ndarray,
    visible: np.ndarray,
    out: np.ndarray,
    softcap: float = 0.0,
) -> None:
    """out[r] = softmax(q[r] . K[slot, :, :n]) V[slot, :, :n] for r in `rows` (n = visible[i]); see
    `window_row_attention`, which this is with every row seeing from position 0."""
    window_row_attention(q, keys, values, rows, slots, np.zeros_like(visible), visible, out, softcap)


# error_model="numpy": no zero check on float division (it would keep LLVM from vectorising).
@numba.njit(cache=True, parallel=True, error_model="numpy")
def window_row_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    rows: np.ndarray,
    slots: np.ndarray,
    first: np.ndarray,
    visible: np.ndarray,
    out: np.ndarray,
    softcap: float = 0.0,
) -> None:
    """out[r] = softmax(q[r] . K[slot, :, f:n]) V[slot, :, f:n] for r in `rows` (f = first[i], n =
    visible[i]: positions f..n-1; f > 0 for sliding-window attention); with softcap > 0 every score s
    becomes softcap * tanh(s / softcap) first (Gemma 2's attention soft-capping).

    q, out: float32 [batch_rows, heads, head_dim]; keys, values: [slots, kv_heads, capacity, head_dim],
    float32 or half bits (uint16);
    rows, slots, first, visible: int64 [m]. Heads share kv heads in groups (grouped-query attention). Scores
    are not scaled here (the scale is folded into q). Parallel over (row, head): one task computes a
    whole row-head, so the thread count never changes a result (and a single decode row still has
    as many tasks as heads to share among the threads).
    """
    heads = q.shape[1]
    head_dim = q.shape[2]
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    cap = np.float32(softcap)
    for task in numba.prange(rows.shape[0] * heads):
        i = task // heads
        head = task % heads
        kv = head // group
        row, slot, f, n = rows[i], slots[i], first[i], visible[i]
        count = n - f
        weights = np.empty(count, dtype=np.float32)
        query = q[row, head]
        head_keys = keys[slot, kv]
        top = np.float32(-np.inf)
        for p in range(count):
            score = _dot(query, head_keys[f + p])
            if cap > 0:
                score = cap * np.tanh(score / cap)
            weights[p] = score
            if score > top:
                top = score
        for p in range(count):  # vectorised: no sum in this loop
            weights[p] = exp_f32(weights[p] - top)
        total = np.float32(0.0)
        for p in range(count):
            total += weights[p]
        target = out[row, head]
        # target[j] = sum over p of weights[p] * values[p, j], in position order: 64 and then 16
        # columns at a time with the sums held in registers, the last head_dim % 16 columns in a loop.
        head_values = values[slot, kv, f:n]
        j = 0
        while j + 64 <= head_dim:
            weighted_rows_64(weights, head_values, j, target)
            j += 64
        while j + 16 <= head_dim:
            weighted_rows_16(weights, head_values, j, target)
            j += 16
        for column in range(j, head_dim):
            target[column] = 0.0
        for p in range(count):
            w = weights[p]
            for column in range(j, head_dim):
                target[column] += w * kv_load(head_values[p, column])
        inverse = np.float32(1.0) / total
        for j in range(head_dim):
            target[j] *= inverse
