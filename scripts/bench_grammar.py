"""Structured output's cost on the default model: decode tok/s with a JSON schema vs unconstrained,
and the grammar mask's time per token.

Usage: python scripts/bench_grammar.py [--new-tokens 64] [--rounds 3] [--threads N]
Runs greedy decodes of `--new-tokens` tokens from one chat prompt, alternating unconstrained (with
ignore_eos, so it runs the full length) and constrained by a JSON schema whose smallest document is
longer than that (so it runs the full length too), `--rounds` times each, side by side, and prints
the median decode tok/s of each and their ratio. Mask time is measured two ways: inside the
constrained runs (every `Constraint.mask` call, timed), and alone, replaying the constrained run's
tokens through a fresh matcher (mask + consume per token, no model). Targets (issue 16): constrained
>= 0.85x unconstrained; mask <= 1 ms/token for the 49k vocabulary.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numba
from threadpoolctl import threadpool_limits

from infer.cli.model_store import ensure_default_model
from infer.engine.grammar import Constraint, GrammarSpec
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams
from infer.engine.text.prompts import prompt_ids

SCHEMA = {
    "type": "array",
    "minItems": 40,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer", "minimum": 0, "maximum": 9999},
            "name": {"type": "string", "maxLength": 12},
            "active": {"type": "boolean"},
        },
        "required": ["id", "name", "active"],
        "additionalProperties": False,
    },
}


class MaskTimer:
    """Wraps `Constraint.mask` to add up its calls' wall time."""

    def __init__(self) -> None:
        self.calls = 0
        self.seconds = 0.0
        self._real = Constraint.mask

    def __enter__(self) -> MaskTimer:
        real = self._real

        def timed(constraint: Constraint):  # type: ignore[no-untyped-def]
            started = time.perf_counter()
            try:
                return real(constraint)
            finally:
                self.seconds += time.perf_counter() - started
                self.calls += 1

        Constraint.mask = timed  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Constraint.mask = self._real  # type: ignore[method-assign]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=0)
    args = parser.parse_args()
    threadpool_limits(limits=1, user_api="blas")
    if args.threads:
        numba.set_num_threads(args.threads)
    engine = load_engine(
        ensure_default_model(), EngineConfig(ctx_size=512, max_num_seqs=1), cpu_kernels="exact"
    )
    ids = tuple(
        prompt_ids(engine.tokenizer, messages=[{"role": "user", "content": "List users as JSON."}], chat=True)
    )
    spec = GrammarSpec.json_schema(SCHEMA)
    greedy = SamplingParams(temperature=0.0)

    def run(constrained: bool) -> tuple[float, tuple[int, ...]]:
        request = Request(
            ids,
            greedy,
            max_tokens=args.new_tokens,
            ignore_eos=not constrained,
            grammar=spec if constrained else None,
        )
        done = engine.generate(request).done
        assert done.finish_reason == "length", (done.finish_reason, done.error, done.text)
        return done.timings.decode_tokens_per_s(done.usage.completion_tokens), done.token_ids

    run(False)  # warm-up: kernels compiled, token table built
    run(True)
    free: list[float] = []
    constrained: list[float] = []
    tokens: tuple[int, ...] = ()
    with MaskTimer() as timer:
        for _ in range(args.rounds):
            free.append(run(False)[0])
            timer_calls_before = timer.calls
            speed, tokens = run(True)
            constrained.append(speed)
            assert timer.calls - timer_calls_before == args.new_tokens
    replay = Constraint(spec, engine.grammar_vocabulary)
    started = time.perf_counter()
    for token in tokens:
        replay.mask()
        replay.consume(token)
    replay_ms = (time.perf_counter() - started) / len(tokens) * 1000

    f, c = statistics.median(free), statistics.median(constrained)
    print(f"decode, {args.new_tokens} tokens, greedy, median of {args.rounds} alternating runs:")
    print(f"  unconstrained     {f:7.1f} tok/s   runs {[round(x, 1) for x in free]}")
    print(f"  JSON schema       {c:7.1f} tok/s   runs {[round(x, 1) for x in constrained]}")
    print(f"  ratio             {c / f:7.3f}x  (target >= 0.85)")
    print(
        f"mask in the step loop: {timer.seconds / timer.calls * 1000:.3f} ms/token over {timer.calls} masks"
    )
    print(f"mask + consume alone:  {replay_ms:.3f} ms/token (replay of {len(tokens)} tokens; target <= 1 ms)")
    print(f"output starts: {engine.tokenizer.decode(tokens)[:80]!r}")


if __name__ == "__main__":
    main()
