"""Attention of single rows against their own sequence's cache, one row at a time, in a fixed order.

A row's result depends only on its query, its slot and how many positions it sees: each score is a dot
product in an order fixed by the head width alone, the softmax and the weighted sum of values walk the
positions in order. So a decode row, a row verifying drafts and the same row recomputed alone give the
same bits whatever else is in the batch (batched BLAS over padded widths cannot promise that: its
blocking, and so its summation order, follows the batch's shape).

With a head width that is a multiple of 16 (every model family's) a task takes a row's query heads that
share one kv head (grouped-query attention): `head_scores` scores 8 positions at a time for each of
them while that block of keys is in L1, its order written out (8 fma lanes, then a fixed tree) and so
the same on every instruction set, and `weighted_blocks` reads each value row once for all of them.
Other widths take a query head a task, each score a compiled loop (`_dot`) whose vectorisation LLVM
picks. The weighted sums of values are LLVM intrinsics that keep the sums in vector registers through
the position loop, with the plain loop's arithmetic (mul, then add, per position).

The cache may hold float32 or IEEE halves (as uint16 bits, `kv_cache_dtype: f16`): every element is
widened to float32 as it is loaded (kv_storage.py), so the arithmetic and its order are the same for
both; numba compiles one specialization per element type.

The softmax inlines rowops.exp_f32 and the kernels emit simd.py's splat and kv_storage.py's loads;
cache_freshness.py drops the cached kernels when any of those changes.
"""

from __future__ import annotations

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

from .kv_storage import KV_ELEMENT_TYPES, element_pointer_type, kv_load, load_kv_vector
from .rowops import exp_f32
from .simd import exit_values, fma, is_c_array, prefetch, splat, sum_float_lanes_of

_F32 = ir.FloatType()
_I64 = ir.IntType(64)
_V16F = ir.VectorType(_F32, 16)
_I8P = ir.IntType(8).as_pointer()


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


SCORE_LANES = 8
"""Positions scored at once by `head_scores`, and the partial sums of each score."""

PREFETCH_BLOCKS = 2
"""How many blocks of SCORE_LANES key or value rows ahead the row kernel prefetches: a long context's
cache streams from memory, where demand misses alone left one thread's score loop at 12 GB/s (16 with
2 blocks ahead of each 8 rows of 64 floats, 15.7 with 1, 16.2 with 4)."""


def _prefetch_block(builder: ir.IRBuilder, rows: ir.Value, block: ir.Value, width: ir.Value, element) -> None:
    """Prefetch the SCORE_LANES rows of `width` cache elements from row `block` * SCORE_LANES +
    PREFETCH_BLOCKS * SCORE_LANES on, of the rows at `rows` (a pointer to the cache's element type)."""
    ahead = builder.add(block, ir.Constant(_I64, PREFETCH_BLOCKS))
    start = builder.mul(builder.mul(ahead, ir.Constant(_I64, SCORE_LANES)), width)
    start = builder.bitcast(builder.gep(rows, [start]), _I8P)
    row_bytes = builder.mul(width, ir.Constant(_I64, 4 if element == types.float32 else 2))
    lines = builder.udiv(builder.mul(row_bytes, ir.Constant(_I64, SCORE_LANES)), ir.Constant(_I64, 64))
    with cgutils.for_range(builder, lines) as line:
        prefetch(builder, builder.gep(start, [builder.mul(line.index, ir.Constant(_I64, 64))]), 0)


def _head_scores_codegen(context, builder, signature, args):
    queries = context.make_array(signature.args[0])(context, builder, args[0])
    element = signature.args[1].dtype
    keys = context.make_array(signature.args[1])(context, builder, args[1])
    out = context.make_array(signature.args[4])(context, builder, args[4])
    first, count = args[2], args[3]
    lanes = SCORE_LANES
    vty = ir.VectorType(_F32, lanes)
    heads = builder.extract_value(queries.shape, 0)
    head_dim = builder.extract_value(keys.shape, 1)
    stride = builder.extract_value(out.shape, 1)
    chunks = builder.udiv(head_dim, ir.Constant(_I64, lanes))
    blocks = builder.udiv(builder.add(count, ir.Constant(_I64, lanes - 1)), ir.Constant(_I64, lanes))
    query_ptr = builder.bitcast(queries.data, _F32.as_pointer())
    key_ptr = builder.bitcast(keys.data, element_pointer_type(element))
    out_ptr = builder.bitcast(out.data, _F32.as_pointer())
    last = builder.sub(count, ir.Constant(_I64, 1))
    window_keys = builder.gep(key_ptr, [builder.mul(first, head_dim)])  # the row of position 0
    accs = [cgutils.alloca_once(builder, vty) for _ in range(lanes)]
    with cgutils.for_range(builder, blocks) as block:
        p0 = builder.mul(block.index, ir.Constant(_I64, lanes))
        rows = []
        for k in range(lanes):  # past the last position, the last row again (its score is not used)
            p = builder.add(p0, ir.Constant(_I64, k))
            p = builder.select(builder.icmp_signed(">", p, last), last, p)
            rows.append(builder.gep(key_ptr, [builder.mul(builder.add(first, p), head_dim)]))
        # the next blocks' keys on their way from memory while this block is scored
        _prefetch_block(builder, window_keys, block.index, head_dim, element)
        with cgutils.for_range(builder, heads) as head:  # the block's keys stay in L1 for every head
            query_row = builder.gep(query_ptr, [builder.mul(head.index, head_dim)])
            for acc in accs:
                builder.store(ir.Constant(vty, None), acc)
            with cgutils.for_range(builder, chunks) as chunk:
                column = builder.mul(chunk.index, ir.Constant(_I64, lanes))
                q = builder.load(builder.bitcast(builder.gep(query_row, [column]), vty.as_pointer()), align=4)
                for row, acc in zip(rows, accs, strict=True):
                    key = load_kv_vector(builder, builder.gep(row, [column]), element, lanes)
                    builder.store(fma(builder, q, key, builder.load(acc)), acc)
            scores = sum_float_lanes_of(builder, [builder.load(acc) for acc in accs])
            target = builder.gep(out_ptr, [builder.add(builder.mul(head.index, stride), p0)])
            builder.store(scores, builder.bitcast(target, vty.as_pointer()), align=4)
    return context.get_dummy_value()


@intrinsic
def head_scores(typingctx, queries, keys, first, count, out):
    """(queries float32 [heads, head_dim], keys [positions, head_dim] (float32 or half bits), first,
    count, out float32 [heads, >= count rounded up to SCORE_LANES]): out[h, p] = queries[h] . keys[first
    + p] for p < count (out[h, count:] is scratch), head_dim a multiple of SCORE_LANES. A score is
    SCORE_LANES partial sums, lane i adding the products of columns i, i + 8, ... by fma in column order,
    then `sum_float_lanes_of`'s tree: one order for every score, whatever its block, head count or
    instruction set. SCORE_LANES positions go at once (their fma chains independent, their reductions
    one transposing tree), and each block of keys serves every head of the group while in L1."""
    if not (
        is_c_array(queries, types.float32, 2)
        and any(is_c_array(keys, element, 2) for element in KV_ELEMENT_TYPES)
        and isinstance(first, types.Integer)
        and isinstance(count, types.Integer)
        and is_c_array(out, types.float32, 2)
    ):
        return None
    return types.void(queries, keys, types.int64, types.int64, out), _head_scores_codegen


def _weighted_blocks_codegen(context, builder, signature, args):
    weights = context.make_array(signature.args[0])(context, builder, args[0])
    element = signature.args[2].dtype
    values = context.make_array(signature.args[2])(context, builder, args[2])
    out = context.make_array(signature.args[3])(context, builder, args[3])
    heads = args[1]
    lanes = SCORE_LANES
    count = builder.extract_value(values.shape, 0)
    width = builder.extract_value(values.shape, 1)
    stride = builder.extract_value(weights.shape, 1)
    out_width = builder.extract_value(out.shape, 1)
    chunks = builder.udiv(width, ir.Constant(_I64, 16))
    weight_ptr = builder.bitcast(weights.data, _F32.as_pointer())
    value_ptr = builder.bitcast(values.data, element_pointer_type(element))
    out_ptr = builder.bitcast(out.data, _F32.as_pointer())
    full = builder.udiv(count, ir.Constant(_I64, lanes))
    tail = builder.urem(count, ir.Constant(_I64, lanes))

    def sums(head, chunk):
        row = builder.mul(head, out_width)
        start = builder.add(row, builder.mul(chunk, ir.Constant(_I64, 16)))
        return builder.bitcast(builder.gep(out_ptr, [start]), _V16F.as_pointer())

    def value(position, chunk):
        at = builder.add(builder.mul(position, width), builder.mul(chunk, ir.Constant(_I64, 16)))
        return load_kv_vector(builder, builder.gep(value_ptr, [at]), element)

    def weight_row(head):
        return builder.gep(weight_ptr, [builder.mul(head, stride)])

    with cgutils.for_range(builder, builder.mul(heads, chunks)) as zeroing:
        head = builder.udiv(zeroing.index, chunks)
        builder.store(ir.Constant(_V16F, None), sums(head, builder.urem(zeroing.index, chunks)), align=4)
    with cgutils.for_range(builder, full) as block:  # 8 positions whose value rows stay in L1
        p0 = builder.mul(block.index, ir.Constant(_I64, lanes))
        _prefetch_block(builder, value_ptr, block.index, width, element)
        with cgutils.for_range(builder, heads) as head:
            w = weight_row(head.index)
            splats = [
                splat(builder, builder.load(builder.gep(w, [builder.add(p0, ir.Constant(_I64, k))])))
                for k in range(lanes)
            ]
            with cgutils.for_range(builder, chunks) as chunk:
                target = sums(head.index, chunk.index)
                acc = builder.load(target, align=4)
                for k in range(lanes):
                    v = value(builder.add(p0, ir.Constant(_I64, k)), chunk.index)
                    acc = builder.fadd(acc, builder.fmul(splats[k], v))
                builder.store(acc, target, align=4)
    p0 = builder.mul(full, ir.Constant(_I64, lanes))
    with cgutils.for_range(builder, heads) as head:  # the last count % 8 positions
        w = weight_row(head.index)
        with cgutils.for_range(builder, chunks) as chunk:
            target = sums(head.index, chunk.index)
            with cgutils.for_range(builder, tail) as k:
                position = builder.add(p0, k.index)
                weight = splat(builder, builder.load(builder.gep(w, [position])))
                acc = builder.load(target, align=4)
                sum_ = builder.fadd(acc, builder.fmul(weight, value(position, chunk.index)))
                builder.store(sum_, target, align=4)
    return context.get_dummy_value()


@intrinsic
def weighted_blocks(typingctx, weights, heads, values, out):
    """(weights float32 [>= heads, >= count], heads, values [count, width] (float32 or half bits), out
    float32 [>= heads, width]): out[h] = weights[h, :count] @ values for h < heads, width a multiple of
    16; each column's sum over the positions in order, mul then add (the bits
    of `weighted_rows_*` for each head). The value rows are read once, in order: 8 at a time, while
    they are in L1, for every head and 16 columns, the sums kept in `out` between blocks (where one
    pass per 16 columns over every row, strided, read a long context's values from memory at a
    quarter of the speed)."""
    if not (
        is_c_array(weights, types.float32, 2)
        and isinstance(heads, types.Integer)
        and any(is_c_array(values, element, 2) for element in KV_ELEMENT_TYPES)
        and is_c_array(out, types.float32, 2)
    ):
        return None
    sig = types.void(weights, types.int64, values, out)
    return sig, _weighted_blocks_codegen


@numba.njit(cache=True, fastmath={"reassoc", "contract"})
def _dot(a: np.ndarray, b: np.ndarray) -> np.float32:
    """sum(a * b) over one head. LLVM may reassociate (vector lanes, unrolled chains) and fuse: the
    order it picks depends only on the length, never on the batch. Not inlined at numba's level, so
    these flags stay on its own instructions and never reach the caller's softmax arithmetic."""
    acc = np.float32(0.0)
    for j in range(a.shape[0]):
        acc += a[j] * kv_load(b[j])
    return acc


@numba.njit(inline="always", cache=True, error_model="numpy")
def _softmax_numerators(weights: np.ndarray, count: int, cap: np.float32) -> np.float32:
    """In place over weights[:count] (a head's scores): each score soft-capped when cap > 0 (cap *
    tanh(s / cap)), then exp(s - the largest); returns their sum, added in position order."""
    top = np.float32(-np.inf)
    for p in range(count):
        score = weights[p]
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
    return total


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


@numba.njit(cache=True)
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
    are not scaled here (the scale is folded into q). Parallel over tasks that each compute whole rows
    of heads, so the thread count never changes a result.

    head_dim a multiple of 16 (every model family's): a task is a (row, kv head), its group of query
    heads scored against each block of keys while it is in L1 (`head_scores`) and each value row
    read once for all of them (`weighted_blocks`), where one task a query head read every key and
    value once per head of the group (4 times on Llama 3's shapes). Other widths: a task a (row, head),
    each score `_dot`.
    """
    if q.shape[2] % 16 == 0:
        _group_row_attention(q, keys, values, rows, slots, first, visible, out, softcap)
    else:
        _head_row_attention(q, keys, values, rows, slots, first, visible, out, softcap)


MIN_TASKS = 4
"""Tasks the grouped kernel makes at least (when there are heads enough): a kv head's query heads split
into parts when rows x kv heads are fewer (a decode row of 3 kv heads: 6 tasks of 2 and 1 heads, of 1:
4 of 1), so two threads share them evenly; each part reads the keys and values again. Which task
computes a head never changes its arithmetic."""


# error_model="numpy": no zero check on float division (it would keep LLVM from vectorising).
@numba.njit(cache=True, parallel=True, error_model="numpy")
def _group_row_attention(q, keys, values, rows, slots, first, visible, out, softcap):
    """`window_row_attention` for head_dim a multiple of 16: a task a row's query heads of one kv head,
    or a part of them (MIN_TASKS)."""
    heads = q.shape[1]
    head_dim = q.shape[2]
    kv_heads = keys.shape[1]
    group = heads // kv_heads
    cap = np.float32(softcap)
    pairs = max(1, rows.shape[0] * kv_heads)
    parts = min(group, (MIN_TASKS + pairs - 1) // pairs)
    part_heads = (group + parts - 1) // parts
    parts = (group + part_heads - 1) // part_heads
    for task in numba.prange(rows.shape[0] * kv_heads * parts):
        i = task // (kv_heads * parts)
        kv = task // parts % kv_heads
        part = task % parts
        row, slot, f, n = rows[i], slots[i], first[i], visible[i]
        count = n - f
        h0 = kv * group + part * part_heads
        group_heads = min(part_heads, (kv + 1) * group - h0)
        stride = (count + SCORE_LANES - 1) // SCORE_LANES * SCORE_LANES
        weights = np.empty((group_heads, stride), dtype=np.float32)
        head_scores(q[row, h0 : h0 + group_heads], keys[slot, kv], f, count, weights)
        totals = np.empty(group_heads, dtype=np.float32)
        for g in range(group_heads):
            totals[g] = _softmax_numerators(weights[g], count, cap)
        head_values = values[slot, kv, f:n]
        target = out[row, h0 : h0 + group_heads]
        weighted_blocks(weights, group_heads, head_values, target)
        for g in range(group_heads):
            inverse = np.float32(1.0) / totals[g]
            for j in range(head_dim):
                target[g, j] *= inverse


# error_model="numpy": no zero check on float division (it would keep LLVM from vectorising).
@numba.njit(cache=True, parallel=True, error_model="numpy")
def _head_row_attention(q, keys, values, rows, slots, first, visible, out, softcap):
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
        for p in range(count):
            weights[p] = _dot(query, head_keys[f + p])
        total = _softmax_numerators(weights, count, cap)
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
