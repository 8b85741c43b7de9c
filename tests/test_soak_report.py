"""The soak's acceptance conditions (scripts/soak.py; CI runs the 2-minute soak itself in .ci/run)."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from soak import HOSTILE_BODIES, SoakReport


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
