"""`infer bench compare A.json B.json [C.json ...]`: every figure the runs have in common, side by side
with its ratio to the first run, what differs between the runs' fingerprints, and `--fail-below` for CI.

A ratio is a speed ratio, so it reads the same way for every figure: above 1 the later run is better,
below 1 worse. For throughput (t/s, req/s) it is later / first; for a latency (TTFT, ITL, e2e, TPOT in
ms) first / later. `--fail-below 0.95` exits 1 when any ratio is below 0.95, naming the figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from infer.cli.bench.stats import load_baseline, result_key
from infer.cli.fingerprint import fingerprint_diff, fingerprint_leaves
from infer.cli.options import fail

LATENCY_FIGURES = ("ttft_ms", "itl_ms", "e2e_ms", "tpot_ms")
STATS = ("mean", "p50", "p90", "p99")
THROUGHPUT_FIGURES = ("request_throughput", "output_throughput")
HEADER_KEYS = (
    "model",
    "backend",
    "threads",
    "cpu_kernels",
    "mmap",
    "kv_cache_dtype",
    "profile",
    "server",
    "api",
)
"""Run settings outside the fingerprint that change the figures (the fingerprint has no thread count)."""


@dataclass(frozen=True)
class Run:
    """One `infer bench --json` output and the name it is shown under (its file name)."""

    label: str
    data: Mapping[str, Any]

    @property
    def records(self) -> dict[str, Mapping[str, Any]]:
        """The run's results by test identity (test name, depth, concurrency)."""
        return {result_key(r): r for r in self.data.get("results", [])}


@dataclass(frozen=True)
class FigureRow:
    """One figure of one test in every run."""

    test: str
    figure: str
    values: tuple[float, ...]
    higher_is_better: bool

    @property
    def ratios(self) -> tuple[float | None, ...]:
        """Each later run's speed ratio to the first (None where a value is 0)."""
        base = self.values[0]
        out: list[float | None] = []
        for value in self.values[1:]:
            top, bottom = (value, base) if self.higher_is_better else (base, value)
            out.append(top / bottom if bottom else None)
        return tuple(out)


def record_figures(record: Mapping[str, Any]) -> dict[str, tuple[float, bool]]:
    """figure name -> (value, higher is better) for one JSON result record."""
    figures: dict[str, tuple[float, bool]] = {}
    if record.get("tps_mean"):
        figures["t/s"] = (float(record["tps_mean"]), True)
    for key in THROUGHPUT_FIGURES:
        if isinstance(record.get(key), (int, float)) and record[key]:
            figures[key] = (float(record[key]), True)
    goodput = record.get("goodput")
    if isinstance(goodput, Mapping) and goodput.get("requests_per_s"):
        figures["goodput req/s"] = (float(goodput["requests_per_s"]), True)
    for key in LATENCY_FIGURES:
        summary = record.get(key)
        if not isinstance(summary, Mapping):
            continue
        for stat in STATS:
            if isinstance(summary.get(stat), (int, float)):
                figures[f"{key.removesuffix('_ms')} {stat}"] = (float(summary[stat]), False)
    return figures


def compare_runs(runs: Sequence[Run]) -> tuple[list[FigureRow], list[str]]:
    """Every figure of every test that all runs have, in the first run's order; and the tests that
    some run lacks (not compared)."""
    by_run = [run.records for run in runs]
    rows: list[FigureRow] = []
    missing: list[str] = []
    for key, first in by_run[0].items():
        records = [records.get(key) for records in by_run]
        if any(r is None for r in records):
            missing.append(str(first["test"]))
            continue
        figures = [record_figures(r) for r in records if r is not None]
        for name, (value, higher) in figures[0].items():
            if all(name in f for f in figures[1:]):
                values = (value, *(f[name][0] for f in figures[1:]))
                rows.append(FigureRow(str(first["test"]), name, values, higher))
    for records in by_run[1:]:
        missing += [str(r["test"]) for key, r in records.items() if key not in by_run[0]]
    return rows, missing


def run_differences(runs: Sequence[Run]) -> list[tuple[str, tuple[Any, ...]]]:
    """(key, value in each run) for every run setting and fingerprint leaf that is not the same in all
    runs: commit, CPU, kernels, profile, BLAS, versions."""
    keys: list[str] = []
    values: dict[str, list[Any]] = {}
    for key in HEADER_KEYS:
        seen = [run.data.get(key) for run in runs]
        if any(v != seen[0] for v in seen):
            keys.append(key)
            values[key] = seen
    first = runs[0].data.get("fingerprint") or {}
    for run in runs[1:]:
        for key, _, _ in fingerprint_diff(first, run.data.get("fingerprint") or {}):
            name = f"fingerprint.{key}"
            if name not in values:
                keys.append(name)
                values[name] = [_leaf(r.data.get("fingerprint") or {}, key) for r in runs]
    return [(key, tuple(values[key])) for key in keys]


def _leaf(fingerprint: Mapping[str, Any], dotted: str) -> Any:
    """The value at a `fingerprint_diff` key (`cpu.model`, `blas[0].threads`) or None."""
    return fingerprint_leaves(fingerprint).get(dotted)


def regressions(rows: Sequence[FigureRow], runs: Sequence[Run], fail_below: float) -> list[str]:
    """One line per figure whose ratio in some later run is below `fail_below`."""
    lines = []
    for row in rows:
        for run, ratio in zip(runs[1:], row.ratios, strict=True):
            if ratio is not None and ratio < fail_below:
                lines.append(
                    f"{row.test} {row.figure}: {ratio:.3f}x of the first run in {run.label} "
                    f"(below {fail_below})"
                )
    return lines


def _show(value: Any) -> str:
    if isinstance(value, list):
        return ",".join(map(str, value)) if len(value) <= 6 else f"[{len(value)} items]"
    return "-" if value is None else str(value)


def figures_table(rows: Sequence[FigureRow], runs: Sequence[Run], fail_below: float | None) -> Table:
    """test | figure | value in each run | ratio of each later run to the first."""
    table = Table(
        title="figures (latencies in ms; ratio > 1: better than the first run)", title_justify="left"
    )
    table.add_column("test", no_wrap=True)
    table.add_column("figure", no_wrap=True)
    for run in runs:
        table.add_column(escape(run.label), justify="right", overflow="fold")
    for run in runs[1:]:
        table.add_column(f"ratio {escape(run.label)}", justify="right", overflow="fold")
    for row in rows:
        ratios = []
        for ratio in row.ratios:
            text = "-" if ratio is None else f"{ratio:.3f}x"
            if ratio is not None and fail_below is not None and ratio < fail_below:
                text = f"[red]{text}[/]"
            ratios.append(text)
        table.add_row(escape(row.test), row.figure, *(f"{v:.2f}" for v in row.values), *ratios)
    return table


def differences_table(differences: Sequence[tuple[str, tuple[Any, ...]]], runs: Sequence[Run]) -> Table:
    """What differs between the runs: settings and fingerprint leaves."""
    table = Table(title="what differs between the runs", title_justify="left")
    table.add_column("key", overflow="fold")
    for run in runs:
        table.add_column(escape(run.label), overflow="fold")
    for key, values in differences:
        table.add_row(escape(key), *(escape(_show(v)) for v in values))
    return table


def _labels(paths: Sequence[Path]) -> list[str]:
    """File names, or whole paths where two runs share a name."""
    names = [p.name for p in paths]
    return names if len(set(names)) == len(names) else [str(p) for p in paths]


def load_runs(paths: Sequence[Path]) -> list[Run]:
    """The runs in `paths` (exit 2 with a one-line reason on an unreadable or foreign file)."""
    runs = []
    for path, label in zip(paths, _labels(paths), strict=True):
        try:
            runs.append(Run(label, load_baseline(path, what="")))
        except ValueError as exc:
            fail(str(exc))
    return runs


def compare(
    runs: Annotated[
        list[Path],
        typer.Argument(metavar="RUN.json", help="`infer bench --json` outputs (the first is the reference)."),
    ],
    fail_below: Annotated[
        Optional[float],
        typer.Option(
            "--fail-below",
            help="Exit 1 when a figure's ratio to the first run is below this (0.95 = 5% worse).",
        ),
    ] = None,
    plot: Annotated[
        Optional[Path],
        typer.Option("--plot", metavar="FILE.png|svg", help="Also draw the runs overlaid in one picture."),
    ] = None,
) -> None:
    """Compare bench runs: every common figure with ratios, and what differs in their fingerprints."""
    if fail_below is not None and not fail_below > 0:
        fail(f"--fail-below must be > 0, got {fail_below}")
    if plot is not None:
        from infer.cli.bench.plot import PlotError, check_plot_target

        try:
            check_plot_target(plot)
        except PlotError as exc:
            fail(str(exc))
    if len(runs) < 2 and plot is None:
        fail("bench compare needs two or more JSON files (one is enough with --plot)")
    loaded = load_runs(runs)
    console = Console()
    if len(loaded) >= 2:
        rows, missing = compare_runs(loaded)
        if not rows:
            fail("the runs have no test in common (compare runs of the same tests)")
        console.print(figures_table(rows, loaded, fail_below))
        if missing:
            console.print(f"not in every run (not compared): {escape(', '.join(sorted(set(missing))))}")
        differences = run_differences(loaded)
        if differences:
            console.print(differences_table(differences, loaded))
        else:
            console.print("the runs' fingerprints and settings are the same")
    if plot is not None:
        from infer.cli.bench.plot import PlotError, plot_runs

        try:
            plot_runs([(run.label, run.data) for run in loaded], plot)
        except PlotError as exc:
            fail(str(exc))
        console.print(f"plot written to {escape(str(plot))}")
    if len(loaded) >= 2 and fail_below is not None:
        failed = regressions(rows, loaded, fail_below)
        if failed:
            for line in failed:
                typer.echo(f"infer: regression: {line}", err=True)
            raise SystemExit(1)


__all__ = ["FigureRow", "Run", "compare", "compare_runs", "record_figures", "regressions", "run_differences"]
