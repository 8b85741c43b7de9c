"""Continuous-batching throughput on the default model, beside the numpy matmul ceiling.

Usage: python scripts/bench_batching.py [--concurrency 1,4,16,64] [--new-tokens 64] [--threads N]
Prints aggregate decode tok/s at each concurrency (short prompts, `--new-tokens` each), prefill tok/s
for one 512-token prompt, and the median engine decode step beside the pure-matmul time of a step
with the same number of rows. Targets on the 2-core reference machine: step <= 1.3x matmul at
every size; >= 220 tok/s at 16 sequences, >= 400 tok/s at 64; prefill >= 400 tok/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from benchlib import load_default, matmul_ceiling
from threadpoolctl import threadpool_info, threadpool_limits

from infer.engine.engine import Engine, EngineConfig
from infer.engine.request import Request
from infer.engine.sampling import SamplingParams


def decode_run(engine: Engine, sequences: int, new_tokens: int) -> tuple[float, float]:
    """(aggregate decode tok/s, median decode-step seconds) for `sequences` concurrent requests."""
    greedy = SamplingParams(temperature=0.0)
    streams = [
        engine.submit(
            Request(tuple(100 + (7 * i + j) % 5000 for j in range(12)), greedy, new_tokens, ignore_eos=True)
        )
        for i in range(sequences)
    ]
    # Prefill everyone first so the timed part is pure decode with all sequences in the batch.
    engine.step()
    while any(seq.phase.value != "decode" for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    step_times = []
    started = time.perf_counter()
    while engine.scheduler.running:
        t0 = time.perf_counter()
        engine.step()
        step_times.append(time.perf_counter() - t0)
    elapsed = time.perf_counter() - started
    tokens = sum(len(s.result().token_ids) - 1 for s in streams)
    return tokens / elapsed, statistics.median(step_times)


def main() -> None:
    """Print the table of figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    if args.threads:
        threadpool_limits(args.threads, user_api="blas")
    sizes = [int(x) for x in args.concurrency.split(",")]
    blas = next((i for i in threadpool_info() if i["user_api"] == "blas"), {})
    print(f"cores {os.cpu_count()}, BLAS {blas.get('internal_api')} {blas.get('num_threads')} threads")
    engine = load_default(EngineConfig(ctx_size=1024, max_num_seqs=max(sizes), max_batched_tokens=2048))
    decode_run(engine, 2, 4)  # warm-up: rope tables, first-touch of cache pages

    print(f"{'seqs':>5} {'agg tok/s':>10} {'step ms':>8} {'matmul ms':>10} {'ratio':>6}")
    for size in sizes:
        tps, step_s = decode_run(engine, size, args.new_tokens)
        ceiling = matmul_ceiling(engine.model, size)
        print(f"{size:>5} {tps:>10.1f} {step_s * 1e3:>8.1f} {ceiling * 1e3:>10.1f} {step_s / ceiling:>5.2f}x")

    greedy = SamplingParams(temperature=0.0)
    prompt = tuple(100 + (13 * j) % 20000 for j in range(512))
    best = 0.0
    for _ in range(3):
        done = engine.generate(Request(prompt, greedy, max_tokens=1, ignore_eos=True)).done
        best = max(best, 512 / done.timings.prefill_s)
    print(f"prefill 512 tokens: {best:.1f} tok/s (best of 3)")


if __name__ == "__main__":
    main()
