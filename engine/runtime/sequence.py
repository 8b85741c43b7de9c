"""A request in flight: its tokens, how many of them are in the KV cache, sampler, text, stream, clocks."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from infer.engine.grammar import Constraint
from infer.engine.runtime.output import OutputProcessor
from infer.engine.runtime.request import Request
from infer.engine.sampling import SequenceSampler
from infer.engine.speculative import AdaptiveLength, SpecCounters

if TYPE_CHECKING:
    from infer.engine.runtime.stream import RequestStream


DraftFilter = Callable[[list[int]], list[int]]
"""Cuts a sequence's proposed drafts to the prefix it allows (e.g. a grammar keeps the drafts its
constraint accepts); it must return a prefix of its argument. Called before the drafts are
scheduled, so rejected positions never reach the model."""


class SequenceStatus(Enum):
    """Where a sequence is in its life (what it still has to compute is counted in tokens, not here)."""

    WAITING = "waiting"
    """Submitted, no KV slot yet (queued)."""
    RUNNING = "running"
    """Holds a KV slot; scheduled every step until it finishes."""
    FINISHED = "finished"
    """Done, cancelled or failed; its slot is free again."""


@dataclass
class Sequence:
    """Mutable per-request state owned by the engine thread.

    The sequence's tokens are its prompt followed by `generated`; `num_computed_tokens` of them (from
    the start) have their keys and values in the KV cache, and it is the sequence's only position
    counter: the next step feeds the tokens from there on. `draft_ids` are proposed continuations
    (speculative drafts) the next step feeds after them and verifies.
    """

    request: Request
    stream: RequestStream
    sampler: SequenceSampler
    output: OutputProcessor
    seed: int
    status: SequenceStatus = SequenceStatus.WAITING
    slot: int | None = None
    num_computed_tokens: int = 0
    """Tokens of this sequence (from position 0) whose keys and values are in the KV cache."""
    generated: list[int] = field(default_factory=list)
    draft_ids: list[int] = field(default_factory=list)
    """Proposed next tokens, fed after the sequence's own ones and kept only while the model's own
    draws agree with them (the engine fills this from the request's drafter before each step)."""
    constraint: Constraint | None = None
    """The request's grammar matcher (None = free text): it has consumed exactly `generated` once a
    step ends, and masks every logits row before the sampler sees it."""
    draft_filter: DraftFilter | None = None
    """Cuts proposed drafts to an allowed prefix before they are scheduled (None = keep them all)."""
    draft_length: AdaptiveLength | None = None
    """How many drafts to ask for next (None when the request does not speculate)."""
    spec_counters: SpecCounters | None = None
    """What this sequence drafted and what verification kept (None when it does not speculate)."""
    cached_prompt_tokens: int = 0
    """Prompt tokens whose KV a kept prefix supplied (prefix caching) when the sequence got its slot."""
    sampled_on_device: int = 0
    """Draws made from candidates the device picked (envelope sampling); the rest were the host's."""
    submitted_at: float = field(default_factory=time.perf_counter)
    scheduled_at: float | None = None
    first_token_at: float | None = None

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The prompt's token ids."""
        return self.request.prompt_ids

    @property
    def num_tokens(self) -> int:
        """Prompt plus generated tokens."""
        return len(self.request.prompt_ids) + len(self.generated)

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Every token of the sequence, prompt first (a copy: for inspection, not the step loop)."""
        return (*self.request.prompt_ids, *self.generated)

    @property
    def last_token(self) -> int:
        """The newest token (the next one a decode step feeds), without copying the history."""
        return self.generated[-1] if self.generated else self.request.prompt_ids[-1]

    @property
    def in_prefill(self) -> bool:
        """Part of the prompt is not in the KV cache yet (no token generated)."""
        return self.num_computed_tokens < len(self.request.prompt_ids)

    @property
    def is_finished(self) -> bool:
        """Done, cancelled or failed."""
        return self.status is SequenceStatus.FINISHED
