"""The executor: a step's work items -> one ragged batch -> logits -> each item's draws.

It owns everything between the scheduler's choice and the sequences' update: building the
`ForwardBatch`, running the model (once for the batch; if that fails, once per item, so only the
item whose forward really fails is reported), drawing on the device the rows inside a GPU backend's
envelope and on the host the rest, and the sample-and-compare of verify rows (drafts kept while the
draws equal them). It changes no sequence's tokens or status: the updater (runtime/updater.py)
advances, emits and finishes from what it returns. The draws are recorded in each sequence's
sampler and grammar matcher as they are made, since the next row's draw depends on them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from infer.engine.batch import ForwardBatch, Segment
from infer.engine.grammar import GrammarViolationError
from infer.engine.models.base import Model
from infer.engine.runtime.device_sampling import sample_on_device
from infer.engine.runtime.scheduler import ScheduledWork
from infer.engine.runtime.sequence import Sequence
from infer.engine.sampling import SampledToken

ItemLogits = tuple[np.ndarray | None, list[int] | None, int, list[SampledToken | None] | None]
"""A work item's share of a forward: the batch's host logits rows [rows, vocab] (None when every row
was drawn on the device), the argmax of every row (None unless some row is plain greedy), the index
of the item's first row, and each row's draw made on the device (None: none made, or the row's)."""


@dataclass(frozen=True)
class ItemOutcome:
    """What one work item's forward and draws produced, for the updater."""

    item: ScheduledWork
    accepted: tuple[SampledToken, ...] = ()
    """The tokens drawn and kept, in order (none for a prefill chunk short of the prompt's end)."""
    error: Exception | None = None
    """What stopped the draws early (after `accepted`), or what failed the item's forward."""
    forward_failed: bool = False
    """The forward failed (`error`): nothing was drawn."""


class Executor:
    """Runs a step's work items on the model and draws their tokens."""

    def __init__(self, model: Model, cache: Any) -> None:
        self.model = model
        self.cache = cache
        backend = getattr(model, "backend", None)
        self.backend = backend
        """The model's backend (None for a model without one: nothing to prepare)."""
        self.device_xp = (
            getattr(backend, "sampling_module", None) if hasattr(model, "forward_logits") else None
        )
        """The array module the logits are sampled on where a request is inside the envelope (a GPU
        backend's); None: every row is copied to the host and drawn there."""

    def prepare_step(self) -> None:
        """Let the backend prepare the coming step (the cpu backend sets its kernels' thread count
        from the load); nothing for a backend without such a need."""
        prepare = getattr(self.backend, "prepare_step", None)
        if prepare is not None:
            prepare()

    def prepare_thread(self) -> None:
        """Let the backend set up the thread that runs the steps (numba's thread count is per
        thread); called first in the engine's background step thread."""
        prepare = getattr(self.backend, "prepare_thread", None)
        if prepare is not None:
            prepare()

    def release_thread(self) -> None:
        """Let the backend free what the calling thread holds for steps, before the engine's background
        step thread starts (the cpu backend: its OpenMP pool)."""
        release = getattr(self.backend, "release_thread", None)
        if release is not None:
            release()

    def warm_up(self, slot: int) -> None:
        """One throwaway decode row (token 0 at position 0 of `slot`) and one two-row prefill (positions
        0 and 1), so whatever the backend prepares on first use for either happens now: the cpu
        backend's decode-row kernel, and the row ops and row attention a short prompt's prefill and a
        batch of decode rows call (two rows take their serial versions; a longer run, the parallel
        ones, loads those on first use)."""
        capacity = getattr(self.cache, "capacity", 2)  # a 1-position context takes the decode row only
        for rows in (1, 2)[: max(1, capacity)]:
            ids = np.zeros(rows, dtype=np.int64)
            batch = ForwardBatch(ids, (Segment(slot, 0, rows),), np.array([rows - 1], dtype=np.int64))
            self.model.forward(batch, self.cache)

    def run(self, work: list[ScheduledWork]) -> list[ItemOutcome]:
        """Forward the items as one batch and draw each one's logits rows, in order."""
        logits, failures = self._execute(work)
        outcomes: list[ItemOutcome] = []
        for item in work:
            failure = failures.get(id(item))
            if failure is not None:
                outcomes.append(ItemOutcome(item, error=failure, forward_failed=True))
            elif not item.logit_rows:  # a prefill chunk short of the prompt's end: only the cache moved
                outcomes.append(ItemOutcome(item))
            else:
                accepted, error = self._sample(item, logits[id(item.sequence)])
                outcomes.append(ItemOutcome(item, tuple(accepted), error))
        return outcomes

    def _execute(self, work: list[ScheduledWork]) -> tuple[dict[int, ItemLogits], dict[int, Exception]]:
        """One forward for the whole batch; if it fails, rerun each sequence alone so only the
        sequence whose step really fails is reported (each rerun rewrites the same cache positions).
        Returns the logits by sequence and the failures by item."""
        if not work:
            return {}, {}
        try:
            return self._forward(work), {}
        except Exception as exc:
            if len(work) == 1:
                return {}, {id(work[0]): exc}
        logits: dict[int, ItemLogits] = {}
        failures: dict[int, Exception] = {}
        for item in work:
            try:
                logits |= self._forward([item])
            except Exception as exc:
                failures[id(item)] = exc
        return logits, failures

    def _forward(self, work: list[ScheduledWork]) -> dict[int, ItemLogits]:
        """Run one ragged batch; each sampling sequence gets its logits rows and, when its params are
        plain greedy, the rows' argmax (taken for the whole batch in one call)."""
        rows: list[int] = []
        segments: list[Segment] = []
        logit_rows: list[int] = []
        owners: list[tuple[Sequence, int]] = []  # each logits row's sequence and draw position
        firsts: list[tuple[int, int]] = []
        any_greedy = False
        for item in work:
            seq = item.sequence
            assert seq.slot is not None
            segments.append(Segment(seq.slot, item.start, len(item.tokens)))
            if item.logit_rows:
                firsts.append((id(seq), len(logit_rows)))
                offset = len(rows)
                logit_rows.extend(offset + r for r in item.logit_rows)
                owners.extend((seq, len(seq.generated) + j) for j in range(len(item.logit_rows)))
                any_greedy = any_greedy or seq.sampler.plain_greedy
            rows.extend(item.tokens)
        batch = ForwardBatch(
            np.asarray(rows, dtype=np.int64), tuple(segments), np.asarray(logit_rows, dtype=np.int64)
        )
        draws: list[SampledToken | None] | None = None
        if self.device_xp is None:
            logits: np.ndarray | None = self.model.forward(batch, self.cache)
        else:
            logits, draws = self._sample_on_device(self.model.forward_logits(batch, self.cache), owners)  # type: ignore[attr-defined]
        argmax = logits.argmax(axis=1).tolist() if any_greedy and logits is not None else None
        return {owner: (logits, argmax, first, draws) for owner, first in firsts}

    def _sample_on_device(
        self, device_logits: object, owners: list[tuple[Sequence, int]]
    ) -> tuple[np.ndarray | None, list[SampledToken | None]]:
        """Draw on the device every row whose request is inside the envelope (sampled, free text:
        greedy rows, constrained rows and the rest go to the host), each at its own position, so
        every draw is the one the host chain would make from the same row. Returns the host copy of
        the logits (None when no row needs it) and each row's device draw (or None)."""
        backend = self.backend
        eligible = [
            i for i, (seq, _) in enumerate(owners) if seq.constraint is None and not seq.sampler.plain_greedy
        ]
        draws: list[SampledToken | None] = [None] * len(owners)
        if eligible:
            rows = device_logits
            if len(eligible) < len(owners):
                rows = device_logits[backend.asarray(np.asarray(eligible, dtype=np.int32))]  # type: ignore[index,union-attr]
            found = sample_on_device(
                self.device_xp,
                rows,
                [owners[i][0].sampler for i in eligible],
                [owners[i][1] for i in eligible],
                backend.to_host,  # type: ignore[union-attr]
            )
            for i, draw in zip(eligible, found, strict=True):
                draws[i] = draw
        host = backend.to_host(device_logits) if any(d is None for d in draws) else None  # type: ignore[union-attr]
        return host, draws

    @staticmethod
    def _sample(item: ScheduledWork, logits: ItemLogits) -> tuple[list[SampledToken], Exception | None]:
        """Draw a token from each logits row of `item` in order, at position len(generated) + row
        offset (so every draw is a pure function of the seed and its position), and keep going only
        while the draw equals the draft the item fed at the next row (sample-and-compare: the kept
        tokens are exactly those of plain decoding). Each draw is recorded in the sampler at once,
        as the next row's draw depends on it. Returns the accepted tokens and the error that stopped
        the draws early, if any."""
        seq = item.sequence
        sampler = seq.sampler
        constraint = seq.constraint
        block, argmax, first, draws = logits
        position = len(seq.generated)
        accepted: list[SampledToken] = []
        last = len(item.logit_rows) - 1
        for j, row in enumerate(item.logit_rows):
            i = first + j
            try:
                drawn = None if draws is None else draws[i]
                if drawn is not None:  # the device drew it, exactly as the host would from this row
                    sampled = drawn
                    seq.sampled_on_device += 1
                else:
                    assert block is not None  # a row not drawn on the device was copied to the host
                    sampled = _draw(seq, block[i], position + j, None if argmax is None else argmax[i])
                sampler.accept(sampled.token_id)
                if constraint is not None:
                    constraint.consume(sampled.token_id)
            except Exception as exc:
                return accepted, exc
            accepted.append(sampled)
            if j == last or sampled.token_id != item.tokens[row + 1]:
                break
            if constraint is not None and constraint.is_stopped:
                break  # the grammar is complete: nothing after this token can be kept
        return accepted, None


def _draw(seq: Sequence, row: np.ndarray, position: int, argmax: int | None) -> SampledToken:
    """One row's draw. A constrained row is masked first (disallowed logits -inf), so every
    sampler stage, the logprobs and the seeded draw see only what the grammar allows; the row's
    mask is the matcher's state after the tokens before it (the drafts this row verifies)."""
    constraint = seq.constraint
    if constraint is None:
        return seq.sampler.sample(row, position, argmax=argmax)
    allowed = constraint.mask()
    if not allowed.any():
        raise GrammarViolationError(f"the {constraint.spec.describe()} constraint allows no token here")
    if argmax is not None and seq.sampler.plain_greedy and allowed[argmax]:
        return seq.sampler.sample(row, position, argmax=argmax)  # the allowed argmax is the masked one
    sampled = seq.sampler.sample(np.where(allowed, row, np.float32(-np.inf)), position)
    if sampled.top_logprobs:  # alternatives the grammar forbids have no mass: not alternatives
        sampled = replace(sampled, top_logprobs=tuple(a for a in sampled.top_logprobs if allowed[a[0]]))
    return sampled
