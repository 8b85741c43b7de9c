"""Continuous batching: which sequences run this step, and with how many tokens each.

Each step holds every generating sequence's next token (decode) plus prefill chunks of newly
admitted prompts, within `max_batched_tokens` rows and `max_num_seqs` sequences. Decode rows go
first so a long prompt being admitted never stalls the sequences that are already streaming: it is
prefilled a chunk per step beside them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from infer.engine.runtime.kv_cache import KVCache

if TYPE_CHECKING:
    from infer.engine.runtime.sequence import Sequence


class Phase(Enum):
    """Where a sequence is in its life."""

    WAITING = "waiting"
    """Submitted, no KV slot yet (queued)."""
    PREFILL = "prefill"
    """Holds a slot; prompt not fully in the cache."""
    DECODE = "decode"
    """Generating one token per step."""
    FINISHED = "finished"


@dataclass(frozen=True)
class SchedulerLimits:
    """Batch limits from the profile."""

    max_num_seqs: int
    """Sequences that may hold a KV slot at once (others queue)."""
    max_batched_tokens: int
    """Rows in one forward pass."""
    chunk_size: int
    """Largest prefill chunk of one sequence in one step (`batch_size`)."""


@dataclass(frozen=True)
class ScheduledWork:
    """One sequence's share of a step: `tokens` new positions starting at `start`."""

    sequence: Sequence
    start: int
    tokens: tuple[int, ...]
    needs_logits: bool
    """The row's logits are sampled (decode, or the chunk that completes the prompt)."""


@dataclass
class Scheduler:
    """Owns the waiting queue and the running set; builds each step's batch."""

    limits: SchedulerLimits
    cache: KVCache
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)

    def add(self, sequence: Sequence) -> None:
        """Queue a new sequence; it gets a slot when one is free."""
        sequence.phase = Phase.WAITING
        self.waiting.append(sequence)

    def remove(self, sequence: Sequence) -> None:
        """Drop a sequence (finished, cancelled, failed) and free its slot at once."""
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
        if sequence.slot is not None:
            self.cache.release(sequence.slot)
            sequence.slot = None
        sequence.phase = Phase.FINISHED

    @property
    def has_work(self) -> bool:
        """Anything queued or running."""
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            slot = self.cache.acquire()
            if slot is None:
                return
            sequence = self.waiting.popleft()
            sequence.slot = slot
            sequence.phase = Phase.PREFILL
            self.running.append(sequence)

    def schedule(self) -> list[ScheduledWork]:
        """This step's work: decode rows first, then prefill chunks in arrival order."""
        self._admit()
        work: list[ScheduledWork] = []
        budget = self.limits.max_batched_tokens
        for seq in self.running:
            if seq.phase is Phase.DECODE and budget > 0:
                work.append(ScheduledWork(seq, seq.num_cached, (seq.last_token,), True))
                budget -= 1
        for seq in self.running:
            if seq.phase is not Phase.PREFILL or budget <= 0:
                continue
            remaining = len(seq.prompt_ids) - seq.num_cached
            size = min(remaining, self.limits.chunk_size, budget)
            chunk = seq.prompt_ids[seq.num_cached : seq.num_cached + size]
            work.append(ScheduledWork(seq, seq.num_cached, tuple(chunk), size == remaining))
            budget -= size
        return work
