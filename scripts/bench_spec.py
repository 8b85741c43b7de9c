"""Speculative decoding on the default model: decode tok/s with speculation off and on, side by side.

Usage: python scripts/bench_spec.py [--profile cpu-fast] [--n-predict 256] [--json] [--spec-method ...]
       [--cpu-kernels exact|int8|blas]

Tasks (greedy, chat template):
  (a) input copying: rewrite a given ~300-token code file with one change; summarise a given passage
      quoting it. Target: >= 1.8x decode tok/s with mean accepted length >= 2.5.
  (b) open chat: a question whose answer copies nothing. Target: >= 0.95x (never a real slowdown).
Each task runs off, then on (with --rounds 2: off, on, on, off), all in one process on one engine,
and the ratio is taken from the summed decode times, so drift in the machine's speed during the run
weighs on both sides alike. Speculation comes from the profile's `speculative:`
section (cpu-fast: prompt lookup) or the --spec-* flags; the tokens are checked to be identical.
Decode tok/s = (completion tokens - 1) / time from the first token to the last.

The "oracle t/step" column bounds what any drafter could do on the task: replayed on the greedy output,
an oracle that sees the answer picks, among every earlier occurrence of the last ngram_min..ngram_max
tokens, the one whose continuation matches longest, and verifies up to num_tokens drafts a step; the
column is the tokens it gains per verify step. Against scripts/bench_verify_cost.py's cost of a verify
step, it caps the speed-up prompt lookup can reach with this model.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from infer.cli.runtime import open_engine
from infer.engine.runtime.engine import Engine
from infer.engine.runtime.events import DoneEvent
from infer.engine.speculative import merge, summary
from infer.engine.text.prompts import prompt_ids
from infer.profiles.requests import build_request, spec_config
from infer.profiles.settings import Settings, refuse_unimplemented, resolve_settings

CODE_FILE = '''\
import math
from dataclasses import dataclass


@dataclass
class Circle:
    """A circle given by its radius."""

    radius: float

    def area(self) -> float:
        return math.pi * self.radius ** 2

    def perimeter(self) -> float:
        return 2 * math.pi * self.radius


@dataclass
class Rectangle:
    """A rectangle given by its width and height."""

    width: float
    height: float

    def area(self) -> float:
        return self.width * self.height

    def perimeter(self) -> float:
        return 2 * (self.width + self.height)


def total_area(shapes: list) -> float:
    """The sum of the areas of all shapes."""
    total = 0.0
    for shape in shapes:
        total += shape.area()
    return total


def largest(shapes: list):
    """The shape with the largest area, or None for an empty list."""
    best = None
    for shape in shapes:
        if best is None or shape.area() > best.area():
            best = shape
    return best


if __name__ == "__main__":
    shapes = [Circle(1.0), Rectangle(2.0, 3.0), Circle(0.5)]
    print(total_area(shapes))
    print(largest(shapes))
'''

PASSAGE = """\
The lighthouse at Point Arden was built in 1871 to guard the narrow channel between the mainland and \
the northern islands. For more than a century its keepers lived in the small stone house beside the \
tower, trimming the wicks every four hours and recording the weather in a leather-bound log. In 1932 \
the oil lamp was replaced by an electric light, which could be seen twenty-two miles out to sea. The \
last keeper, Margaret Hale, left in 1988 when the light was automated. She later said that the hardest \
part of the job was not the storms but the silence of the long winter nights. Today the keeper's house \
is a small museum, and visitors can climb the one hundred and twelve steps to the lantern room, where \
the original brass fittings still shine."""

TASKS: dict[str, tuple[str, str]] = {
    "a-code-edit": (
        "a",
        "Here is a Python file:\n\n```python\n" + CODE_FILE + "```\n\nRewrite the whole file with one "
        "change: rename the method `perimeter` to `circumference`. Output the complete file.",
    ),
    "a-quote-summary": (
        "a",
        "Read this passage:\n\n" + PASSAGE + "\n\nSummarise the passage in a few sentences, quoting its "
        "key sentences word for word.",
    ),
    "b-open-chat": ("b", "What are some good habits for staying healthy? Give me a few ideas."),
}


@dataclass
class Side:
    """The runs of one task with speculation off or on."""

    tokens: int = 0
    decode_s: float = 0.0
    counters: dict[str, int] | None = None
    token_ids: tuple[int, ...] | None = None

    def add(self, done: DoneEvent) -> None:
        """One run's figures."""
        if done.error:
            sys.exit(f"bench_spec: a run failed: {done.error}")
        if self.token_ids is not None and done.token_ids != self.token_ids:
            sys.exit("bench_spec: two runs of one task gave different tokens")
        self.token_ids = done.token_ids
        self.tokens += done.usage.completion_tokens - 1
        self.decode_s += done.timings.decode_s
        self.counters = merge(self.counters or {}, done.counters)

    @property
    def tokens_per_s(self) -> float:
        """Decode tokens per second over every run."""
        return self.tokens / self.decode_s if self.decode_s else 0.0


def oracle_tokens_per_step(prompt: Sequence[int], output: Sequence[int], k: int, ngram: range) -> float:
    """Tokens per verify step of an oracle drafter replayed on `output` (see the module docstring):
    each step gains the longest match of its up-to-k drafts with the answer, plus the target's token."""
    context = np.asarray([*prompt, *output], dtype=np.int64)
    answer = context[len(prompt) :]
    done = steps = 0
    while done < len(answer):
        end = len(prompt) + done  # the context the step drafts from: context[:end]
        best = 0
        for n in ngram:
            if n >= end:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(context[: end - 1], n)
            for start in np.flatnonzero((windows == context[end - n : end]).all(axis=1)):
                follow = context[start + n : min(start + n + k, end)]
                want = answer[done : done + len(follow)]
                match = int(np.argmin(np.append(follow[: len(want)] == want, False)))
                best = max(best, match)
        done += best + 1
        steps += 1
    return len(answer) / steps if steps else 0.0


def chat_ids(engine: Engine, text: str) -> list[int]:
    """The prompt ids of a one-message chat."""
    return list(prompt_ids(engine.tokenizer, messages=[{"role": "user", "content": text}], chat=True))


def run(engine: Engine, settings: Settings, text: str, speculate: bool) -> DoneEvent:
    """One greedy chat request, speculation as the settings say or off."""
    ids = chat_ids(engine, text)
    spec = spec_config(settings) if speculate else None
    return engine.generate(build_request(ids, settings, ignore_eos=False, spec=spec)).done


def main() -> None:
    """Run every task off/on/on/off and print (or --json) the figures."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profile", default="cpu-fast")
    parser.add_argument("--n-predict", type=int, default=256)
    parser.add_argument("--spec-method", default=None)
    parser.add_argument("--spec-num-tokens", type=int, default=None)
    parser.add_argument(
        "--cpu-kernels", choices=("exact", "int8", "blas"), default=None, help="default: the profile's"
    )
    parser.add_argument("--rounds", type=int, default=1, help="1: off, on; 2: off, on, on, off")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    flags = {
        "profile": args.profile,
        "n_predict": args.n_predict,
        "temperature": 0.0,
        "spec_method": args.spec_method,
        "spec_num_tokens": args.spec_num_tokens,
        "cpu_kernels": args.cpu_kernels,
    }
    settings = resolve_settings({k: v for k, v in flags.items() if v is not None})
    refuse_unimplemented(settings)
    if settings.spec_method == "none":
        sys.exit("bench_spec: the settings do not speculate (use --profile cpu-fast or --spec-method)")
    engine = open_engine(settings, max_num_seqs=1)
    run(engine, settings, "Hi", True)  # warm-up: kernels compiled, caches touched

    rows = []
    for name, (group, text) in TASKS.items():
        off, on = Side(), Side()
        for speculate in (False, True, True, False)[: 2 * args.rounds]:
            done = run(engine, settings, text, speculate)
            (on if speculate else off).add(done)
            speed = done.timings.decode_tokens_per_s(done.usage.completion_tokens)
            label = "on" if speculate else "off"
            print(f"bench_spec: {name} {label}: {speed:.2f} tok/s", file=sys.stderr, flush=True)
        if off.token_ids != on.token_ids:
            sys.exit(f"bench_spec: {name}: speculation changed the tokens")
        stats = summary(on.counters or {}) or {}
        spec = spec_config(settings)
        ngram = range(spec.ngram_max, spec.ngram_min - 1, -1) if spec else range(0)
        oracle = oracle_tokens_per_step(chat_ids(engine, text), on.token_ids or (), spec.num_tokens, ngram)
        rows.append(
            {
                "task": name,
                "group": group,
                "tokens": len(on.token_ids or ()),
                "off_tok_s": round(off.tokens_per_s, 2),
                "on_tok_s": round(on.tokens_per_s, 2),
                "ratio": round(on.tokens_per_s / off.tokens_per_s, 3) if off.tokens_per_s else None,
                "acceptance_rate": stats.get("acceptance_rate"),
                "mean_accepted_length": stats.get("mean_accepted_length"),
                "drafts": stats.get("drafts"),
                "oracle_tokens_per_step": round(oracle, 2),
            }
        )
    header = {
        "profile": settings.profile_name,
        "spec": spec_config(settings).__dict__ if spec_config(settings) else None,
        "n_predict": args.n_predict,
        "cpu_kernels": settings.cpu_kernels,
    }
    if args.json:
        print(json.dumps({**header, "results": rows}, indent=2))
        return
    print(
        f"profile {header['profile']}, cpu_kernels {header['cpu_kernels']}, speculation {header['spec']}, "
        f"n_predict {args.n_predict}"
    )
    titles = ("tokens", "off t/s", "on t/s", "ratio", "accept", "mean len", "oracle t/step")
    print(f"{'task':<16} " + " ".join(f"{t:>8}" for t in titles))
    for r in rows:
        print(
            f"{r['task']:<16} {r['tokens']:>8} {r['off_tok_s']:>8.2f} {r['on_tok_s']:>8.2f} "
            f"{r['ratio']:>8.2f} {r['acceptance_rate']:>8.0%} {r['mean_accepted_length']:>8.2f} "
            f"{r['oracle_tokens_per_step']:>13.2f}"
        )


if __name__ == "__main__":
    main()
