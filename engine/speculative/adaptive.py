"""Adaptive draft length: how many drafts a sequence asks for next, from how its last ones fared.

Verification costs one target row per draft, so drafts that keep being rejected make a step slower
for nothing. The rule (per sequence, a pure function of its own history, so runs repeat exactly):
after a fully accepted draft the length doubles (up to the maximum); after a rejection it becomes
one more than the drafts accepted (at least 1); after `PAUSE_AFTER` verifies in a row that accepted
nothing, drafting pauses for a number of steps that doubles with each further miss (up to
`MAX_PAUSE`), and one accepted draft ends the pause rule again.
"""

from __future__ import annotations

from dataclasses import dataclass

PAUSE_AFTER = 2
"""Verifies in a row accepting nothing before drafting pauses."""
MAX_PAUSE = 16
"""Longest pause, in steps."""


@dataclass
class AdaptiveLength:
    """One sequence's draft length controller."""

    maximum: int
    minimum: int = 1
    """Shortest length asked for while drafting (a drafter's answer shorter than the request's
    `draft_min` is dropped, so asking for less would waste the step)."""
    adaptive: bool = True
    current: int = 0
    """The length asked for next (starts at the maximum)."""
    misses: int = 0
    """Verifies in a row that accepted no draft."""
    pause: int = 0
    """Steps left without drafting."""

    def __post_init__(self) -> None:
        self.minimum = max(1, min(self.minimum, self.maximum))
        self.current = self.maximum

    def next_length(self) -> int:
        """Drafts to ask for this step (0 while paused); counts the paused step."""
        if not self.adaptive:
            return self.maximum
        if self.pause > 0:
            self.pause -= 1
            return 0
        return self.current

    def record(self, drafted: int, accepted: int) -> None:
        """A verify of `drafted` drafts kept `accepted` of them."""
        if not self.adaptive or drafted <= 0:
            return
        if accepted == drafted:
            self.current = min(self.maximum, self.current * 2)
        else:
            self.current = min(self.maximum, max(self.minimum, accepted + 1))
        if accepted:
            self.misses = 0
            return
        self.misses += 1
        if self.misses >= PAUSE_AFTER:
            self.pause = min(MAX_PAUSE, 1 << (self.misses - PAUSE_AFTER))
