"""Bench figures shared by the engine and `--server` runs: request traces, latency summaries, results,
baseline comparison and the table/CSV/JSON writers. Nothing here talks to an engine or a server."""

from __future__ import annotations

import csv
import io
import itertools
import json
import math
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape
from rich.table import Table

from infer.engine import merge_spec_counters, spec_summary


@dataclass
class Trace:
    """Timestamps (perf_counter seconds) of one request: submitted, each token, done."""

    submitted: float
    token_times: list[float] = field(default_factory=list)
    done: float = 0.0
    prompt_tokens: int = 0
    error: str | None = None
    reported_tokens: int | None = None
    """Completion tokens the server reported in `usage` (a chunk may carry several tokens)."""
    counters: dict[str, int] = field(default_factory=dict)
    """The request's speculation counters (empty without speculation)."""
    sampled_on_device: int = 0
    """Tokens of the request drawn on the device (a GPU backend, inside the sampling envelope)."""
    cached_prompt_tokens: int = 0
    """Prompt tokens the prefix cache supplied."""

    @property
    def tokens(self) -> int:
        """Tokens received."""
        return len(self.token_times)

    @property
    def output_tokens(self) -> int:
        """Tokens generated: the server's count when it gave one, else the tokens received."""
        return self.reported_tokens if self.reported_tokens is not None else self.tokens

    @property
    def tpot(self) -> float | None:
        """Time per output token after the first: (e2e - TTFT) / (tokens - 1)."""
        ttft = self.ttft
        if ttft is None or self.output_tokens < 2:
            return None
        return (self.e2e - ttft) / (self.output_tokens - 1)

    @property
    def ttft(self) -> float | None:
        """Time to first token."""
        return self.token_times[0] - self.submitted if self.token_times else None

    @property
    def itls(self) -> list[float]:
        """Inter-token latencies (gaps between consecutive tokens)."""
        times = self.token_times
        return [b - a for a, b in itertools.pairwise(times)]

    @property
    def e2e(self) -> float:
        """Submit to done."""
        return self.done - self.submitted


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default method)."""
    ordered = sorted(values)
    if not ordered:
        return math.nan
    rank = (len(ordered) - 1) * q / 100.0
    lo = math.floor(rank)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)


def summarize_ms(values: Iterable[float]) -> dict[str, float] | None:
    """mean, p50, p90, p99 in milliseconds (None when there are no values)."""
    seconds = list(values)
    if not seconds:
        return None
    ms = [v * 1000.0 for v in seconds]
    return {
        "mean": round(statistics.fmean(ms), 3),
        "p50": round(percentile(ms, 50), 3),
        "p90": round(percentile(ms, 90), 3),
        "p99": round(percentile(ms, 99), 3),
    }


@dataclass
class BenchResult:
    """One test's figures over its repetitions (warm-up runs excluded)."""

    test: str
    kind: str
    """pp (prefill), tg (decode), pg (prefill + decode), or cN (concurrent decode)."""
    n_prompt: int
    n_gen: int
    depth: int
    concurrency: int
    samples: list[float]
    """tokens/s of each repetition (aggregate over all requests for concurrency runs)."""
    traces: list[Trace] = field(default_factory=list, repr=False)
    extra: dict[str, Any] = field(default_factory=dict)
    """Figures only some tests have (a serving run's rate, goodput ...), added to the JSON record."""

    @property
    def tps_mean(self) -> float:
        """Mean tokens/s."""
        return statistics.fmean(self.samples) if self.samples else 0.0

    @property
    def tps_stddev(self) -> float:
        """Sample standard deviation of tokens/s (0 for one repetition)."""
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def latency(self) -> dict[str, dict[str, float] | None]:
        """TTFT, inter-token and end-to-end latency summaries over every request of every repetition."""
        good = [t for t in self.traces if t.error is None]
        return {
            "ttft_ms": summarize_ms(t.ttft for t in good if t.ttft is not None),
            "itl_ms": summarize_ms(v for t in good for v in t.itls),
            "e2e_ms": summarize_ms(t.e2e for t in good),
        }

    def key(self) -> str:
        """Identity for baseline comparison."""
        return f"{self.test}|d{self.depth}|c{self.concurrency}"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready figures."""
        return {
            "test": self.test,
            "kind": self.kind,
            "n_prompt": self.n_prompt,
            "n_gen": self.n_gen,
            "depth": self.depth,
            "concurrency": self.concurrency,
            "repetitions": len(self.samples),
            "tps_mean": round(self.tps_mean, 3),
            "tps_stddev": round(self.tps_stddev, 3),
            "samples_tps": [round(s, 3) for s in self.samples],
            "requests": len(self.traces),
            "tokens": sum(t.output_tokens for t in self.traces),
            "errors": sum(1 for t in self.traces if t.error is not None),
            **self.latency(),
            **self.extra,
            "speculative": self.speculation(),
            "sampled_where": self.sampled_where(),
            "cached_prompt_tokens": sum(t.cached_prompt_tokens for t in self.traces),
        }

    def sampled_where(self) -> dict[str, int]:
        """Requests and tokens sampled on the device (inside a GPU backend's envelope) and on the
        host (the cpu backend, greedy, constrained or outside the envelope; a remote server's)."""
        on_device = sum(t.sampled_on_device for t in self.traces)
        return {
            "device_tokens": on_device,
            "host_tokens": sum(t.output_tokens for t in self.traces) - on_device,
            "device_requests": sum(1 for t in self.traces if t.sampled_on_device),
            "host_requests": sum(1 for t in self.traces if not t.sampled_on_device),
        }

    def speculation(self) -> dict[str, Any] | None:
        """Every request's speculation counters summed, as `summary` shows them (None without)."""
        totals: dict[str, int] = {}
        for trace in self.traces:
            totals = merge_spec_counters(totals, trace.counters)
        return spec_summary(totals)


def serving_figures(traces: Sequence[Trace], duration: float, slo: Mapping[str, float]) -> dict[str, Any]:
    """`vllm bench serve`'s figures for one serving run: request and output throughput, TPOT, and
    goodput (requests/s that met every `slo` bound, in ms: ttft, tpot, e2e; failed requests never do)."""
    good = [t for t in traces if t.error is None]
    out_tokens = sum(t.output_tokens for t in good)

    def meets(trace: Trace) -> bool:
        figures = {"ttft": trace.ttft, "tpot": trace.tpot, "e2e": trace.e2e}
        return all(
            figures[key] is not None and figures[key] * 1000.0 <= bound  # type: ignore[operator]
            for key, bound in slo.items()
        )

    within = [t for t in good if meets(t)] if slo else []
    figures: dict[str, Any] = {
        "duration_s": round(duration, 3),
        "completed": len(good),
        "request_throughput": round(len(good) / duration, 4) if duration > 0 else 0.0,
        "output_throughput": round(out_tokens / duration, 3) if duration > 0 else 0.0,
        "tpot_ms": summarize_ms(v for t in good if (v := t.tpot) is not None),
    }
    if slo:
        figures["goodput"] = {
            "slo_ms": dict(slo),
            "good_requests": len(within),
            "fraction": round(len(within) / len(traces), 4) if traces else 0.0,
            "requests_per_s": round(len(within) / duration, 4) if duration > 0 else 0.0,
        }
    return figures


def result_key(record: Mapping[str, Any]) -> str:
    """`BenchResult.key()` for a JSON record."""
    return f"{record['test']}|d{record.get('depth', 0)}|c{record.get('concurrency', 1)}"


LATENCY_KEYS = ("ttft_ms", "itl_ms", "e2e_ms")


@dataclass(frozen=True)
class Comparison:
    """One figure against its baseline."""

    test: str
    figure: str
    baseline: float
    current: float
    higher_is_better: bool
    regressed: bool

    @property
    def change(self) -> float:
        """Relative change, current vs baseline (+0.05 = 5 % higher)."""
        return (self.current - self.baseline) / self.baseline if self.baseline else 0.0


def compare_to_baseline(
    results: Sequence[Mapping[str, Any]], baseline: Mapping[str, Any], tolerance: float
) -> tuple[list[Comparison], list[str]]:
    """Compare test by test: throughput must not drop, and mean latencies must not rise, by more than
    `tolerance` (0.1 = 10 %). Returns the comparisons and the tests missing from the baseline."""
    old = {result_key(r): r for r in baseline.get("results", [])}
    out: list[Comparison] = []
    missing: list[str] = []
    for record in results:
        before = old.get(result_key(record))
        if before is None:
            missing.append(record["test"])
            continue
        if before.get("tps_mean"):
            cur, base = float(record["tps_mean"]), float(before["tps_mean"])
            out.append(Comparison(record["test"], "t/s", base, cur, True, cur < base * (1 - tolerance)))
        for key in LATENCY_KEYS:
            a, b = (before.get(key) or {}).get("mean"), (record.get(key) or {}).get("mean")
            if a and b is not None:
                out.append(Comparison(record["test"], f"{key} mean", a, b, False, b > a * (1 + tolerance)))
    return out, missing


def load_baseline(path: Path, what: str = "--baseline") -> dict[str, Any]:
    """A previous `infer bench --json` output (raises ValueError with a one-line reason that names it
    as `what PATH`)."""
    name = f"{what} {path}" if what else str(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ValueError(f"{name}: cannot read it ({exc.strerror or exc})") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{name}: not JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(data, dict) or not isinstance(data.get("results"), list):
        raise ValueError(f"{name}: not an `infer bench --json` output (no `results` list)")
    return data


def results_table(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any]) -> Table:
    """llama-bench's table: model | backend | threads | test | t/s (mean ± stddev)."""
    table = Table(title=None, show_edge=True)
    speculated = any(record.get("speculative") for record in records)
    columns = ("model", "backend", "threads", "test", "t/s", *(("accept", "mean len") if speculated else ()))
    for column in columns:
        table.add_column(column, justify="left" if column in ("model", "backend", "test") else "right")
    for record in records:
        spec = record.get("speculative")
        extra = (
            (f"{spec['acceptance_rate']:.0%}", f"{spec['mean_accepted_length']:.2f}") if spec else ("-", "-")
        )
        table.add_row(
            escape(str(header["model"])),
            escape(str(header["backend"])),
            str(header["threads"]),
            escape(record["test"]),
            f"{record['tps_mean']:.2f} ± {record['tps_stddev']:.2f}",
            *(extra if speculated else ()),
        )
    return table


def latency_table(records: Sequence[Mapping[str, Any]]) -> Table | None:
    """TTFT / ITL / e2e (mean, p50, p90, p99 in ms) for the concurrency runs, one row per metric; None
    when there are no concurrency runs."""
    rows = [r for r in records if r["kind"] in ("conc", "serve")]
    if not rows:
        return None
    table = Table(title="concurrency: latency in ms", title_justify="left")
    for column in ("test", "conc", "agg t/s", "metric", "mean", "p50", "p90", "p99"):
        table.add_column(column, justify="left" if column in ("test", "metric") else "right")
    for r in rows:
        for index, (key, label) in enumerate((("ttft_ms", "TTFT"), ("itl_ms", "ITL"), ("e2e_ms", "e2e"))):
            summary = r.get(key) or {}
            first = index == 0
            table.add_row(
                escape(r["test"]) if first else "",
                str(r["concurrency"]) if first else "",
                f"{r['tps_mean']:.2f}" if first else "",
                label,
                *(f"{summary[k]:.1f}" if k in summary else "-" for k in ("mean", "p50", "p90", "p99")),
                end_section=index == 2,
            )
    return table


def serving_table(records: Sequence[Mapping[str, Any]]) -> Table | None:
    """The serving runs' request rate, throughput, TPOT and goodput; None when there are none."""
    rows = [r for r in records if r["kind"] == "serve"]
    if not rows:
        return None
    table = Table(title="serving runs", title_justify="left")
    columns = ("test", "rate", "max conc", "done", "errors", "req/s", "out t/s", "TPOT p50", "goodput")
    for column in columns:
        table.add_column(column, justify="left" if column == "test" else "right")
    for r in rows:
        goodput = r.get("goodput")
        tpot = (r.get("tpot_ms") or {}).get("p50")
        table.add_row(
            escape(r["test"]),
            str(r.get("request_rate")),
            str(r.get("max_concurrency") or "-"),
            str(r.get("completed")),
            str(r["errors"]),
            f"{r.get('request_throughput', 0):.3f}",
            f"{r.get('output_throughput', 0):.2f}",
            f"{tpot:.1f}" if tpot is not None else "-",
            f"{goodput['requests_per_s']:.3f} req/s ({goodput['fraction']:.0%})" if goodput else "-",
        )
    return table


def comparison_table(comparisons: Sequence[Comparison], tolerance: float) -> Table:
    """Baseline vs current, figure by figure, regressions in red."""
    table = Table(title=f"against the baseline (tolerance {tolerance:.0%})", title_justify="left")
    for column in ("test", "figure", "baseline", "now", "change", ""):
        table.add_column(column, justify="left" if column in ("test", "figure", "") else "right")
    for c in comparisons:
        verdict = "[red]REGRESSION[/]" if c.regressed else "[green]ok[/]"
        table.add_row(
            escape(c.test), c.figure, f"{c.baseline:.2f}", f"{c.current:.2f}", f"{c.change:+.1%}", verdict
        )
    return table


CSV_COLUMNS = (
    "model",
    "backend",
    "threads",
    "test",
    "kind",
    "n_prompt",
    "n_gen",
    "depth",
    "concurrency",
    "repetitions",
    "tps_mean",
    "tps_stddev",
    "ttft_ms_mean",
    "ttft_ms_p50",
    "ttft_ms_p90",
    "ttft_ms_p99",
    "itl_ms_mean",
    "itl_ms_p50",
    "itl_ms_p90",
    "itl_ms_p99",
    "e2e_ms_mean",
    "e2e_ms_p50",
    "e2e_ms_p90",
    "e2e_ms_p99",
    "cpu",
    "blas",
)


def to_csv(records: Sequence[Mapping[str, Any]], header: Mapping[str, Any]) -> str:
    """One CSV row per test, with the machine columns repeated (each row stands alone)."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=CSV_COLUMNS, extrasaction="ignore", lineterminator="\n")
    writer.writeheader()
    fingerprint = header.get("fingerprint") or {}
    blas = fingerprint.get("blas") or [{}]
    for record in records:
        row: dict[str, Any] = {
            "model": header["model"],
            "backend": header["backend"],
            "threads": header["threads"],
            "cpu": (fingerprint.get("cpu") or {}).get("model"),
            "blas": f"{blas[0].get('vendor')} {blas[0].get('version')}" if blas else None,
            **{k: record.get(k) for k in CSV_COLUMNS if k in record},
        }
        for key in LATENCY_KEYS:
            for stat in ("mean", "p50", "p90", "p99"):
                row[f"{key}_{stat}"] = (record.get(key) or {}).get(stat)
        writer.writerow(row)
    return buffer.getvalue()


__all__ = [
    "BenchResult",
    "Comparison",
    "Trace",
    "compare_to_baseline",
    "comparison_table",
    "latency_table",
    "load_baseline",
    "percentile",
    "results_table",
    "serving_figures",
    "serving_table",
    "summarize_ms",
    "to_csv",
]


ServingRun = Callable[[int | None, bool, str], tuple[float, list[Trace]]]
"""One serving run at a concurrency limit (None: unlimited): (limit, warm_up, tag) -> (seconds, traces);
a warm-up run sends a few short requests, tag names the run (its requests' ids)."""


def serving_sweep(
    run: ServingRun,
    *,
    levels: Sequence[int | None],
    num_prompts: int,
    max_tokens: int,
    rate: float,
    burstiness: float,
    slo: Mapping[str, float],
    repetitions: int,
    warmup: bool,
    advance: Callable[[str], None],
) -> list[BenchResult]:
    """Serving runs, `repetitions` per concurrency limit in `levels`, against a server or the local
    engine alike (`run` sends them); the figures pool every repetition's requests over their summed
    durations."""
    results: list[BenchResult] = []
    rate_name = "inf" if rate == float("inf") else f"{rate:g}"
    for level in levels:
        name = f"serve r{rate_name}" + (f" c{level}" if level else "")
        if warmup:
            advance(f"{name} (warm-up)")
            run(level, True, "warm-up")
        samples: list[float] = []
        traces: list[Trace] = []
        duration = 0.0
        for rep in range(repetitions):
            advance(f"{name} ({rep + 1}/{repetitions})")
            seconds, got = run(level, False, f"{name}-{rep}")
            samples.append(serving_figures(got, seconds, {})["output_throughput"])
            traces += got
            duration += seconds
        figures = serving_figures(traces, duration, slo)
        results.append(
            BenchResult(
                name,
                "serve",
                n_prompt=0,
                n_gen=max_tokens,
                depth=0,
                concurrency=level or num_prompts,
                samples=samples,
                traces=traces,
                extra={
                    "request_rate": rate_name,
                    "burstiness": burstiness,
                    "max_concurrency": level,
                    "num_prompts": num_prompts,
                    **figures,
                },
            )
        )
    return results
