"""The drafter interface: the runtime asks for drafts before each step, for every generating
sequence at once, and feeds them to the target model to verify.

A drafter only proposes. Whatever it proposes, verification (sample-and-compare in the step loop)
keeps exactly the tokens plain decoding would produce, so a drafter changes speed, never output.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from infer.engine.speculative.config import SpecConfig


@dataclass(frozen=True, slots=True)
class DraftAsk:
    """One sequence's request for drafts this step."""

    key: int
    """The sequence's identity for drafters that keep per-sequence state (a draft model's cache)."""
    context_ids: Sequence[int]
    """Every token of the sequence so far, prompt first (the newest one is not in the target's
    cache yet; the drafts continue after it)."""
    k: int
    """Most drafts wanted (>= 1)."""
    config: SpecConfig


class Drafter(Protocol):
    """Proposes draft tokens: `propose(asks)` answers every ask of a step in one call (a draft model
    batches them), each answer at most `ask.k` ids, possibly none."""

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]:
        """Drafts for each ask, in order."""
        ...

    def release(self, key: int) -> None:
        """The sequence `key` ended: drop whatever is kept for it (idempotent)."""
        ...
