"""Single-sequence speed on the default model: load, RSS, prefill, decode, and the matmul ceiling.

Usage: python scripts/bench_forward.py [--prompt-tokens 512] [--decode-tokens 128] [--threads N]
Targets on the 2-core reference machine: load <= 3 s, RSS <= 1.2 GB, decode step <= 1.25x the
pure-matmul time, prefill >= 380 tok/s.
"""

from __future__ import annotations

import argparse
import os
import time

from benchlib import load_default, matmul_ceiling, peak_rss_mb
from threadpoolctl import threadpool_info, threadpool_limits

from infer.engine.runtime.engine import EngineConfig
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams


def main() -> None:
    """Print the figures and ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--decode-tokens", type=int, default=128)
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    if args.threads:
        threadpool_limits(args.threads, user_api="blas")
    blas = next((i for i in threadpool_info() if i["user_api"] == "blas"), {})
    print(f"cores {os.cpu_count()}, BLAS {blas.get('internal_api')} {blas.get('num_threads')} threads")

    started = time.perf_counter()
    engine = load_default(EngineConfig(ctx_size=2048, max_num_seqs=1, batch_size=512))
    load_s = time.perf_counter() - started
    greedy = SamplingParams(temperature=0.0)
    prompt = tuple((i * 37) % 20000 + 100 for i in range(args.prompt_tokens))

    prefill, decode = [], []
    for _ in range(args.repeats):
        done = engine.generate(Request(prompt, greedy, max_tokens=1, ignore_eos=True)).done
        prefill.append(args.prompt_tokens / done.timings.prefill_s)
        done = engine.generate(
            Request(prompt[:8], greedy, max_tokens=args.decode_tokens, ignore_eos=True)
        ).done
        decode.append(done.timings.decode_tokens_per_s(done.usage.completion_tokens))
    prefill_tps, decode_tps = max(prefill), max(decode)
    ceiling_s = matmul_ceiling(engine.model, 1)
    step_s = 1.0 / decode_tps
    print(f"load                 {load_s:8.2f} s      (target <= 3 s)")
    print(f"peak RSS             {peak_rss_mb():8.0f} MB     (target <= 1200 MB)")
    print(f"prefill {args.prompt_tokens:4d} tokens  {prefill_tps:8.1f} tok/s  (target >= 380)")
    print(f"decode {args.decode_tokens:4d} tokens   {decode_tps:8.1f} tok/s  = {step_s * 1e3:.1f} ms/step")
    print(
        f"pure-matmul step     {ceiling_s * 1e3:8.1f} ms     "
        f"ratio step/matmul {step_s / ceiling_s:.2f}x (target <= 1.25x)"
    )
    print(f"(best of {args.repeats} runs each)")


if __name__ == "__main__":
    main()
