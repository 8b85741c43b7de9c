"""The speculation counters reach every surface: `generate --json`, the stats line of generate and
stream, bench JSON and table, the server's usage and llama-server timings. Pure functions on a made-up
DoneEvent; the engine side is in tests/test_speculative.py."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from infer.cli.bench.stats import BenchResult, Trace, results_table
from infer.cli.generation import result_json, stats_line
from infer.cli.serve.completions import speculation_of, timings_of, usage_of
from infer.engine.runtime.events import DoneEvent, Timings, Usage
from infer.engine.runtime.request import Request

COUNTERS = {"drafts": 4, "draft_tokens": 10, "accepted_tokens": 6, "accepted_at_1": 3, "accepted_at_2": 3}


def done(counters: dict[str, int]) -> DoneEvent:
    return DoneEvent(
        "r", "length", None, Usage(5, 11), Timings(0.0, 0.1, 1.0, 0.1), 7, tuple(range(11)), "x", counters
    )


def test_stats_line_and_json_show_the_counters_only_when_speculating() -> None:
    line = stats_line(done(COUNTERS))
    assert "drafts 4, accepted 6/10 (60%), mean accepted length 2.50" in line
    assert "drafts" not in stats_line(done({}))
    engine: Any = SimpleNamespace(load_seconds=0.0)
    payload = json.loads(result_json(engine, Request((1, 2)), done(COUNTERS)))
    assert payload["speculative"] == {
        "drafts": 4,
        "draft_tokens": 10,
        "accepted_tokens": 6,
        "acceptance_rate": 0.6,
        "mean_accepted_length": 2.5,
        "accepted_per_position": [3, 3],
    }
    assert json.loads(result_json(engine, Request((1, 2)), done({})))["speculative"] is None


def test_server_usage_sums_the_choices_and_names_them_as_llama_server() -> None:
    dones = [done(COUNTERS), done(COUNTERS)]
    usage = usage_of(dones, [5])
    assert usage["completion_tokens"] == 22
    spec = usage["speculative"]
    assert spec["draft_tokens"] == 20 and spec["accepted_per_position"] == [6, 6]
    assert timings_of(dones) == {"timings": {"draft_n": 20, "draft_n_accepted": 12}}
    assert "speculative" not in usage_of([done({})], [5]) and timings_of([done({})]) == {}
    assert speculation_of([done({})]) is None


def test_bench_json_and_table_carry_acceptance() -> None:
    traces = [Trace(0.0, counters=dict(COUNTERS)), Trace(0.0, counters=dict(COUNTERS))]
    result = BenchResult("tg16", "tg", 0, 16, 0, 1, [10.0], traces)
    record = result.to_json()
    assert record["speculative"]["accepted_tokens"] == 12 and record["speculative"]["acceptance_rate"] == 0.6
    plain = BenchResult("tg16", "tg", 0, 16, 0, 1, [10.0], [Trace(0.0)]).to_json()
    assert plain["speculative"] is None
    header = {"model": "m", "backend": "cpu", "threads": 2}
    console = Console(width=200, record=True)
    console.print(results_table([record], header))
    text = console.export_text()
    assert "accept" in text and "60%" in text and "2.50" in text
    console = Console(width=200, record=True)
    console.print(results_table([plain], header))
    assert "accept" not in console.export_text()
