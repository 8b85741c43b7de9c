"""Decode speed on a busy machine: tok/s with a CPU-bound process competing for one core vs quiet.

Each round runs `infer generate --json` (default settings unless `--infer-args` says otherwise) once
quiet and once beside a busy loop pinned to one core, in alternating order, and reads the engine's own
`decode_tokens_per_s`. The figure that matters is the ratio busy/quiet (target >= 0.5): a thread pool
whose threads wait on each other (or spin) collapses when one of its cores is taken.

    python scripts/bench_contention.py                      # default settings, 3 rounds
    python scripts/bench_contention.py --infer-args "-t 1"  # compare a setting
    python scripts/bench_contention.py --json

Other load on the machine makes both figures noisy; the ratio of runs taken side by side holds better.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass

PROMPT = "Write a long story about a lighthouse keeper and the sea."


def _spin(core: int) -> None:
    """A CPU-bound competitor on one core (runs until terminated)."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {core})
    x = 0
    while True:
        x = (x * 1103515245 + 12345) & 0xFFFFFFFF


def decode_speed(n_predict: int, infer_args: list[str]) -> float:
    """One `infer generate --json` run's decode tokens/s."""
    command = [
        sys.executable, "-c", "from infer.cli.main import main; main()", "generate", "--json", "--raw",
        "--temp", "0", "--ignore-eos", "-n", str(n_predict), *infer_args, PROMPT,
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=900)
    if result.returncode != 0:
        raise SystemExit(f"bench_contention: infer failed: {result.stderr.strip()}")
    return float(json.loads(result.stdout)["decode_tokens_per_s"])


@dataclass(frozen=True)
class Figures:
    """Median decode tok/s quiet and busy, every run, and the ratio."""

    quiet: float
    busy: float
    ratio: float
    quiet_runs: list[float]
    busy_runs: list[float]
    load_average: float
    infer_args: str


def measure(rounds: int, n_predict: int, infer_args: list[str], core: int) -> Figures:
    """Alternate quiet and busy runs for `rounds` rounds."""
    quiet: list[float] = []
    busy: list[float] = []
    for index in range(rounds):
        order = ("quiet", "busy") if index % 2 == 0 else ("busy", "quiet")
        for kind in order:
            if kind == "quiet":
                quiet.append(decode_speed(n_predict, infer_args))
                continue
            competitor = multiprocessing.Process(target=_spin, args=(core,), daemon=True)
            competitor.start()
            try:
                time.sleep(0.5)  # let the scheduler see it
                busy.append(decode_speed(n_predict, infer_args))
            finally:
                competitor.terminate()
                competitor.join()
    q, b = statistics.median(quiet), statistics.median(busy)
    return Figures(q, b, b / q if q else 0.0, quiet, busy, os.getloadavg()[0], " ".join(infer_args))


def main(argv: list[str] | None = None) -> None:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=3, help="quiet+busy pairs (default 3)")
    parser.add_argument("-n", "--n-predict", type=int, default=96, help="tokens per run (default 96)")
    parser.add_argument("--core", type=int, default=0, help="the core the competitor is pinned to")
    parser.add_argument("--infer-args", default="", help="extra `infer generate` arguments, e.g. '-t 1'")
    parser.add_argument("--json", action="store_true", help="print JSON")
    args = parser.parse_args(argv)
    figures = measure(args.rounds, args.n_predict, shlex.split(args.infer_args), args.core)
    if args.json:
        print(json.dumps(asdict(figures)))
        return
    shown = figures.infer_args or "(default settings)"
    print(
        f"infer generate {shown}, {args.n_predict} tokens, {args.rounds} rounds, competitor on core "
        f"{args.core}, load average {figures.load_average:.1f}"
    )
    print(f"  quiet: {figures.quiet:7.1f} tok/s   {[round(x, 1) for x in figures.quiet_runs]}")
    print(f"  busy:  {figures.busy:7.1f} tok/s   {[round(x, 1) for x in figures.busy_runs]}")
    print(f"  busy/quiet: {figures.ratio:.2f}x (target >= 0.5x)")


if __name__ == "__main__":
    main()
