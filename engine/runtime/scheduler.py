"""Continuous batching by token counts: which sequences run this step, and which of their tokens.

A sequence's work is always "its tokens from `num_computed_tokens` on" (as in vLLM's v1 scheduler):
a chunk of its prompt while the prompt is not in the KV cache, otherwise the newest token plus any
drafts. Each step holds every generating sequence's work (decode) plus prefill chunks of newly
admitted prompts, within `max_batched_tokens` rows and `max_num_seqs` sequences. Decode rows go
first so a long prompt being admitted never stalls the sequences that are already streaming: it is
prefilled a chunk per step beside them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Literal

from infer.engine.backends.kv_cache import KVCache
from infer.engine.runtime.kv_budget import KVBudget
from infer.engine.runtime.prefix_cache import PrefixCache
from infer.engine.runtime.sequence import Sequence, SequenceStatus

StepKind = Literal["prefill", "decode", "verify"]
"""How fault hooks and error messages name a step: "prefill chunk N", "decode step N", or "verify
step N" (a decode step that carries drafts)."""

_LAST_ROW = (0,)
"""The logit rows of a one-token decode item (shared: it is the hot path)."""


@dataclass(frozen=True)
class SchedulerLimits:
    """Batch limits from the profile."""

    max_num_seqs: int
    """Sequences that may hold a KV slot at once (others queue)."""
    max_batched_tokens: int
    """Rows in one forward pass."""
    chunk_size: int
    """Largest prefill chunk of one sequence in one step (`batch_size`); chunks end at multiples of
    it from the start of the prompt, whatever else runs."""


@dataclass(frozen=True, slots=True)
class ScheduledWork:
    """One sequence's share of a step: `tokens` fed at positions `start`, `start + 1`, ...

    `logit_rows` are offsets into `tokens` (ascending) whose logits are sampled: none for a prefill
    chunk that does not finish the prompt, the last row for the chunk that does and for a decode
    token, and one row per draft more when the item carries drafts (the draw at row r is compared
    with the token fed at row r + 1, the draft it verifies).
    """

    sequence: Sequence
    start: int
    tokens: tuple[int, ...]
    logit_rows: tuple[int, ...]
    kind: StepKind
    index: int
    """Prefill: the chunk number (`start // chunk_size`); decode/verify: tokens generated before this
    step."""

    @property
    def label(self) -> str:
        """The step as errors name it: "prefill chunk N", "decode step N" or "verify step N"."""
        return f"prefill chunk {self.index}" if self.kind == "prefill" else f"{self.kind} step {self.index}"


@dataclass
class Scheduler:
    """Owns the waiting queue and the running set; builds each step's batch."""

    limits: SchedulerLimits
    cache: KVCache
    waiting: deque[Sequence] = field(default_factory=deque)
    running: list[Sequence] = field(default_factory=list)
    prefix_cache: PrefixCache | None = None
    """Kept prompt prefixes (prefix caching), or None: every prompt is computed from position 0."""
    budget: KVBudget | None = None
    """The KV memory budget (admission waits while a sequence's positions do not fit), or None."""
    _reserved: dict[int, int] = field(default_factory=dict)
    """Per running sequence (by id): the positions the budget set aside for it."""

    def add(self, sequence: Sequence) -> None:
        """Queue a new sequence; it gets a slot when one is free."""
        sequence.status = SequenceStatus.WAITING
        self.waiting.append(sequence)

    def remove(self, sequence: Sequence) -> None:
        """Drop a sequence (finished, cancelled, failed) and free its slot at once."""
        # The slot goes back before the sequence leaves the lists: another thread that sees
        # no sequences (Engine.active_sequences takes no step lock) then also sees every slot free.
        if sequence.slot is not None:
            kept = self.prefix_cache is not None and self.prefix_cache.keep(
                sequence.slot, sequence.prompt_ids, sequence.num_computed_tokens
            )
            if not kept:
                self.cache.release(sequence.slot)
            sequence.slot = None
        if sequence in self.running:
            self.running.remove(sequence)
        elif sequence in self.waiting:
            self.waiting.remove(sequence)
        self._reserved.pop(id(sequence), None)
        sequence.status = SequenceStatus.FINISHED

    @property
    def has_work(self) -> bool:
        """Anything queued or running."""
        return bool(self.waiting or self.running)

    def _admit(self) -> None:
        while self.waiting and len(self.running) < self.limits.max_num_seqs:
            if not self._budget_admits(self.waiting[0]):
                return  # first come, first served: the head of the queue waits for room
            if self.prefix_cache is None:
                slot, reused = self.cache.acquire(), 0
            else:
                slot, reused = self.prefix_cache.acquire(self.waiting[0].prompt_ids)
            if slot is None:
                return
            sequence = self.waiting.popleft()
            sequence.slot = slot
            sequence.num_computed_tokens = reused
            sequence.cached_prompt_tokens = reused
            if self.budget is not None:
                self._reserved[id(sequence)] = self._positions(sequence)
            sequence.status = SequenceStatus.RUNNING
            self.running.append(sequence)

    def _positions(self, sequence: Sequence) -> int:
        assert self.budget is not None
        return self.budget.positions(len(sequence.prompt_ids), sequence.request.max_tokens)

    def _budget_admits(self, sequence: Sequence) -> bool:
        """Whether the sequence's positions fit the budget beside the running ones and the kept
        prefixes, evicting kept prefixes (least recently used first) to make room."""
        if self.budget is None or not self.budget.bounded:
            return True
        need = self._positions(sequence)
        while not self.budget.fits(self._held_positions(), need):
            if self.prefix_cache is None or not self.prefix_cache.kept_slots:
                return False
            self.prefix_cache.evict_oldest()
        return True

    def _held_positions(self) -> int:
        """Positions set aside for the running sequences plus those the kept prefixes hold."""
        kept = self.prefix_cache.kept_positions if self.prefix_cache is not None else 0
        return sum(self._reserved.values()) + kept

    @property
    def reserved_bytes(self) -> int:
        """KV bytes set aside for the running sequences and held by kept prefixes."""
        return 0 if self.budget is None else self.budget.bytes_for(self._held_positions())

    def schedule(self) -> list[ScheduledWork]:
        """This step's work: decode rows first, then prefill chunks in arrival order."""
        self._admit()
        work: list[ScheduledWork] = []
        budget = self.limits.max_batched_tokens
        for seq in self.running:
            if budget <= 0:
                break
            if not seq.in_prefill:
                item = self._decode_work(seq, budget)
                work.append(item)
                budget -= len(item.tokens)
        for seq in self.running:
            if budget <= 0:
                break
            if seq.in_prefill:
                item = self._prefill_work(seq, budget)
                work.append(item)
                budget -= len(item.tokens)
        return work

    def _decode_work(self, seq: Sequence, budget: int) -> ScheduledWork:
        """The token not yet in the cache (the last one sampled), then as many drafts as the budget
        and the context allow; every row's logits are sampled."""
        start = seq.num_computed_tokens
        index = len(seq.generated)
        if not seq.draft_ids:
            return ScheduledWork(seq, start, (seq.last_token,), _LAST_ROW, "decode", index)
        room = min(budget, self.cache.capacity - start)
        tokens = (seq.last_token, *seq.draft_ids)[: max(room, 1)]
        kind: StepKind = "verify" if len(tokens) > 1 else "decode"
        return ScheduledWork(seq, start, tokens, tuple(range(len(tokens))), kind, index)

    def _prefill_work(self, seq: Sequence, budget: int) -> ScheduledWork:
        """The prompt's next chunk: up to the next multiple of chunk_size, cut short by the budget
        (the chunk after a cut one ends at the multiple again); the chunk that finishes the prompt
        samples its last row."""
        chunk = self.limits.chunk_size
        start = seq.num_computed_tokens
        prompt = seq.prompt_ids
        size = min(len(prompt) - start, chunk - start % chunk, budget)
        end = start + size
        rows = (size - 1,) if end == len(prompt) else ()
        return ScheduledWork(seq, start, prompt[start:end], rows, "prefill", start // chunk)
