"""Decode speed with the engine's steps in the loading thread against its background step thread (the
mode `infer generate`, `infer stream`, `infer chat`, `infer serve` and `infer bench`'s concurrency
sweep run in), with and without the loading thread's OpenMP pool released first
(engine/backends/openmp_pool.py).

Usage: python scripts/bench_step_thread.py [--model GGUF] [--streams 1] [--tokens 128] [--prompt 32]
           [--rounds 3] [--threads 2]
Each round runs the same `--streams` greedy requests (`--prompt` tokens, `--tokens` new ones each) three
ways, in turn: steps driven by the loading thread (which builds its pool), in the background loop with
the release turned off (what every background run did before), and in the background loop after
`Engine.start()` released the pool. Decode tok/s = tokens after each stream's first over the time
from the first stream's first token to the last token (prefill apart); prints medians and each
background figure's ratio to the loading thread's. Other load on the machine makes every figure
noisy: compare the ratios.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

os.environ.setdefault("OMP_WAIT_POLICY", "ACTIVE")  # what `infer` sets (cli/runtime.py)
os.environ.setdefault("GOMP_SPINCOUNT", "20000")

import numba
from threadpoolctl import threadpool_limits

from infer.cli.model_store import ensure_default_model
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

MODES = ("loading thread", "background, pool kept", "background")
"""In run order: the pool the loading thread builds is alive for the second, released by the third."""


def decode_rate(engine: Engine, mode: str, streams: int, prompt: int, tokens: int) -> float:
    """Aggregate decode tok/s of one run of `streams` requests in `mode` (one of MODES)."""
    release = engine.executor.release_thread
    if mode == MODES[1]:
        engine.executor.release_thread = lambda: None  # type: ignore[method-assign]
    params = SamplingParams(temperature=0)
    submitted = [
        engine.submit(
            Request(
                tuple((i * 37 + s * 11) % 20000 + 100 for i in range(prompt)),
                params,
                max_tokens=tokens,
                ignore_eos=True,
                seed=s,
            )
        )
        for s in range(streams)
    ]
    if mode != MODES[0]:
        engine.start()
    stamps: list[list[float]] = [[] for _ in submitted]
    try:
        for stamp, stream in zip(stamps, submitted, strict=True):  # events queue up; read in turn
            for _ in stream:
                stamp.append(time.perf_counter())
    finally:
        if mode != MODES[0]:
            engine.shutdown(cancel=False)
        engine.executor.release_thread = release  # type: ignore[method-assign]
    first = min(s[0] for s in stamps)
    last = max(s[-2] for s in stamps)  # the last token event (the DoneEvent follows it)
    return sum(len(s) - 2 for s in stamps) / (last - first)


def main() -> None:
    """Print the three modes' medians and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF path (default: the default model)")
    parser.add_argument("--streams", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    threadpool_limits(1, user_api="blas")
    numba.set_num_threads(args.threads)
    engine = load_engine(
        args.model or ensure_default_model(),
        EngineConfig(ctx_size=4096, max_num_seqs=max(1, args.streams)),
        cpu_kernels="int8",
        threads=args.threads,
    )
    figures: dict[str, list[float]] = {mode: [] for mode in MODES}
    for mode in MODES:  # warm-up
        decode_rate(engine, mode, args.streams, args.prompt, 8)
    for _ in range(args.rounds):
        for mode in MODES:
            figures[mode].append(decode_rate(engine, mode, args.streams, args.prompt, args.tokens))
    base = statistics.median(figures[MODES[0]])
    print(
        f"{args.model or 'default model'}: {args.streams} stream(s), {args.tokens} tokens, "
        f"{args.threads} threads, load {os.getloadavg()[0]:.2f}; medians of {args.rounds} alternating rounds"
    )
    for mode in MODES:
        median = statistics.median(figures[mode])
        runs = " / ".join(f"{f:.1f}" for f in figures[mode])
        print(f"  {mode:24} {median:8.1f} tok/s  {median / base:5.2f}x   ({runs})")


if __name__ == "__main__":
    main()
