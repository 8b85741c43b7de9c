"""The update after a step: each sequence advances by the tokens the executor accepted for it, its
token events go out, and a request that ends (a stop, a limit, an error, a cancel) is finished with
its DoneEvent and its KV slot freed.

Every way a request ends goes through `finish`, so every request gets exactly one DoneEvent with its
usage, timings, seed and tokens, and every done listener sees it.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from infer.engine.grammar import GrammarViolationError
from infer.engine.runtime.events import DoneEvent, FinishReason, Timings, TokenEvent, Usage
from infer.engine.runtime.executor import ItemOutcome
from infer.engine.runtime.request import FaultHook
from infer.engine.runtime.scheduler import ScheduledWork, Scheduler
from infer.engine.runtime.sequence import Sequence
from infer.engine.sampling import NoFiniteLogitsError, SampledToken


class SequenceUpdater:
    """Advances sequences, emits their events and finishes their requests."""

    def __init__(
        self,
        scheduler: Scheduler,
        ctx_size: int,
        steps: Callable[[], int],
        release_drafts: Callable[[Sequence], None],
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.scheduler = scheduler
        self.ctx_size = ctx_size
        self._steps = steps
        """The engine's step count, which every TokenEvent carries."""
        self._release_drafts = release_drafts
        """Frees what a finished sequence's drafter keeps for it (a draft model's KV slot)."""
        self._fault_hook = fault_hook
        """Test-only failure injection (see request.FaultHook)."""
        self._done_listeners: list[Callable[[DoneEvent], None]] = []

    def add_done_listener(self, listener: Callable[[DoneEvent], None]) -> None:
        """Call `listener` with every request's DoneEvent, on the thread that ends the request."""
        self._done_listeners.append(listener)

    def update(self, outcomes: Iterable[ItemOutcome]) -> None:
        """Apply each item's outcome to its sequence: move the cache counter of a prefill chunk,
        record a verify's kept drafts, advance by the accepted tokens, end a sequence that failed."""
        for outcome in outcomes:
            item, seq = outcome.item, outcome.item.sequence
            if outcome.forward_failed:
                assert outcome.error is not None
                self.fail(seq, item.label, outcome.error)
                continue
            if not item.logit_rows:  # a prefill chunk short of the prompt's end: only the cache moved
                seq.num_computed_tokens = item.start + len(item.tokens)
                continue
            if item.kind == "verify":
                _count_verify(item, outcome.accepted)
            if outcome.accepted:
                self.advance(seq, outcome.accepted)
            error = outcome.error
            if error is not None and not seq.is_finished:
                stage = "grammar" if isinstance(error, GrammarViolationError) else "sampling"
                self.fail(seq, f"decode step {len(seq.generated)} ({stage})", error)

    def advance(self, seq: Sequence, accepted: Iterable[SampledToken]) -> None:
        """Move `seq` forward by the tokens accepted for its last work item (one per step, or
        several when drafts are verified), in order.

        Each token is appended and emitted as its own TokenEvent; stop tokens, stop strings,
        max_tokens and the context end are checked after each one, and once the request finishes
        the rest are dropped. The position counter then ends at the last kept token's position:
        every token before it is in the KV cache (its own, the prompt's, the accepted drafts'),
        and cache entries past it (rejected drafts) are simply overwritten by later steps. The
        sampler has already recorded the tokens (the executor does, as it draws them).
        """
        events: list[TokenEvent] = []
        reason: FinishReason | None = None
        tokens = list(accepted)
        for sampled in tokens:
            event, reason = self._append(seq, sampled)
            events.append(event)
            if reason is not None:
                break
        if seq.constraint is not None and len(events) < len(tokens):
            seq.constraint.rollback(len(tokens) - len(events))  # the matcher follows the kept tokens
        seq.num_computed_tokens = seq.num_tokens - 1
        seq.draft_ids.clear()
        for event in events:
            seq.stream.push(event)
        if reason is not None:
            self.finish(seq, reason)

    def _append(self, seq: Sequence, sampled: SampledToken) -> tuple[TokenEvent, FinishReason | None]:
        """One accepted token: the completion, its text, and whether the request ends with it."""
        position = len(seq.generated)
        seq.generated.append(sampled.token_id)
        if seq.first_token_at is None:
            seq.first_token_at = time.perf_counter()
        out = seq.output.add(sampled.token_id)
        reason = out.finish_reason
        flush = False
        constraint = seq.constraint
        # The grammar is complete with this token (its last consumed one): a natural end, text flushed.
        if (
            reason is None
            and constraint is not None
            and constraint.consumed == len(seq.generated)
            and constraint.is_stopped
        ):
            reason, flush = "stop", True
        if reason is None:
            limit = seq.request.max_tokens
            if (limit is not None and len(seq.generated) >= limit) or (
                len(seq.prompt_ids) + len(seq.generated) >= self.ctx_size
            ):
                reason = "length"
        text = out.text + (seq.output.finish() if reason == "length" or flush else "")
        event = TokenEvent(
            seq.request.request_id,
            position,
            sampled.token_id,
            text,
            sampled.logprob,
            sampled.top_logprobs,
            self._steps(),
        )
        return event, reason

    def fail(self, seq: Sequence, label: str, exc: BaseException) -> None:
        """End `seq` with finish_reason "error": a message naming the step (`label`) and the tokens
        produced before it."""
        message = f"{label} failed after {len(seq.generated)} tokens: {type(exc).__name__}: {exc}"
        # a sampler or grammar error names the request setting responsible (its `parameter`)
        param = exc.parameter if isinstance(exc, (NoFiniteLogitsError, GrammarViolationError)) else None
        self.finish(seq, "error", message, param)

    def hook_allows(self, seq: Sequence, phase: str, index: int, label: str) -> bool:
        """Run the fault hook (tests) for one phase of `seq`; False (and the request ended with
        `label`) if it raises."""
        hook = self._fault_hook
        if hook is None:
            return True
        try:
            hook(seq.request.request_id, phase, index)
        except Exception as exc:
            self.fail(seq, label, exc)
            return False
        return True

    def finish(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, error_param: str | None = None
    ) -> None:
        """End `seq`'s request: free its slot and drafts, push its DoneEvent, tell the listeners."""
        self.scheduler.remove(seq)
        seq.draft_ids.clear()
        self._release_drafts(seq)
        end = time.perf_counter()
        first = seq.first_token_at
        scheduled = seq.scheduled_at
        timings = Timings(
            queue_s=(scheduled - seq.submitted_at) if scheduled else end - seq.submitted_at,
            prefill_s=(first - scheduled) if first and scheduled else 0.0,
            decode_s=(end - first) if first else 0.0,
            ttft_s=(first - seq.submitted_at) if first else 0.0,
        )
        done = DoneEvent(
            seq.request.request_id,
            reason,
            error,
            Usage(len(seq.prompt_ids), len(seq.generated), seq.cached_prompt_tokens),
            timings,
            seq.seed,
            tuple(seq.generated),
            seq.output.text,
            seq.spec_counters.as_counters() if seq.spec_counters is not None else {},
            sampled_on_device=seq.sampled_on_device,
            error_param=error_param,
        )
        # Listeners (the server's /metrics) count the request before its stream ends, so a client that
        # has read the whole answer and then scrapes /metrics always finds it counted.
        for listener in self._done_listeners:
            listener(done)
        seq.stream.push(done)


def _count_verify(item: ScheduledWork, accepted: tuple[SampledToken, ...]) -> None:
    """Record a verify's drafted and kept drafts in the sequence's counters and draft length."""
    seq = item.sequence
    drafted = len(item.tokens) - 1
    kept = 0
    while kept < min(len(accepted), drafted) and accepted[kept].token_id == item.tokens[kept + 1]:
        kept += 1
    if seq.spec_counters is not None:
        seq.spec_counters.record(drafted, kept)
    if seq.draft_length is not None:
        seq.draft_length.record(drafted, kept)
