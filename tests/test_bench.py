"""`infer bench`: figures, baseline comparison, clean machine-readable stdout, and `--server` against a
real `infer serve`."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from cli_process import infer_cli

from infer.cli.bench.command import parse_int_list, plan_tests
from infer.cli.bench.stats import (
    BenchResult,
    Trace,
    compare_to_baseline,
    load_baseline,
    percentile,
    summarize_ms,
    to_csv,
)


def test_percentiles_match_numpy_linear_interpolation() -> None:
    values = [5.0, 1.0, 3.0, 2.0, 4.0]
    assert percentile(values, 50) == 3.0
    assert percentile(values, 90) == pytest.approx(4.6)
    assert percentile(values, 99) == pytest.approx(4.96)
    assert summarize_ms([0.001, 0.003]) == {"mean": 2.0, "p50": 2.0, "p90": 2.8, "p99": 2.98}
    assert summarize_ms([]) is None


def test_trace_latencies_and_result_figures() -> None:
    trace = Trace(submitted=10.0, token_times=[10.5, 10.6, 10.8], done=10.9)
    assert trace.ttft == pytest.approx(0.5)
    assert trace.itls == pytest.approx([0.1, 0.2])
    assert trace.e2e == pytest.approx(0.9)
    result = BenchResult("tg2 c1", "conc", 8, 2, 0, 1, samples=[10.0, 12.0], traces=[trace])
    record = result.to_json()
    assert record["tps_mean"] == 11.0 and record["tps_stddev"] == pytest.approx(1.414, abs=1e-3)
    assert record["ttft_ms"]["mean"] == pytest.approx(500.0)
    assert record["itl_ms"]["p50"] == pytest.approx(150.0)


def test_plan_follows_llama_bench_names() -> None:
    tests = plan_tests([512], [128], [(512, 128)], [0, 256], [])
    assert [name for name, _, _ in tests] == ["pp512", "tg128", "pp512 @ d256", "tg128 @ d256", "pp512+tg128"]


def test_baseline_comparison_flags_regressions_beyond_tolerance() -> None:
    baseline = {
        "results": [
            {"test": "tg128", "depth": 0, "concurrency": 1, "tps_mean": 100.0, "itl_ms": {"mean": 10.0}},
            {"test": "pp512", "depth": 0, "concurrency": 1, "tps_mean": 1000.0},
        ]
    }
    current = [
        {"test": "tg128", "depth": 0, "concurrency": 1, "tps_mean": 91.0, "itl_ms": {"mean": 11.5}},
        {"test": "pp512", "depth": 0, "concurrency": 1, "tps_mean": 850.0},
        {"test": "tg16 c4", "depth": 0, "concurrency": 4, "tps_mean": 5.0},
    ]
    comparisons, missing = compare_to_baseline(current, baseline, 0.1)
    verdicts = {(c.test, c.figure): c.regressed for c in comparisons}
    assert verdicts == {("tg128", "t/s"): False, ("tg128", "itl_ms mean"): True, ("pp512", "t/s"): True}
    assert missing == ["tg16 c4"]


def test_csv_has_one_row_per_test() -> None:
    records = [BenchResult("pp64", "pp", 64, 0, 0, 1, samples=[100.0]).to_json()]
    header = {
        "model": "m",
        "backend": "cpu",
        "threads": 2,
        "fingerprint": {"cpu": {"model": "X"}, "blas": []},
    }
    rows = list(csv.DictReader(io.StringIO(to_csv(records, header))))
    assert len(rows) == 1 and rows[0]["test"] == "pp64" and rows[0]["tps_mean"] == "100.0"


def test_bad_values_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert parse_int_list("1, 4,16", "--concurrency", minimum=1) == [1, 4, 16]
    with pytest.raises(SystemExit) as info:
        parse_int_list("4,x", "--concurrency")
    assert info.value.code == 2 and "--concurrency takes integers" in capsys.readouterr().err
    bad = tmp_path / "bad.json"
    bad.write_text("[1, 2]")
    with pytest.raises(ValueError, match="no `results` list"):
        load_baseline(bad)


def test_bad_options_exit_2_with_nothing_on_stdout() -> None:
    for args in (["-pg", "512"], ["--json", "--csv"]):
        result = infer_cli("bench", *args)
        assert result.returncode == 2, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1 and result.stdout == ""


@pytest.mark.real_model
@pytest.mark.slow
def test_bench_json_is_clean_and_baseline_regression_exits_1(
    tmp_path: Path, default_model_path: Path
) -> None:
    baseline = tmp_path / "baseline.json"
    # A baseline far faster than this machine: every throughput figure regresses.
    baseline.write_text(
        json.dumps(
            {
                "results": [
                    {"test": "pp32", "depth": 0, "concurrency": 1, "tps_mean": 1e9},
                    {"test": "tg8", "depth": 0, "concurrency": 1, "tps_mean": 1e9},
                ]
            }
        )
    )
    result = infer_cli(
        "bench", "-p", "32", "-n", "8", "-r", "2", "--concurrency", "1,2", "--concurrency-prompt", "8",
        "--json", "--baseline", str(baseline),
    )  # fmt: skip
    assert result.returncode == 1, result.stderr
    payload = json.loads(result.stdout)  # stdout holds the JSON alone
    tests = [r["test"] for r in payload["results"]]
    assert tests == ["pp32", "tg8", "tg8 c1", "tg8 c2"]
    for record in payload["results"]:
        assert record["tps_mean"] > 0 and record["repetitions"] == 2 and record["errors"] == 0
    conc = payload["results"][-1]
    assert conc["concurrency"] == 2 and conc["ttft_ms"]["p99"] >= conc["ttft_ms"]["p50"] > 0
    assert conc["itl_ms"]["mean"] > 0 and conc["e2e_ms"]["mean"] > conc["ttft_ms"]["mean"]
    fp = payload["fingerprint"]
    assert fp["cpu"]["model"] and fp["cpu"]["cores"] and fp["blas"] and fp["backend"] == "cpu"
    assert payload["backend"] == "cpu" and payload["threads"] >= 1
    assert payload["threads_reason"].startswith("adaptive: ")  # why the count is what it is
    assert f"threads {payload['threads']}: adaptive: " in result.stderr
    assert "REGRESSION" in result.stderr and "t/s" in result.stderr


@pytest.mark.real_model
@pytest.mark.slow
def test_bench_server_against_infer_serve(default_model_path: Path) -> None:
    if infer_cli("serve", "--help", timeout=60).returncode != 0:
        pytest.skip("`infer serve` is not registered in this checkout")
    from infer.cli.serve.launch import start_server

    server = start_server([])
    try:
        result = infer_cli(
            "bench", "--server", server.url or "", "-p", "16", "-n", "8", "-r", "1", "--concurrency", "2",
            "--concurrency-prompt", "8", "--no-warmup", "--json",
        )  # fmt: skip
    finally:
        server.stop()
    assert result.returncode == 0, result.stderr
    payload = json.loads(result.stdout)
    by_test = {r["test"]: r for r in payload["results"]}
    assert set(by_test) == {"pp16", "tg8", "tg8 c2"}
    assert payload["backend"] == "server" and payload["model"]
    for record in by_test.values():
        assert record["tps_mean"] > 0 and record["errors"] == 0
        assert record["ttft_ms"]["mean"] > 0
    # tg asks for N + 1 tokens (the first one is timed as TTFT); all are counted from the stream.
    assert by_test["tg8"]["tokens"] == 9 and by_test["tg8"]["itl_ms"] is not None
    assert by_test["tg8 c2"]["requests"] == 2 and by_test["tg8 c2"]["tokens"] == 16
    assert by_test["tg8 c2"]["e2e_ms"]["mean"] >= by_test["tg8 c2"]["ttft_ms"]["mean"]
