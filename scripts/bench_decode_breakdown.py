"""Where a batch-1 decode token's time goes on the default model: each backend op, the model's own code
around them, and the engine's step (scheduling, sampling, events).

Usage: python scripts/bench_decode_breakdown.py [--threads 2] [--tokens 128] [--runs 3] [--temp 0]
       [--cpu-kernels int8] [--model GGUF] [--mmap]
The weights are copied out of the file as `infer`'s default profile does (`--mmap`: read from the file
map's pages instead; on the 1B Q4_K_M shape a token took 49 ms there against 35 ms on the copies).
Runs greedy (or --temp) generations of --tokens tokens after a warm-up, first plain (ms/token), then with
every backend op and engine stage timed (the timers add ~0.3 us per call). Times are per token; an op's
share is of the timed run's token. Quote it beside the load average: other work on the machine inflates
the multi-threaded kernels most.
In the `int8` mode a decode row's layers run in one compiled call (Backend.row_decoder): first the token
time with it against op by op (alternating runs), then the table shows it as "layers in one call", and
the backend ops it covers do not appear.
Then, in the kernel modes, what a step's matrix calls cost beyond their arithmetic: numba's launch of a
parallel region (an empty prange) against a serial call, and the step's matrix products back to back (no
model code between them), one call per matrix as decode makes them, against the same kernels on the same
bytes in one call per kind of matrix (the layers' blocks joined): what the number of calls costs.
"""

from __future__ import annotations

import argparse
import collections
import functools
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # what `infer` sets (cli/runtime.py)
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

import numpy as np
from numba import njit, prange
from threadpoolctl import threadpool_limits

from infer.cli.model_store import ensure_default_model
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

BACKEND_OPS = ("embed", "linear", "logits", "rms_norm", "rope", "silu_mul", "write_kv", "attention")
ENGINE_STAGES = ("step",)
ROW_DECODER = "layers in one call"
"""The label of the row decoder's call (every layer of a decode row: its matmuls, attention and row ops)."""


class Timers:
    """Seconds and calls per label, gathered by wrapping callables."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = collections.defaultdict(float)
        self.calls: collections.Counter[str] = collections.Counter()

    def wrap(self, owner: Any, name: str, label: str) -> None:
        """Replace `owner.name` by a timed version of itself."""
        inner: Callable[..., Any] = getattr(owner, name)

        @functools.wraps(inner)
        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] += time.perf_counter() - started
                self.calls[label] += 1

        setattr(owner, name, timed)


def main() -> None:
    """Print ms/token and the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--temp", type=float, default=0.0)
    parser.add_argument("--cpu-kernels", default="int8")
    parser.add_argument("--model", default=None, help="a GGUF path (default: the default model)")
    parser.add_argument(
        "--mmap",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="run on the file map's pages (default: copies, as infer's default profile)",
    )
    args = parser.parse_args()
    threadpool_limits(1 if args.cpu_kernels != "blas" else args.threads, user_api="blas")
    if args.cpu_kernels != "blas":
        import numba

        numba.set_num_threads(args.threads)
    engine = load_engine(
        args.model or ensure_default_model(),
        EngineConfig(ctx_size=4096, max_num_seqs=16),
        cpu_kernels=args.cpu_kernels,
        mmap=args.mmap,
    )
    params = SamplingParams(temperature=args.temp)
    prompt = tuple((i * 37) % 20000 + 100 for i in range(8))

    def per_token() -> float:
        done = engine.generate(Request(prompt, params, max_tokens=args.tokens, ignore_eos=True, seed=1)).done
        return done.timings.decode_s / (done.usage.completion_tokens - 1)

    per_token()
    plain = [per_token() for _ in range(args.runs)]
    model = engine.model
    row_decoder = getattr(model, "_row_decoder", None)
    if row_decoder is not None:  # the same tokens op by op, alternating with the one-call runs
        one_call, op_by_op = [], []
        for _ in range(args.runs):
            model._row_decoder = None
            op_by_op.append(per_token())
            model._row_decoder = row_decoder
            one_call.append(per_token())
        print(
            f"a decode row's layers in one call: {statistics.median(one_call) * 1e3:.3f} ms/token against "
            f"{statistics.median(op_by_op) * 1e3:.3f} op by op "
            f"({statistics.median(op_by_op) / statistics.median(one_call):.2f}x; alternating, medians of "
            f"{args.runs})"
        )
    timers = Timers()
    for name in BACKEND_OPS:
        timers.wrap(engine.model.backend, name, name)
    ops_timed = BACKEND_OPS
    if row_decoder is not None:  # a decode row's layers run in one call (Backend.row_decoder)
        timers.wrap(row_decoder, "run", ROW_DECODER)
        ops_timed = (*BACKEND_OPS, ROW_DECODER)
    timers.wrap(engine.model, "forward", "model.forward")
    for name in ENGINE_STAGES:
        timers.wrap(engine, name, "engine." + name.lstrip("_"))
    timers.wrap(engine.scheduler, "schedule", "engine.schedule")
    tokens = 0
    for _ in range(args.runs):
        done = engine.generate(Request(prompt, params, max_tokens=args.tokens, ignore_eos=True, seed=1)).done
        tokens += done.usage.completion_tokens
    seconds = timers.seconds
    ops = sum(seconds[name] for name in ops_timed)
    rows = [(name, seconds[name], timers.calls[name]) for name in ops_timed if timers.calls[name]]
    rows.append(("model code between ops", seconds["model.forward"] - ops, 0))
    rows.append(("engine outside forward", seconds["engine.step"] - seconds["model.forward"], 0))
    token = seconds["engine.step"] / tokens
    print(
        f"threads {args.threads}, {args.cpu_kernels} kernels, temp {args.temp}, "
        f"load {os.getloadavg()[0]:.2f}: "
        f"{statistics.median(plain) * 1e3:.3f} ms/token (median of {args.runs}, min "
        f"{min(plain) * 1e3:.3f}); timed run {token * 1e3:.3f} ms/token"
    )
    print(f"{'part':24} {'ms/token':>9} {'share':>6} {'calls':>6} {'us/call':>8}")
    for name, total, calls in sorted(rows, key=lambda row: -row[1]):
        per_call = f"{total / calls * 1e6:8.1f}" if calls else " " * 8
        calls_text = f"{calls / tokens:6.0f}" if calls else " " * 6
        print(f"{name:24} {total / tokens * 1e3:9.3f} {total / tokens / token:6.1%} {calls_text} {per_call}")
    if args.cpu_kernels != "blas":
        print_call_costs(engine, args.threads)


@njit(cache=True)
def _serial_call(a: np.ndarray, out: np.ndarray) -> None:
    out[0] = a[0]


@njit(cache=True, parallel=True)
def _parallel_call(a: np.ndarray, out: np.ndarray) -> None:
    for t in prange(out.shape[0]):
        out[t] = a[t]


def _best_seconds(fn: Callable[[], object], calls: int, repeats: int = 7) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - started) / calls)
    return best


def print_call_costs(engine: Any, threads: int) -> None:
    """The launch and per-call figures of the module docstring, on one decode step's matrices."""
    small, flags = np.ones(64, np.float32), np.empty(threads, np.float32)
    serial = _best_seconds(lambda: _serial_call(small, flags), 20000)
    launch = _best_seconds(lambda: _parallel_call(small, flags), 20000)
    backend = engine.model.backend
    captured: list[tuple[np.ndarray, Any]] = []
    linear = backend.linear

    def capture(x: np.ndarray, weight: Any, bias: Any = None) -> np.ndarray:
        captured.append((np.array(x), weight))
        return linear(x, weight, bias)

    backend.linear = capture
    row_decoder, engine.model._row_decoder = engine.model._row_decoder, None  # each product through linear
    # a 4-token prompt, then one decode step: its calls are the one-row ones
    engine.generate(Request((1, 2, 3, 4), SamplingParams(temperature=0), max_tokens=2, ignore_eos=True))
    backend.linear = linear
    engine.model._row_decoder = row_decoder
    step = [(x, w) for x, w in captured if x.shape[0] == 1 and hasattr(w, "blocks")]
    if not step:
        return
    total = sum(w.blocks.nbytes for _, w in step)

    def per_matrix() -> None:
        for x, w in step:
            backend.linear(x, w)

    # the same kernels on the same bytes in one call per kind of matrix: each kind's blocks joined
    groups: dict[tuple[int, int], list[tuple[np.ndarray, Any]]] = {}
    for x, w in step:
        groups.setdefault((id(w.kernels), w.blocks.shape[1]), []).append((x, w))
    joined = []
    for members in groups.values():
        x, first = members[0]
        blocks = np.concatenate([w.blocks for _, w in members])
        blocks.setflags(write=False)  # as the model's are (the kernels take read-only blocks)
        joined.append((x, first.kernels, blocks, np.empty((1, blocks.shape[0]), np.float32)))

    def per_kind() -> None:
        for x, kernels, blocks, out in joined:
            kernels.matmul_int8(blocks, *(kernels.quantize or backend._quantize)(x), out)

    each = _best_seconds(per_matrix, 5)
    grouped = _best_seconds(per_kind, 5)
    print(
        f"numba call, {threads} threads: serial {serial * 1e6:.2f} us, empty parallel region "
        f"{launch * 1e6:.2f} us"
    )
    print(
        f"the step's {len(step)} matrix products ({total / 1e6:.1f} MB) back to back: {each * 1e3:.3f} ms "
        f"({total / each / 1e9:.1f} GB/s); the same kernels and bytes in {len(joined)} calls (each kind's "
        f"matrices joined): {grouped * 1e3:.3f} ms ({total / grouped / 1e9:.1f} GB/s)"
    )


if __name__ == "__main__":
    main()
