"""Continuous-batching throughput on the default model, beside the numpy matmul ceiling.

Usage: python scripts/bench_batching.py [--concurrency 1,4,16,64] [--new-tokens 64] [--threads N]
Prints aggregate decode tok/s at each concurrency (short prompts, `--new-tokens` each, over the time
spent in engine steps), prefill tok/s for one 512-token prompt, and the median engine decode step
beside two pure-matmul steps with the same number of rows: the weight matmuls and vocabulary
projection alone ("matmul"), and those plus each layer's two decode-attention matmuls over the cache
("+attn", every matmul of the step). Each engine step is paired with both matmul steps run right after
it, and each ratio is the median of those pairs. Targets on the 2-core reference machine:
step <= 1.3x matmul at every size; >= 220 tok/s at 16 sequences, >= 400 tok/s at 64; prefill >= 400
tok/s.
"""

from __future__ import annotations

import argparse
import os
import statistics
from dataclasses import dataclass

from benchlib import attention_matmul_step, load_default, matmul_step, timed
from threadpoolctl import threadpool_info, threadpool_limits

from infer.engine.runtime.engine import Engine, EngineConfig
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams


@dataclass
class DecodeRun:
    """One concurrency level: engine decode steps, each paired with a pure-matmul step run right
    after it, so both see the same machine (this VM's speed drifts by 5-10 % within a minute)."""

    tokens: int
    step_s: list[float]
    matmul_s: list[float]
    all_matmul_s: list[float]
    """Paired steps of every matmul, the decode-attention ones included."""

    @property
    def tokens_per_s(self) -> float:
        """Aggregate decode throughput over the time spent in engine steps."""
        return self.tokens / sum(self.step_s)

    @property
    def ratio(self) -> float:
        """Median over the steps of engine step / its paired matmul step."""
        return statistics.median(s / m for s, m in zip(self.step_s, self.matmul_s, strict=True))

    @property
    def ratio_all(self) -> float:
        """Median over the steps of engine step / its paired all-matmul step."""
        return statistics.median(s / m for s, m in zip(self.step_s, self.all_matmul_s, strict=True))


def decode_run(engine: Engine, sequences: int, new_tokens: int) -> DecodeRun:
    """`sequences` concurrent greedy requests (12-token prompts, `new_tokens` each), prefilled first
    so that every timed step is pure decode with all sequences in the batch."""
    greedy = SamplingParams(temperature=0.0)
    streams = [
        engine.submit(
            Request(tuple(100 + (7 * i + j) % 5000 for j in range(12)), greedy, new_tokens, ignore_eos=True)
        )
        for i in range(sequences)
    ]
    engine.step()
    while any(seq.in_prefill for seq in engine.scheduler.running) or engine.scheduler.waiting:
        engine.step()
    ceiling = matmul_step(engine.model, sequences)
    all_ceiling = attention_matmul_step(engine.model, engine.cache, sequences)
    ceiling()  # warm-up
    step_s, matmul_s, all_matmul_s = [], [], []
    while engine.scheduler.running:
        width = (
            max(s.num_computed_tokens for s in engine.scheduler.running) + 1
        )  # what this step's attention reads
        step_s.append(timed(engine.step))
        matmul_s.append(timed(ceiling))
        all_matmul_s.append(timed(lambda width=width: all_ceiling(width)))
    tokens = sum(len(s.result().token_ids) - 1 for s in streams)
    return DecodeRun(tokens, step_s, matmul_s, all_matmul_s)


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

    header = f"{'seqs':>5} {'agg tok/s':>10} {'step ms':>8} {'matmul ms':>10} {'ratio':>6}"
    print(f"{header} {'+attn ms':>9} {'ratio':>6}")
    for size in sizes:
        run = decode_run(engine, size, args.new_tokens)
        step_ms = statistics.median(run.step_s) * 1e3
        matmul_ms = statistics.median(run.matmul_s) * 1e3
        all_ms = statistics.median(run.all_matmul_s) * 1e3
        print(
            f"{size:>5} {run.tokens_per_s:>10.1f} {step_ms:>8.1f} {matmul_ms:>10.1f} {run.ratio:>5.2f}x"
            f" {all_ms:>9.1f} {run.ratio_all:>5.2f}x"
        )

    greedy = SamplingParams(temperature=0.0)
    prompt = tuple(100 + (13 * j) % 20000 for j in range(512))
    best = 0.0
    for _ in range(3):
        done = engine.generate(Request(prompt, greedy, max_tokens=1, ignore_eos=True)).done
        best = max(best, 512 / done.timings.prefill_s)
    print(f"prefill 512 tokens: {best:.1f} tok/s (best of 3)")


if __name__ == "__main__":
    main()
