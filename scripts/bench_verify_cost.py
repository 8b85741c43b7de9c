"""What a speculative verify step costs against a plain decode step, and what the drafts would have to
deliver for a given speed-up (issue 15's copying target).

Usage: python scripts/bench_verify_cost.py [--context 450] [--rows 1,2,3,4,5,9] [--repeats 40]
       [--cpu-kernels int8|exact] [--target 1.8] [--model PATH]

Prefills one sequence of --context tokens of the default model (or --model, e.g. a bench_sizes.py GGUF
at the 1B or 8B shape, where decode streams the weights from memory), then times forwards of 1..k+1 rows of
that sequence at the next position (a decode row, or k drafts plus the last token being verified), the
median of --repeats each. For each row count it prints the cost against one row and the tokens a verify
step would have to yield (at most rows) for the speed-up --target: cost x target. Speculation cannot
reach the target where that exceeds what the drafts can give.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from threadpoolctl import threadpool_limits

from infer.cli.model_store import ensure_default_model
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.runtime.engine import EngineConfig, load_engine


def main() -> None:
    """Print the cost table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--context", type=int, default=450)
    parser.add_argument("--rows", default="1,2,3,4,5,9")
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--cpu-kernels", default="int8", help="the product's default mode unless given")
    parser.add_argument("--model", default=None, help="a GGUF path (default: the default model)")
    parser.add_argument("--target", type=float, default=1.8)
    args = parser.parse_args()
    threadpool_limits(1, user_api="blas")  # what `infer` does beside the numba kernels
    engine = load_engine(
        args.model or ensure_default_model(),
        EngineConfig(ctx_size=args.context + 64, max_num_seqs=1),
        cpu_kernels=args.cpu_kernels,
        mmap=False,  # the weights copied, as infer's default profile runs them
    )
    model = engine.model
    cache = model.make_cache(1, args.context + 64)
    tokens = (np.arange(args.context, dtype=np.int64) * 37) % 20000 + 100

    def forward(start: int, ids: np.ndarray) -> None:
        segment = (Segment(0, start, len(ids)),)
        model.forward(ForwardBatch(ids, segment, np.arange(len(ids), dtype=np.int64)), cache)

    forward(0, tokens)
    medians: dict[int, float] = {}
    for rows in (int(r) for r in args.rows.split(",")):
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            forward(args.context, tokens[:rows])
            times.append(time.perf_counter() - started)
        medians[rows] = statistics.median(times)
    one = medians.get(1) or min(medians.values())
    print(f"{args.cpu_kernels} kernels, context {args.context}, median of {args.repeats}")
    print(f"{'rows':>4} {'ms':>8} {'x one row':>10} {f'tokens needed for {args.target:g}x':>28}")
    for rows, seconds in medians.items():
        needed = seconds / one * args.target
        verdict = "" if needed <= rows else "  (more than the step can give)"
        print(f"{rows:>4} {seconds * 1e3:8.2f} {seconds / one:10.2f} {needed:28.2f}{verdict}")


if __name__ == "__main__":
    main()
