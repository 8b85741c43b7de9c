"""The soak's acceptance conditions (scripts/soak.py; CI runs the 2-minute soak itself in .ci/run)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from soak import HOSTILE_BODIES, RSS_WINDOW, SoakReport, default_warmup, rss_growth


def _clean() -> SoakReport:
    return SoakReport(slots_held_at_end=0, in_flight_at_end=0, rss_growth_pct=1.0, exit_status=0)


def test_a_clean_soak_has_no_problems() -> None:
    assert _clean().problems(5.0) == []


def test_each_condition_is_reported() -> None:
    cases = {
        "held": {"slots_held_at_end": 1},
        "in flight": {"in_flight_at_end": 2},
        "RSS grew": {"rss_growth_pct": 5.0},
        "greedy": {"greedy_mismatches": ["x"]},
        "5xx": {"server_errors_5xx": 1},
        "unexpected": {"unexpected": ["y"]},
        "tracebacks": {"server_tracebacks": 1},
        "exit status": {"exit_status": 1},
    }
    for word, change in cases.items():
        report = _clean()
        for key, value in change.items():
            setattr(report, key, value)
        problems = report.problems(5.0)
        assert len(problems) == 1 and word in problems[0], (word, problems)


def test_the_hostile_bodies_cover_the_issue_rows() -> None:
    text = " ".join(str(body) for _, body in HOSTILE_BODIES)
    for needle in ("1e308", "1e-40", "1e-45", "\\ud800", '"messages"', "[[[["):
        assert needle in text, needle
    assert any(body == "" for _, body in HOSTILE_BODIES)


def _plateau_with_spikes(seconds: int) -> list[float]:
    """An RSS series shaped like a healthy soak's: a climb for 40 s, then a flat 160 MiB with spikes."""
    climb = [130.0 + 30.0 * i / 40 for i in range(40)]
    flat = [185.0 if i % 7 == 3 else (150.0 if i % 11 == 5 else 160.0) for i in range(seconds - 40)]
    return climb + flat


def test_rss_growth_reads_a_plateau_as_flat_even_when_single_samples_swing() -> None:
    samples = _plateau_with_spikes(120)
    # the old reading (a 24 s warm-up, its last sample against the final one) saw the climb as a leak
    assert 100.0 * (samples[-1] - samples[24]) / samples[24] > 5.0
    warm, end, growth = rss_growth(samples, int(default_warmup(120.0)))
    assert (warm, end) == (160.0, 160.0) and growth == 0.0


def test_rss_growth_sees_a_leak() -> None:
    samples = [150.0 + 0.25 * i for i in range(120)]  # +0.25 MiB a second, 9 % over the measured minute
    warm, end, growth = rss_growth(samples, 60)
    assert growth > 5.0 and end > warm
    assert rss_growth(samples[: 60 + RSS_WINDOW], 60)[2] < 2.0  # one window only: no growth to see


def test_the_warm_up_covers_the_climb_and_leaves_a_measured_part() -> None:
    assert default_warmup(120.0) == 60.0  # the CI soak: the climb (~40 s) is over before measuring
    assert default_warmup(30 * 60.0) == 120.0
    assert default_warmup(60.0) == 30.0  # never past half the run
    assert rss_growth([], 0) == (0.0, 0.0, 0.0)
