"""Speculation counters: what a request drafted and what verification kept.

They travel in `DoneEvent.counters` as plain integers (`drafts`, `draft_tokens`, `accepted_tokens`,
`accepted_at_1`, `accepted_at_2`, ...) so gate anchors can pin them; `summary` derives the rates every
surface shows. vLLM's definitions: acceptance rate = accepted / drafted tokens, mean accepted length
= 1 + accepted / drafts (tokens a verify step yields, counting the target's own token).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

POSITION_PREFIX = "accepted_at_"


@dataclass
class SpecCounters:
    """Running counts for one sequence (the engine thread updates them after each verify)."""

    drafts: int = 0
    """Verify steps that carried at least one draft."""
    draft_tokens: int = 0
    """Drafted tokens fed to the target (after the step's budget cut)."""
    accepted_tokens: int = 0
    """Drafts equal to the target's own draw at their position."""
    accepted_at: list[int] = field(default_factory=list)
    """accepted_at[i]: verifies whose draft i + 1 was accepted."""

    def record(self, drafted: int, accepted: int) -> None:
        """One verify step: `drafted` drafts fed, the first `accepted` of them kept."""
        self.drafts += 1
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        if len(self.accepted_at) < accepted:
            self.accepted_at.extend([0] * (accepted - len(self.accepted_at)))
        for i in range(accepted):
            self.accepted_at[i] += 1

    def as_counters(self) -> dict[str, int]:
        """The flat integer form carried by `DoneEvent.counters`."""
        flat = {
            "drafts": self.drafts,
            "draft_tokens": self.draft_tokens,
            "accepted_tokens": self.accepted_tokens,
        }
        flat.update({f"{POSITION_PREFIX}{i + 1}": n for i, n in enumerate(self.accepted_at)})
        return flat


def summary(counters: Mapping[str, int]) -> dict[str, Any] | None:
    """The speculation figures of a `DoneEvent.counters` (None when the request did not speculate):
    the counts, `acceptance_rate`, `mean_accepted_length` and `accepted_per_position` (a list)."""
    if "drafts" not in counters:
        return None
    drafts, drafted, accepted = counters["drafts"], counters["draft_tokens"], counters["accepted_tokens"]
    positions = sorted(
        (int(key[len(POSITION_PREFIX) :]), value)
        for key, value in counters.items()
        if key.startswith(POSITION_PREFIX)
    )
    return {
        "drafts": drafts,
        "draft_tokens": drafted,
        "accepted_tokens": accepted,
        "acceptance_rate": round(accepted / drafted, 4) if drafted else 0.0,
        "mean_accepted_length": round(1 + accepted / drafts, 4) if drafts else 1.0,
        "accepted_per_position": [value for _, value in positions],
    }


def merge(totals: Mapping[str, int], counters: Mapping[str, int]) -> dict[str, int]:
    """Counters of several requests added key by key (bench runs, server totals)."""
    merged = dict(totals)
    for key, value in counters.items():
        merged[key] = merged.get(key, 0) + value
    return merged
