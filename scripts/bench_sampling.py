"""Benchmark the sampler chain: ms/token (median and p90 of many runs) for typical configurations.

    python scripts/bench_sampling.py [--vocab 49152] [--runs 300] [--history 4096] [--flat]

Logits are synthetic: by default "model-like" (a N(-4, 2) background with a dozen tokens at
logits 12..6, so the nucleus is small); ``--flat`` uses N(0, 3) logits, the worst case for stages that
must sort the whole vocabulary (top_p without top_k, typical-p). Each step samples and accepts a
token, so history-dependent stages (penalties, DRY, mirostat) see a growing history.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from infer.engine.sampling import SamplingParams, SequenceSampler

CONFIGS: dict[str, dict] = {
    "greedy": {"temperature": 0.0},
    "greedy + top_logprobs 5": {"temperature": 0.0, "n_probs": 5},
    "default chain": {},
    "default + top_logprobs 5": {"n_probs": 5},
    "penalties (last 64)": {"repeat_penalty": 1.1, "frequency_penalty": 0.2, "presence_penalty": 0.2},
    "penalties (whole history)": {"repeat_penalty": 1.1, "frequency_penalty": 0.2, "repeat_last_n": -1},
    "DRY (whole history)": {"dry_multiplier": 0.8},
    "DRY + penalties": {"dry_multiplier": 0.8, "repeat_penalty": 1.1},
    "DRY, degenerate loop": {"dry_multiplier": 0.8, "_history": "loop"},
    "mirostat v1": {"mirostat": 1},
    "mirostat v2": {"mirostat": 2},
    "xtc p=1": {"xtc_probability": 1.0, "xtc_threshold": 0.05},
    "top_n_sigma 1.0": {"top_n_sigma": 1.0},
    "dynatemp 0.5": {"dynatemp_range": 0.5},
    "no top_k (top_p + min_p)": {"top_k": 0},
    "no top_k, typical 0.9": {"top_k": 0, "typical_p": 0.9},
}


def make_logits(vocab: int, flat: bool, rng: np.random.Generator) -> np.ndarray:
    """Synthetic logits: model-like (peaked) by default, or flat N(0, 3)."""
    if flat:
        return (rng.standard_normal(vocab) * 3.0).astype(np.float32)
    logits = rng.standard_normal(vocab) * 2.0 - 4.0
    logits[rng.choice(vocab, 12, replace=False)] = np.linspace(12.0, 6.0, 12)
    return logits.astype(np.float32)


def make_history(vocab: int, n: int, rng: np.random.Generator) -> list[int]:
    """A prompt with repeated phrases (so DRY finds repeats) and some breaker tokens."""
    phrases = [rng.integers(0, vocab, rng.integers(3, 12)).tolist() for _ in range(40)]
    out: list[int] = []
    while len(out) < n:
        out += phrases[int(rng.integers(0, len(phrases)))]
        if rng.random() < 0.2:
            out.append(10)  # token 10 is a sequence breaker below
    return out[:n]


def bench(name: str, overrides: dict, args: argparse.Namespace) -> tuple[float, float]:
    overrides = dict(overrides)
    loop = overrides.pop("_history", None) == "loop"
    rng = np.random.default_rng(0)
    logits = [make_logits(args.vocab, args.flat, rng) for _ in range(8)]
    texts = [f"tok{i}" for i in range(args.vocab)]
    texts[10] = "\n"
    sampler = SequenceSampler(
        SamplingParams(**overrides),
        seed=1234,
        vocab_size=args.vocab,
        prompt_ids=[1, 2] * (args.history // 2) if loop else make_history(args.vocab, args.history, rng),
        token_texts=texts,
    )
    times = []
    for pos in range(args.runs + 20):
        x = logits[pos % len(logits)]
        t0 = time.perf_counter()
        tok = sampler.sample(x, pos)
        dt = time.perf_counter() - t0
        sampler.accept((1, 2)[pos % 2] if loop else tok.token_id)  # a loop stays a loop
        if pos >= 20:  # warm-up excluded
            times.append(dt * 1e3)
    times.sort()
    return statistics.median(times), times[int(0.9 * (len(times) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--vocab", type=int, default=49152)
    parser.add_argument("--runs", type=int, default=300)
    parser.add_argument("--history", type=int, default=4096, help="prompt tokens in the history")
    parser.add_argument("--flat", action="store_true", help="flat N(0, 3) logits (worst case)")
    args = parser.parse_args()
    kind = "flat" if args.flat else "model-like"
    print(f"vocab {args.vocab}, {kind} logits, history {args.history} tokens, {args.runs} runs each")
    print(f"{'config':<28} {'median ms':>10} {'p90 ms':>8}")
    for name, overrides in CONFIGS.items():
        med, p90 = bench(name, overrides, args)
        print(f"{name:<28} {med:>10.3f} {p90:>8.3f}")


if __name__ == "__main__":
    main()
