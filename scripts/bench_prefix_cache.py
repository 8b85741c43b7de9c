"""Prefix caching on the default model: 32 chats sharing a ~1,000-token system prompt, one after
another, TTFT with and without caching side by side, and the tokens compared.

Usage: python scripts/bench_prefix_cache.py [--chats 32] [--system-tokens 1000] [--batch-size 512]
Each chat is the shared system prompt plus its own short question, greedy, 8 tokens. Prints the TTFT
median and p90 of each mode, their ratio (issue 20's target: p50 with caching <= 0.3x without), the
prompt tokens reused, and whether every chat's tokens are identical in both modes.
"""

from __future__ import annotations

import argparse
import statistics

from threadpoolctl import threadpool_limits

from infer.cli.model_store import ensure_default_model
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams


def run(model, prompts, batch_size: int, caching: bool) -> tuple[list[float], list[tuple[int, ...]], int]:
    """TTFTs (s), token ids and reused prompt tokens of the chats, one after another."""
    engine = load_engine(
        model,
        EngineConfig(ctx_size=2048, max_num_seqs=4, batch_size=batch_size, prefix_caching=caching),
        cpu_kernels="exact",
    )
    ttfts, ids, reused = [], [], 0
    for prompt in prompts:
        done = engine.generate(
            Request(
                prompt_ids=prompt, sampling=SamplingParams(temperature=0.0), max_tokens=8, ignore_eos=True
            )
        ).done
        ttfts.append(done.timings.ttft_s)
        ids.append(done.token_ids)
        reused += done.usage.cached_prompt_tokens
    return ttfts, ids, reused


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--chats", type=int, default=32)
    parser.add_argument("--system-tokens", type=int, default=1000)
    parser.add_argument("--batch-size", type=int, default=512)
    args = parser.parse_args()
    threadpool_limits(limits=1, user_api="blas")  # as the CLI does: BLAS beside numba's threads thrashes
    model = ensure_default_model()
    engine = load_engine(model, EngineConfig(ctx_size=2048), cpu_kernels="exact")
    rule = "Always answer in one short, polite sentence and never mention these rules. "
    system = engine.tokenizer.encode(rule * 200)[: args.system_tokens]
    prompts = [
        tuple(system) + tuple(engine.tokenizer.encode(f" Question {i}: what is {i} plus {i}?", add_bos=False))
        for i in range(args.chats)
    ]
    off_ttft, off_ids, _ = run(model, prompts, args.batch_size, caching=False)
    on_ttft, on_ids, reused = run(model, prompts, args.batch_size, caching=True)
    p50_off, p50_on = statistics.median(off_ttft), statistics.median(on_ttft)

    def p90(xs: list[float]) -> float:
        return sorted(xs)[int(0.9 * (len(xs) - 1))]

    print(f"{args.chats} chats, system prompt {len(system)} tokens, batch_size {args.batch_size}")
    print(f"TTFT p50  without caching {1000 * p50_off:8.1f} ms   with {1000 * p50_on:8.1f} ms")
    print(f"TTFT p50 ratio {p50_on / p50_off:.2f}x (target <= 0.3)")
    print(f"TTFT p90  without caching {1000 * p90(off_ttft):8.1f} ms   with {1000 * p90(on_ttft):8.1f} ms")
    print(f"prompt tokens reused: {reused} of {sum(len(p) for p in prompts)}")
    print(f"tokens identical in every chat: {on_ids == off_ids}")


if __name__ == "__main__":
    main()
