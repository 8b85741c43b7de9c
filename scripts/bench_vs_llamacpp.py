"""`infer` against llama.cpp on the same GGUF, same thread count, in one run (issue 14, acceptance 4).

Usage: python scripts/bench_vs_llamacpp.py [--threads N] [--model PATH] [--repetitions R]
           [--infer-args "--profile X ..."] [--llamacpp-args "--poll 0"] [--decode-target X]
           [--infer-temp T]
           [--cache DIR] [--llamacpp-version V] [--json]

Builds llama.cpp's `llama-bench` and `llama-batched-bench` from the `llama-cpp-python` sdist into a
cache folder outside the repository (see scripts/llamacpp_build.py; reused when the sdist version and
flags match), then measures, each llama.cpp figure right beside its infer counterpart:
  batch-1 decode    llama-bench -p 0 -n 128            vs  infer bench -p 0 -n 128
  prefill 512       llama-bench -p 512 -n 0            vs  infer bench -p 512 -n 0
  16-stream decode  llama-batched-bench -npp 32 -ntg 64 -npl 16: generated tokens / whole time
                    (B*TG / T, prefill included; S_TG, decode only, is kept in --json)
                    vs  infer bench --concurrency 16 --concurrency-prompt 32 -n 64 (all tokens / wall)
  peak RSS          infer generate -n 128 --ignore-eos  vs  llama-batched-bench -npp 32 -ntg 128
                    -npl 1, both with a 4096-token context (RSS of the child from wait4)
  warm start-up     wall time of `infer generate -n 1`, second run; llama.cpp: llama-batched-bench
                    -npp 8 -ntg 1 -npl 1, second run (for scale only: the target is absolute)
llama-bench and llama-batched-bench never sample: they feed a fixed or random token back and only run
the model. infer must draw its next token, so its three throughput runs draw the cheapest way, greedily
(`--temp 0`: one argmax per row); `--infer-temp 0.8` runs them with the full default sampler chain
instead (top-k 40, top-p, min-p, a seeded draw: ~0.06 ms a token on the 2-core machine) and prints it.
`--infer-args` are appended to every infer command, so the same script compares kernel modes; the
batch-1 decode target is 1.3x when they mention int8, else 1.0x (`--decode-target` overrides).
The 1-minute load average is recorded at each stage and printed: on a shared machine llama.cpp's
spinning thread pool loses far more than infer when cores are oversubscribed (`--llamacpp-args
"--poll 0"` makes its workers sleep instead).
Exit 2 with one line when cmake is missing, the build fails or a benchmark command fails.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# The sibling module, found through the path above.
from llamacpp_build import (
    Binaries,
    BuildError,
    cpuinfo_flags,
    default_cache_dir,
    ensure_built,
)

DEFAULT_MODEL = Path.home() / ".cache" / "infer" / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"
CTX = 4096
"""Context of the RSS and start-up runs on both sides (infer's default `ctx_size`)."""
RSS_PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


class RunError(RuntimeError):
    """A benchmark command failed; the message is one line."""


# ---------------------------------------------------------------- pure parts (tested)


def parse_llama_bench_json(text: str) -> dict[str, float]:
    """llama-bench `-o json` output -> mean tokens/s per test name (`pp512`, `tg128`, `pp512+tg128`)."""
    rows = json.loads(text)
    out: dict[str, float] = {}
    for row in rows:
        p, n = int(row["n_prompt"]), int(row["n_gen"])
        name = f"pp{p}" if n == 0 else f"tg{n}" if p == 0 else f"pp{p}+tg{n}"
        out[name] = float(row["avg_ts"])
    return out


@dataclass(frozen=True)
class BatchedRow:
    """One row of llama-batched-bench's table."""

    pp: int
    tg: int
    b: int
    n_kv: int
    t_pp: float
    s_pp: float
    t_tg: float
    s_tg: float
    t: float
    s: float

    @property
    def generated_per_s(self) -> float:
        """Generated tokens over the whole time, prefill included: B*TG / T."""
        return self.b * self.tg / self.t if self.t > 0 else 0.0


_ROW_RE = re.compile(r"^\|\s*" + r"\s*\|\s*".join([r"(\d+)"] * 4 + [r"([0-9.]+)"] * 6) + r"\s*\|\s*$")


def parse_batched_bench_table(text: str) -> list[BatchedRow]:
    """Every data row of llama-batched-bench's `| PP | TG | B | N_KV | T_PP s | ...` table."""
    rows = []
    for line in text.splitlines():
        match = _ROW_RE.match(line.strip())
        if match:
            g = match.groups()
            rows.append(BatchedRow(*(int(v) for v in g[:4]), *(float(v) for v in g[4:])))
    return rows


def infer_bench_tps(report: dict[str, Any], n_prompt: int, n_gen: int, concurrency: int = 1) -> float:
    """Mean tokens/s of the `infer bench --json` result with this shape (matched on the record's
    fields, not its name: a concurrency run is named `tg64 c16`). A run with failed requests is an
    error, not a figure."""
    for result in report["results"]:
        shape = (int(result["n_prompt"]), int(result["n_gen"]), int(result.get("concurrency", 1)))
        if shape == (n_prompt, n_gen, concurrency):
            if int(result.get("errors", 0)):
                raise RunError(f"infer bench {result['test']}: {result['errors']} request(s) failed")
            return float(result["tps_mean"])
    raise RunError(f"infer bench --json has no result for p={n_prompt} n={n_gen} c={concurrency}")


@dataclass(frozen=True)
class Figure:
    """One compared figure. `ratio` is infer / llama.cpp. Throughput targets are a minimum ratio
    (`kind="ratio_min"`); RSS and start-up targets are a maximum for infer alone (`kind="abs_max"`)."""

    name: str
    unit: str
    infer: float
    llamacpp: float
    kind: str
    target: float
    infer_source: str
    llamacpp_source: str

    @property
    def ratio(self) -> float:
        """infer / llama.cpp (higher is better for throughput, lower for RSS and time)."""
        return self.infer / self.llamacpp if self.llamacpp > 0 else float("inf")

    @property
    def passed(self) -> bool:
        """Whether the issue's target is met."""
        if self.kind == "ratio_min":
            return self.ratio >= self.target
        if self.kind == "abs_max":
            return self.infer <= self.target
        raise ValueError(f"unknown target kind {self.kind!r}")

    @property
    def target_text(self) -> str:
        """The target as the issue states it."""
        if self.kind == "ratio_min":
            return f">= {self.target:g}x"
        return f"<= {self.target:g} {self.unit}"

    def to_json(self) -> dict[str, Any]:
        """A JSON object with the computed fields added."""
        return {**asdict(self), "ratio": self.ratio, "passed": self.passed, "target_text": self.target_text}


def decode_target(infer_args: list[str], override: float | None) -> tuple[float, str]:
    """The batch-1 decode target and the mode it belongs to: 1.3x for int8 kernels (the default mode,
    unless the infer arguments name exact or blas), else 1.0x."""
    mode = next((m for m in ("exact", "blas", "int8") if any(m in a for a in infer_args)), "int8")
    if override is not None:
        return override, mode
    return (1.3 if mode == "int8" else 1.0), mode


def _fmt(value: float) -> str:
    return f"{value:.3g}" if abs(value) < 10 else f"{value:,.1f}"


def render_table(figures: list[Figure]) -> str:
    """A plain-text table: figure, infer, llama.cpp, ratio, target, pass/fail."""
    header = ("figure", "infer", "llama.cpp", "ratio", "target", "result")
    rows = [header] + [
        (
            f"{f.name} ({f.unit})",
            _fmt(f.infer),
            _fmt(f.llamacpp),
            f"{f.ratio:.2f}x",
            f.target_text,
            "pass" if f.passed else "FAIL",
        )
        for f in figures
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    lines = []
    for index, row in enumerate(rows):
        pairs = enumerate(zip(row, widths, strict=True))
        cells = [c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs]
        lines.append("  ".join(cells))
        if index == 0:
            lines.append("  ".join("-" * w for w in widths))
    return "\n".join(lines)


# ---------------------------------------------------------------- running


@dataclass(frozen=True)
class Finished:
    """A finished child process: its output, wall time and peak RSS."""

    stdout: str
    stderr: str
    wall_s: float
    peak_rss_mb: float


def run(cmd: list[str], what: str) -> Finished:
    """Run `cmd`, measuring its wall time and its own peak RSS (os.wait4's rusage of that child).
    Raises RunError with the last stderr line when it exits non-zero."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        start = time.perf_counter()
        try:
            proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        except OSError as exc:
            raise RunError(f"{what}: cannot start {cmd[0]}: {exc}") from exc
        _, status, usage = os.wait4(proc.pid, 0)
        wall = time.perf_counter() - start
        proc.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    if proc.returncode != 0:
        last = (stderr.strip().splitlines() or stdout.strip().splitlines() or ["no output"])[-1]
        raise RunError(f"{what} failed (exit {proc.returncode}): {last.strip()}")
    return Finished(stdout, stderr, wall, usage.ru_maxrss / 1024)


@dataclass(frozen=True)
class Setup:
    """What every command shares."""

    bins: Binaries
    model: Path
    threads: int
    repetitions: int
    infer_args: list[str]
    llamacpp_args: list[str]
    infer_temp: float = 0.0
    """infer's sampling temperature in its throughput runs (see the module docstring)."""

    def infer(self, *args: str) -> list[str]:
        """An `infer` command line on the model with the thread count and the pass-through args."""
        return ["infer", *args, "-m", str(self.model), "--threads", str(self.threads), *self.infer_args]

    def infer_bench(self, *args: str) -> dict[str, Any]:
        """`infer bench ... --json`, parsed."""
        sampling = ("--temp", str(self.infer_temp))
        command = self.infer("bench", *args, "-r", str(self.repetitions), *sampling, "--json")
        done = run(command, "infer bench")
        return json.loads(done.stdout)

    def llama_bench(self, *args: str) -> dict[str, float]:
        """`llama-bench ... -o json`, parsed."""
        cmd = [str(self.bins.bench), "-m", str(self.model), "-t", str(self.threads)]
        cmd += ["-r", str(self.repetitions), "-o", "json", *args, *self.llamacpp_args]
        done = run(cmd, "llama-bench")
        return parse_llama_bench_json(done.stdout)

    def batched(self, npp: int, ntg: int, npl: int) -> tuple[BatchedRow, Finished]:
        """One llama-batched-bench run and its single table row."""
        cmd = [str(self.bins.batched_bench), "-m", str(self.model), "-t", str(self.threads)]
        cmd += ["-tb", str(self.threads), "-c", str(CTX)]
        cmd += ["-npp", str(npp), "-ntg", str(ntg), "-npl", str(npl), *self.llamacpp_args]
        done = run(cmd, "llama-batched-bench")
        rows = parse_batched_bench_table(done.stdout + "\n" + done.stderr)
        if not rows:
            raise RunError("llama-batched-bench printed no result table")
        return rows[-1], done


def measure(setup: Setup, target: float, mode: str, say: Any) -> tuple[list[Figure], dict[str, Any]]:
    """Every figure, each llama.cpp run right beside its infer run (the shared machine drifts)."""
    loads: list[float] = []

    def stage(name: str) -> None:
        # The 1-minute load average at each stage: other work on the machine slows both engines,
        # llama.cpp's spinning thread pool most of all, so a reader must see it beside the figures.
        loads.append(os.getloadavg()[0])
        say(f"{name} ... (load average {loads[-1]:.2f})")

    extra: dict[str, Any] = {"load_average_1m": loads}
    stage("batch-1 decode")
    ll_tg = setup.llama_bench("-p", "0", "-n", "128")["tg128"]
    in_tg = infer_bench_tps(setup.infer_bench("-p", "0", "-n", "128"), 0, 128)
    stage("prefill 512")
    ll_pp = setup.llama_bench("-p", "512", "-n", "0")["pp512"]
    in_pp = infer_bench_tps(setup.infer_bench("-p", "512", "-n", "0"), 512, 0)
    stage("16-stream decode")
    row16, _ = setup.batched(32, 64, 16)
    extra["llamacpp_16_stream_s_tg"] = row16.s_tg
    extra["llamacpp_16_stream_s_pp"] = row16.s_pp
    conc = setup.infer_bench("--concurrency", "16", "--concurrency-prompt", "32", "-n", "64")
    in_16 = infer_bench_tps(conc, 32, 64, concurrency=16)
    stage("peak RSS")
    ll_rss = setup.batched(32, 128, 1)[1].peak_rss_mb
    gen = ["generate", "-n", "128", "--ignore-eos", "--temp", "0", "-c", str(CTX), RSS_PROMPT]
    in_rss = run(setup.infer(*gen), "infer generate").peak_rss_mb
    stage("warm start-up")
    startup = ["generate", "-n", "1", "--temp", "0", "Hello"]
    run(setup.infer(*startup), "infer generate")
    in_start = run(setup.infer(*startup), "infer generate").wall_s
    setup.batched(8, 1, 1)
    ll_start = setup.batched(8, 1, 1)[1].wall_s
    loads.append(os.getloadavg()[0])
    figures = [
        Figure(
            f"batch-1 decode, {mode}", "tok/s", in_tg, ll_tg, "ratio_min", target,
            "infer bench -p 0 -n 128", "llama-bench -p 0 -n 128",
        ),
        Figure(
            "prefill 512", "tok/s", in_pp, ll_pp, "ratio_min", 1.5,
            "infer bench -p 512 -n 0", "llama-bench -p 512 -n 0",
        ),
        Figure(
            "16-stream decode", "tok/s", in_16, row16.generated_per_s, "ratio_min", 1.5,
            "infer bench --concurrency 16 --concurrency-prompt 32 -n 64: all tokens / wall",
            "llama-batched-bench -npp 32 -ntg 64 -npl 16: B*TG / T (prefill included)",
        ),
        Figure(
            "peak RSS, generate -n 128", "MB", in_rss, ll_rss, "abs_max", 400,
            f"infer generate -n 128 --ignore-eos -c {CTX}",
            f"llama-batched-bench -npp 32 -ntg 128 -npl 1 -c {CTX}",
        ),
        Figure(
            "warm start-up, -n 1", "s", in_start, ll_start, "abs_max", 1.5,
            "infer generate -n 1 (whole command, second run)",
            "llama-batched-bench -npp 8 -ntg 1 -npl 1 (whole command, second run)",
        ),
    ]  # fmt: skip
    return figures, extra


def default_model() -> Path:
    """The default GGUF: in the cache, else whatever `infer models pull` prints."""
    if DEFAULT_MODEL.is_file():
        return DEFAULT_MODEL
    done = run(["infer", "models", "pull"], "infer models pull")
    return Path(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    """Build (once), measure, print the table (or JSON)."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)), help="both engines")
    ap.add_argument("--model", type=Path, default=None, help="GGUF (default: the default model)")
    ap.add_argument("--repetitions", "-r", type=int, default=3, help="llama-bench / infer bench -r")
    ap.add_argument("--infer-args", default="", help='extra infer arguments, e.g. "--profile X"')
    ap.add_argument("--llamacpp-args", default="", help='extra llama.cpp arguments, e.g. "--poll 0"')
    ap.add_argument("--decode-target", type=float, default=None, help="batch-1 decode target ratio")
    ap.add_argument("--cache", type=Path, default=None, help="llama.cpp build cache folder")
    ap.add_argument("--llamacpp-version", default=None, help="llama-cpp-python sdist version")
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism")
    ap.add_argument("--json", action="store_true", help="JSON on stdout instead of the table")
    ap.add_argument(
        "--infer-temp", type=float, default=0.0, help="infer's temperature in the throughput runs (0: argmax)"
    )
    args = ap.parse_args(argv)

    def say(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    infer_args = shlex.split(args.infer_args)
    target, mode = decode_target(infer_args, args.decode_target)
    try:
        flags = cpuinfo_flags(Path("/proc/cpuinfo").read_text())
        bins = ensure_built(args.cache or default_cache_dir(), flags, args.llamacpp_version, args.jobs, say)
        if bins.build_seconds:
            say(f"built llama.cpp {bins.version} in {bins.build_seconds:.0f} s")
        model = args.model or default_model()
        llamacpp_args = shlex.split(args.llamacpp_args)
        setup = Setup(bins, model, args.threads, args.repetitions, infer_args, llamacpp_args, args.infer_temp)
        figures, extra = measure(setup, target, mode, say)
    except (BuildError, RunError) as exc:
        print(f"bench_vs_llamacpp: {exc}", file=sys.stderr)
        return 2
    if args.json:
        report = {
            "model": str(model),
            "threads": args.threads,
            "infer_args": infer_args,
            "infer_temp": args.infer_temp,
            "llamacpp_args": llamacpp_args,
            "llamacpp": {
                "version": bins.version,
                "options": bins.options,
                "build_seconds": bins.build_seconds,
                "binaries": [str(bins.bench), str(bins.batched_bench)],
            },
            "figures": [f.to_json() for f in figures],
            **extra,
        }
        print(json.dumps(report, indent=2))
    else:
        source = f"llama.cpp {bins.version} (llama-cpp-python sdist)"
        print(f"model {model.name}, {args.threads} threads, {source}")
        if infer_args:
            print(f"infer args: {shlex.join(infer_args)}")
        chain = f"temperature {args.infer_temp:g}, the default chain"
        sampling = "greedy (argmax)" if args.infer_temp == 0 else chain
        print(f"infer samples {sampling}; llama-bench and llama-batched-bench do not sample")
        if llamacpp_args:
            print(f"llama.cpp args: {shlex.join(llamacpp_args)}")
        print(render_table(figures))
        loads = extra["load_average_1m"]
        busy = max(loads) > args.threads + 0.5
        verdict = "other work shared the cores, figures are contended" if busy else "a quiet machine"
        print(
            "16-stream: both sides count generated tokens over the whole run, prefill included; "
            f"llama.cpp's decode-only S_TG was {extra['llamacpp_16_stream_s_tg']:.1f} tok/s.\n"
            "RSS: llama.cpp measured on llama-batched-bench -npl 1 (no llama-cli built). "
            "Ratios are infer / llama.cpp.\n"
            f"Load average (1 min) over the run: {min(loads):.2f}-{max(loads):.2f} on "
            f"{os.cpu_count()} cores: {verdict}."
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
