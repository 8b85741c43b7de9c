"""`infer bench compare` and `--plot` on recorded bench runs (tests/data/bench/, see its README):
ratios, fingerprint differences, `--fail-below` naming the regressed figure, and the pictures."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
from cli_process import infer_cli

from infer.cli.bench.compare import Run, compare_runs, record_figures, regressions, run_differences

pytest_plugins = ["conftest_synthetic"]

DATA = Path(__file__).parent / "data" / "bench"
EXACT, INT8, REGRESSED = DATA / "run_exact.json", DATA / "run_int8.json", DATA / "run_exact_regressed.json"


def _run(path: Path) -> Run:
    return Run(path.name, json.loads(path.read_text()))


def _record(run: Run, test: str) -> dict:
    return next(r for r in run.data["results"] if r["test"] == test)


def test_ratios_are_speed_ratios_for_throughput_and_latency() -> None:
    a, b = _run(EXACT), _run(INT8)
    rows, missing = compare_runs([a, b])
    assert missing == []
    by = {(r.test, r.figure): r for r in rows}
    tps = by[("pp128", "t/s")]
    assert tps.ratios[0] == pytest.approx(_record(b, "pp128")["tps_mean"] / _record(a, "pp128")["tps_mean"])
    ttft = by[("tg8 c4", "ttft p90")]  # a latency: first / later, so > 1 still means faster
    expected = _record(a, "tg8 c4")["ttft_ms"]["p90"] / _record(b, "tg8 c4")["ttft_ms"]["p90"]
    assert ttft.ratios[0] == pytest.approx(expected)
    assert not ttft.higher_is_better and tps.higher_is_better
    # every figure of every common test: t/s plus 4 statistics of each latency the record has
    assert len([r for r in rows if r.test == "tg8 c2"]) == 1 + 3 * 4
    assert set(record_figures(_record(a, "pp16"))) == {"t/s"} | {
        f"{k} {s}" for k in ("ttft", "e2e") for s in ("mean", "p50", "p90", "p99")
    }


def test_tests_missing_from_a_run_are_listed_not_compared() -> None:
    a, b = _run(EXACT), _run(INT8)
    trimmed = Run("trimmed", {**b.data, "results": [r for r in b.data["results"] if r["test"] != "pp64"]})
    rows, missing = compare_runs([a, trimmed])
    assert missing == ["pp64"] and not any(r.test == "pp64" for r in rows)


def test_fingerprint_differences_name_kernels_and_commit() -> None:
    runs = [_run(EXACT), _run(INT8), _run(REGRESSED)]
    differences = dict(run_differences(runs))
    assert differences["cpu_kernels"] == ("exact", "int8", "exact")
    assert differences["fingerprint.cpu_kernels"] == ("exact", "int8", "exact")
    commits = differences["fingerprint.infer.commit"]
    assert commits[2] == "0123456789ab" and commits[0] != commits[2]
    assert "fingerprint.cpu.model" not in differences  # the same machine recorded all three
    assert run_differences([runs[0], runs[0]]) == []


def test_fail_below_names_only_figures_under_the_bound() -> None:
    runs = [_run(EXACT), _run(REGRESSED)]
    rows, _ = compare_runs(runs)
    failed = regressions(rows, runs, 0.95)
    assert len(failed) == 1 and failed[0].startswith("tg8 t/s: 0.800x")
    assert regressions(rows, runs, 0.79) == []


def test_compare_cli_exits_1_naming_the_regressed_figure() -> None:
    done = infer_cli("bench", "compare", str(EXACT), str(REGRESSED), "--fail-below", "0.95")
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines() == [
        "infer: regression: tg8 t/s: 0.800x of the first run in run_exact_regressed.json (below 0.95)"
    ]
    assert "0.800x" in done.stdout and "0123456789ab" in done.stdout  # the table and the differences
    same = infer_cli("bench", "compare", str(EXACT), str(EXACT), "--fail-below", "0.95")
    assert same.returncode == 0, same.stderr
    assert "fingerprints and settings are the same" in same.stdout


def test_compare_cli_two_fingerprints_without_a_bound_exits_0() -> None:
    done = infer_cli("bench", "compare", str(EXACT), str(INT8))
    assert done.returncode == 0, done.stderr
    assert "what differs between the runs" in done.stdout and "int8" in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((str(EXACT),), "needs two or more JSON files"),
        ((str(EXACT), "missing.json"), "missing.json: cannot read it"),
        ((str(EXACT), str(Path(__file__))), "not JSON"),
        ((str(EXACT), str(INT8), "--fail-below", "0"), "--fail-below must be > 0"),
        ((str(EXACT), str(INT8), "--plot", "out.pdf"), "must end in .png or .svg"),
    ],
)
def test_compare_cli_bad_input_is_one_line_exit_2(args: tuple[str, ...], message: str) -> None:
    done = infer_cli("bench", "compare", *args)
    assert done.returncode == 2
    assert message in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr


def _svg_texts(path: Path) -> list[str]:
    root = ET.parse(path).getroot()
    return [t.text or "" for t in root.iter("{http://www.w3.org/2000/svg}text")] + [
        "".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")
    ]


def test_plot_overlays_runs_in_every_panel(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "runs.svg"
    done = infer_cli("bench", "compare", str(EXACT), str(INT8), "--plot", str(out))
    assert done.returncode == 0, done.stderr
    texts = " ".join(_svg_texts(out))
    for title in (
        "aggregate tokens/s against concurrency",
        "TTFT against concurrency",
        "inter-token latency against concurrency",
        "prefill tokens/s against prompt length",
    ):
        assert title in texts
    for label in ("run_exact.json p99", "run_int8.json p50", "run_int8.json"):
        assert label in texts
    png = tmp_path / "one.png"
    assert infer_cli("bench", "compare", str(EXACT), "--plot", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_draws_only_panels_with_data(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from infer.cli.bench.plot import PlotError, plot_runs

    data = json.loads(EXACT.read_text())
    prefill_only = {**data, "results": [r for r in data["results"] if r["kind"] == "pp"]}
    assert plot_runs([("pp", prefill_only)], tmp_path / "pp.svg") == [
        "prefill tokens/s against prompt length"
    ]
    decode_only = {**data, "results": [r for r in data["results"] if r["kind"] == "tg"]}
    with pytest.raises(PlotError, match="nothing to plot"):
        plot_runs([("tg", decode_only)], tmp_path / "tg.svg")


def test_plot_without_matplotlib_says_how_to_install_it(tmp_path: Path) -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['matplotlib'] = None; sys.argv[0] = 'infer'; "
        "from infer.cli.main import main; main()"
    )
    for args in (
        ["bench", "compare", str(EXACT), "--plot", str(tmp_path / "x.png")],
        ["bench", "-p", "16", "--plot", str(tmp_path / "x.png")],  # refused before measuring anything
    ):
        done = subprocess.run(
            [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2
        assert done.stderr.strip() == (
            "infer: error: infer bench --plot needs matplotlib, which is not installed: "
            "pip install 'infer[plot]'"
        )
        assert not (tmp_path / "x.png").exists()


def test_bench_plot_draws_the_run_it_measured(tmp_path: Path, tiny_gguf: Path) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "sweep.svg"
    done = infer_cli(
        "bench", "-m", str(tiny_gguf), "-p", "8,16", "-n", "4", "--concurrency", "1,2",
        "--concurrency-prompt", "4", "-r", "1", "--no-warmup", "--plot", str(out), "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    json.loads(done.stdout)  # --json keeps stdout to the JSON alone; the notice goes to stderr
    assert f"plot written to {out}" in " ".join(done.stderr.split())
    texts = " ".join(_svg_texts(out))
    assert "aggregate tokens/s against concurrency" in texts and "prefill tokens/s" in texts
