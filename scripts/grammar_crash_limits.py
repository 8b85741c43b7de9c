#!/usr/bin/env python
"""Where llguidance's native code crashes: the longest `$defs` chain, Lark chain and GBNF chain it
compiles before a stack overflow (SIGSEGV), found by bisection, each probe in a child process so a
crash is observed rather than suffered. The bounds in `engine/grammar/limits.py` are set from these.

    python scripts/grammar_crash_limits.py                  # 8 MiB stack (Linux's default ulimit -s)
    python scripts/grammar_crash_limits.py --stack-mb 4 64  # the same on other stacks
    python scripts/grammar_crash_limits.py --gbnf           # also GBNF (its converter is quadratic: slow)

Each probe compiles the grammar (`grammar_from_*`, `validate_grammar_with_warnings`), builds a
matcher over a byte-level vocabulary and computes its first mask, on a thread with the given stack,
and reports the last stage it finished; the output names the last length that passed, the first that
crashed, and the stage the crash came after.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from hostile_requests import defs_chain, gbnf_chain, lark_chain


def _bare_refs(links: int) -> str:
    defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(links)}
    defs[f"d{links}"] = {"type": "string"}
    return json.dumps({"$ref": "#/$defs/d0", "$defs": defs})


FAMILIES: dict[str, tuple[str, Callable[[int], str], int, int]] = {
    # name: (format, source of length n, a length that passes, a length that crashes)
    "defs_object_chain": ("json", lambda n: json.dumps(defs_chain(n)), 100, 4000),
    "defs_ref_chain": ("json", _bare_refs, 100, 8000),
    "lark_chain": ("lark", lark_chain, 100, 12000),
    "gbnf_chain": ("gbnf", gbnf_chain, 100, 4000),
}


def probe(fmt: str, source: str, stack_mb: int) -> None:
    """Compile `source` and match one mask on a `stack_mb` thread, printing each stage as it ends."""
    import llguidance
    from llguidance.gbnf_to_lark import any_to_lark

    matcher_type = llguidance.LLMatcher

    class Bytes:
        def __init__(self) -> None:
            self.eos_token_id, self.bos_token_id = 256, None
            self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
            self.special_token_ids = [256]

        def __call__(self, text: str) -> list[int]:
            return list(text.encode())

    tokenizer = llguidance.LLTokenizer(llguidance.TokenizerWrapper(Bytes()), n_vocab=257, eos_token=[256])

    def stages() -> None:
        if fmt == "json":
            grammar = matcher_type.grammar_from_json_schema(source)
        else:
            grammar = matcher_type.grammar_from_lark(any_to_lark(source) if fmt == "gbnf" else source)
        print("stage converted", flush=True)
        is_error, messages = matcher_type.validate_grammar_with_warnings(grammar)
        print(f"stage validated error={is_error} {' '.join(str(messages).split())[:120]}", flush=True)
        if is_error:
            return
        matcher = matcher_type(tokenizer, grammar, log_level=0)
        print("stage matcher", flush=True)
        matcher.compute_bitmask()
        print("stage mask", flush=True)

    threading.stack_size(stack_mb * 2**20)
    thread = threading.Thread(target=stages)
    thread.start()
    thread.join()


def run_probe(family: str, n: int, stack_mb: int) -> tuple[bool, str]:
    """(survived, last stage) of one probe in a child process."""
    command = [sys.executable, __file__, "--probe", family, str(n), str(stack_mb)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=1800, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("stage")]
    return done.returncode == 0, (lines[-1] if lines else "before converting")


def bisect(family: str, stack_mb: int) -> str:
    """The crash threshold of one family on one stack, as a line of text."""
    _, _, good, bad = FAMILIES[family]
    survived, stage = run_probe(family, bad, stack_mb)
    for _ in range(3):  # a deeper stack: look further (up to 8x)
        if not survived:
            break
        good, bad = bad, 2 * bad
        survived, stage = run_probe(family, bad, stack_mb)
    if survived:
        return f"{family:18} stack {stack_mb:3} MiB: no crash up to {bad} ({stage})"
    while bad - good > max(1, good // 100):
        middle = (good + bad) // 2
        survived, last = run_probe(family, middle, stack_mb)
        if survived:
            good = middle
        else:
            bad, stage = middle, last
    return f"{family:18} stack {stack_mb:3} MiB: compiles {good}, crashes at {bad} (after '{stage}')"


def main(argv: list[str] | None = None) -> int:
    """Bisect every family on every stack size asked for."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stack-mb", type=int, nargs="+", default=[8])
    parser.add_argument("--gbnf", action="store_true", help="also the GBNF chain (minutes)")
    parser.add_argument("--probe", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.probe:
        family, n, stack_mb = args.probe[0], int(args.probe[1]), int(args.probe[2])
        fmt, make, _, _ = FAMILIES[family]
        probe(fmt, make(n), stack_mb)
        return 0
    families = [f for f in FAMILIES if args.gbnf or f != "gbnf_chain"]
    for stack_mb in args.stack_mb:
        for family in families:
            print(bisect(family, stack_mb), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
