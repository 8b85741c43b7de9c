"""`infer bench --server --dataset`: the dataset file, arrival times, SLO goodput, and runs against a
fake OpenAI server (a clean run, a stream cut half-way, a 500: per-request errors, exit 2)."""

from __future__ import annotations

import itertools
import json
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fake_openai import FakeServer, fake_openai_server
from typer.testing import CliRunner

from infer.cli.bench.dataset import DatasetError, arrival_offsets, load_dataset, parse_slo
from infer.cli.bench.stats import Trace, serving_figures
from infer.cli.main import app

SHIPPED = Path(__file__).resolve().parents[1] / "scripts" / "bench_prompts.jsonl"


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with fake_openai_server() as server:
        yield server


def _bench(*args: str) -> Any:
    return CliRunner().invoke(app, ["bench", *args], env={"COLUMNS": "200"})


def test_shipped_dataset_loads_and_chat_lines_need_the_chat_api(tmp_path: Path) -> None:
    items = load_dataset(SHIPPED, api="chat")
    assert len(items) >= 16 and any(i.messages for i in items) and any(i.prompt for i in items)
    with pytest.raises(DatasetError, match="needs --api chat"):
        load_dataset(SHIPPED, api="completions")
    bad = tmp_path / "bad.jsonl"
    for text, message in (
        ('{"prompt": "a"}\n{"prompt": 3}\n', ':2: "prompt" must be text'),
        ('{"prompt": "a", "messages": []}\n', "exactly one of"),
        ("not json\n", ":1: not JSON"),
        ('{"prompt": "a", "max_tokens": 0}\n', "max_tokens"),
        ("\n", "no requests"),
    ):
        bad.write_text(text)
        with pytest.raises(DatasetError, match=message):
            load_dataset(bad, api="chat")


def test_arrivals_poisson_mean_and_burstiness() -> None:
    assert arrival_offsets(5, float("inf"), 1.0) == [0.0] * 5
    offsets = arrival_offsets(4000, 10.0, 1.0)
    gaps = [b - a for a, b in itertools.pairwise(offsets)]
    assert offsets[0] == 0.0 and statistics.fmean(gaps) == pytest.approx(0.1, rel=0.08)
    assert statistics.stdev(gaps) / statistics.fmean(gaps) == pytest.approx(1.0, rel=0.1)  # exponential

    def spread(burstiness: float) -> float:
        got = arrival_offsets(4000, 10.0, burstiness)
        g = [b - a for a, b in itertools.pairwise(got)]
        return statistics.stdev(g) / statistics.fmean(g)

    assert spread(0.25) == pytest.approx(2.0, rel=0.15) and spread(4.0) == pytest.approx(0.5, rel=0.1)
    assert arrival_offsets(50, 3.0, 1.0) == arrival_offsets(50, 3.0, 1.0)  # seeded


def test_slo_parsing_and_goodput() -> None:
    assert parse_slo("ttft=500,tpot=50ms") == {"ttft": 500.0, "tpot": 50.0}
    for bad in ("ttft", "speed=3", "ttft=-1", "tpot=fast"):
        with pytest.raises(DatasetError):
            parse_slo(bad)
    fast = Trace(0.0, token_times=[0.1, 0.15, 0.2], done=0.2)
    slow = Trace(0.0, token_times=[0.9, 1.9, 2.9], done=2.9)
    failed = Trace(0.0, token_times=[0.05], done=0.1, error="HTTP 500: boom")
    figures = serving_figures([fast, slow, failed], 2.0, {"ttft": 500.0, "tpot": 100.0})
    assert figures["completed"] == 2 and figures["output_throughput"] == 3.0
    assert figures["goodput"] == {
        "slo_ms": {"ttft": 500.0, "tpot": 100.0},
        "good_requests": 1,
        "fraction": pytest.approx(1 / 3, abs=1e-4),
        "requests_per_s": 0.5,
    }
    assert figures["tpot_ms"]["p50"] == pytest.approx(525.0)


def test_serving_run_against_a_fake_server(fake: FakeServer) -> None:
    result = _bench(
        "--server", fake.url, "--dataset", str(SHIPPED), "--num-prompts", "6", "-n", "4",
        "--concurrency", "1,3", "-r", "1", "--no-warmup", "--request-rate", "200",
        "--slo", "ttft=60000,tpot=60000", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    records = {r["test"]: r for r in payload["results"]}
    assert set(records) == {"serve r200 c1", "serve r200 c3"}
    for record in records.values():
        assert record["kind"] == "serve" and record["completed"] == 6 and record["errors"] == 0
        assert record["tokens"] == 24 and record["goodput"]["fraction"] == 1.0
        assert record["ttft_ms"]["p50"] > 0 and record["itl_ms"]["p99"] >= 0
    assert records["serve r200 c3"]["max_concurrency"] == 3
    assert payload["fingerprint"]["server"]["models"] == ["fake-model"]
    sent = [b for b in fake.bodies if "messages" in b]
    assert sent and all(b["stream"] and b["max_tokens"] == 4 and b["ignore_eos"] for b in sent)


@pytest.mark.parametrize(
    ("mode", "message"), [("cut", "cut mid-response"), ("500", "HTTP 500: engine exploded")]
)
def test_remote_errors_are_per_request_and_exit_2(fake: FakeServer, mode: str, message: str) -> None:
    fake.mode = mode
    result = _bench(
        "--server", fake.url, "--dataset", str(SHIPPED), "--num-prompts", "3", "-n", "4",
        "--max-concurrency", "2", "-r", "1", "--no-warmup", "--json",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    record = json.loads(result.stdout)["results"][0]
    assert record["errors"] == 3 and record["completed"] == 0
    assert "3 request(s) failed" in result.stderr and message in result.stderr


def test_serving_flags_are_refused_where_they_cannot_apply(tmp_path: Path) -> None:
    local = _bench("--dataset", str(SHIPPED), "--server-model", "m")
    assert local.exit_code == 2 and "--server-model only applies with --server" in local.stderr
    lone = _bench("--server", "http://127.0.0.1:9", "--request-rate", "3")
    assert lone.exit_code == 2 and "needs --dataset" in lone.stderr
    both = _bench(
        "--server",
        "http://127.0.0.1:9",
        "--dataset",
        str(SHIPPED),
        "--concurrency",
        "1,2",
        "--max-concurrency",
        "2",
    )
    assert both.exit_code == 2 and "not both" in both.stderr
