"""Causal attention of a long prefill run (more rows than the row kernel takes) in the kernel modes.

The run is cut into blocks of BLOCK_ROWS query rows per kv head. A block's scores cover only the
positions its rows may see (causal: nothing past its last row; with a sliding window, nothing before its
first row's window), so a 512-row run computes about 56 % of the full square. Each block is one BLAS
product for the scores, one compiled masked softmax (`masked_softmax_`), one BLAS product for the
values. The blocks run on a small thread pool: BLAS is held to one thread beside the numba kernels (two
thread pools that switch cost milliseconds), and both BLAS and the compiled softmax release the GIL, so
plain Python threads share the blocks among the cores.

A row's result depends on its run only (its block's bounds are counted from the run's first row, and
prefill chunk boundaries are fixed from the start of the prompt), never on the thread count or on the
other sequences in the batch.

The softmax inlines rowops.exp_f32; cache_freshness.py drops the cached kernel when rowops.py changes.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from .rowops import LANES, exp_f32

BLOCK_ROWS = 64
"""Query rows per block: smaller blocks skip more of the masked square, larger ones cost fewer calls."""


@numba.njit(cache=True, nogil=True, error_model="numpy")
def masked_softmax_(scores, group, row_position, first_position, window, softcap):
    """In place, for scores float32 [rows * group, columns] (row i is query row i // group, at position
    row_position + i // group; column c is position first_position + c): softmax over the positions the
    row sees (at most its own; with window > 0 also above its own minus window), 0 elsewhere. Each row
    is reduced on its own; its maximum and sum run in LANES partial results (so LLVM vectorises them)
    reduced by a fixed tree, an order fixed by the row's width. softcap > 0: each seen score s is
    first softcap * tanh(s / softcap) (Gemma 2)."""
    rows, columns = scores.shape
    cap = np.float32(softcap)
    lanes = np.empty(LANES, np.float32)
    for i in range(rows):
        position = row_position + i // group
        stop = min(position - first_position + 1, columns)
        start = 0
        if window > 0:
            start = max(position - window + 1 - first_position, 0)
        # A 0-based view of the seen positions: loops from 0 let LLVM drop numba's negative-index
        # wraparound and vectorise (from a variable start they ran 7x slower).
        row = scores[i, start:stop]
        count = stop - start
        if cap > 0:
            for c in range(count):
                row[c] = cap * np.tanh(row[c] / cap)
        full = count - count % LANES
        for lane in range(LANES):
            lanes[lane] = -np.inf
        for base in range(0, full, LANES):
            for lane in range(LANES):
                lanes[lane] = max(lanes[lane], row[base + lane])
        for c in range(full, count):
            lanes[c - full] = max(lanes[c - full], row[c])
        top = lanes[0]
        for lane in range(1, LANES):
            top = max(top, lanes[lane])
        for c in range(count):
            row[c] = exp_f32(row[c] - top)
        for lane in range(LANES):
            lanes[lane] = 0.0
        for base in range(0, full, LANES):
            for lane in range(LANES):
                lanes[lane] += row[base + lane]
        for c in range(full, count):
            lanes[c - full] += row[c]
        step = LANES // 2
        while step:
            for lane in range(step):
                lanes[lane] += lanes[lane + step]
            step //= 2
        scale = np.float32(1.0) / lanes[0]
        for c in range(count):
            row[c] *= scale
        whole = scores[i]
        for c in range(0, start):
            whole[c] = np.float32(0.0)
        for c in range(stop, columns):
            whole[c] = np.float32(0.0)


def run_attention(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    start: int,
    window: int | None,
    out: np.ndarray,
    pool: ThreadPoolExecutor | None,
    softcap: float | None = None,
) -> None:
    """out = causal attention of one sequence's run of query rows against its cache.

    q, out: float32 [length, heads, head_dim] (the run's rows; scale folded into q); keys, values:
    [kv_heads, capacity, head_dim] of the run's slot (float32 or float16), positions
    0..start+length-1 written; `start`: the position of the run's first row; `window`: sliding-window
    width or None; `softcap`: attention soft-capping or None. With a pool, the blocks run on its
    threads; without, one after another (the same bits either way)."""
    length, heads, head_dim = q.shape
    kv_heads = keys.shape[0]
    group = heads // kv_heads

    def block(kv: int, lo: int) -> None:
        hi = min(lo + BLOCK_ROWS, length)
        first = 0 if window is None else max(0, start + lo + 1 - window)
        stop = start + hi
        # Rows (t, g) of the block's queries for this kv head, one BLAS product for all of them.
        block_q = q[lo:hi, kv * group : (kv + 1) * group].reshape((hi - lo) * group, head_dim)
        # A half cache is widened block by block (exact): a float32 copy of what this block reads
        # only, never of the whole cache; a float32 cache is read in place.
        block_keys = np.asarray(keys[kv, first:stop], dtype=np.float32)
        scores = block_q @ block_keys.T
        masked_softmax_(scores, group, start + lo, first, 0 if window is None else window, softcap or 0.0)
        block_values = np.asarray(values[kv, first:stop], dtype=np.float32)
        out[lo:hi, kv * group : (kv + 1) * group] = (scores @ block_values).reshape(hi - lo, group, head_dim)

    # Longest blocks (the last rows see the most positions) first, so the threads finish together.
    jobs = [(kv, lo) for kv in range(kv_heads) for lo in range(0, length, BLOCK_ROWS)][::-1]

    def share(part: list[tuple[int, int]]) -> None:
        for kv, lo in part:
            block(kv, lo)

    if pool is None:
        share(jobs)
        return
    # One task a thread, each every n-th block of the list: a task a block (32 a layer of the 1B shape)
    # cost more in hand-offs than the second core gained (a 256-row prefill of the 1B shape spent
    # 110-123 ms in attention that way, 87-95 ms this way, alternating in one process).
    threads = numba.get_num_threads()  # the pool's size (CPUBackend._block_pool)
    for future in [pool.submit(share, jobs[i::threads]) for i in range(threads)]:
        future.result()
