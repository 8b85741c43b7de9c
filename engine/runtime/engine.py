"""The Engine: submit(request) -> a stream of events, produced by one step loop for every mode.

Each step is draft -> schedule -> execute -> sample -> advance -> emit: speculating sequences get
drafts from their method's drafter (`infer.engine.speculative`), the scheduler picks each sequence's
tokens not yet in the KV cache (decode tokens, drafts, prefill chunks) and the rows whose logits it
needs, the model runs them as one ragged batch, each item's rows are sampled (drafts kept while the
draws equal them), the sequence advances by the accepted tokens, and its events go out.
Greedy or sampled, alone or batched, on any backend, every request goes through here.
A step that fails ends only the requests it belongs to, with finish_reason "error", a message
naming the step, and every token produced before it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from infer.engine.backends.cpu_threads import KernelThreads
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.grammar import Constraint, GrammarError, GrammarViolationError, GrammarVocabulary
from infer.engine.models.base import Model
from infer.engine.runtime.device_sampling import sample_on_device
from infer.engine.runtime.events import DoneEvent, FinishReason, Timings, TokenEvent, Usage
from infer.engine.runtime.kv_budget import KVBudget
from infer.engine.runtime.output import OutputProcessor
from infer.engine.runtime.prefix_cache import PrefixCache
from infer.engine.runtime.request import EngineBusy, FaultHook, Request, RequestError
from infer.engine.runtime.scheduler import ScheduledWork, Scheduler, SchedulerLimits
from infer.engine.runtime.sequence import Sequence
from infer.engine.runtime.stream import Completion, RequestStream
from infer.engine.sampling import NoFiniteLogitsError, SampledToken, SequenceSampler
from infer.engine.speculative import (
    AdaptiveLength,
    DraftAsk,
    Drafter,
    DraftModelDrafter,
    PromptLookupDrafter,
    SpecCounters,
    load_draft_model,
)
from infer.engine.text.tokenizer import Tokenizer

ItemLogits = tuple[np.ndarray | None, list[int] | None, int, list[SampledToken | None] | None]
"""A work item's share of a forward: the batch's host logits rows [rows, vocab] (None when every row
was drawn on the device), the argmax of every row (None unless some row is plain greedy), the index
of the item's first row, and each row's draw made on the device (None: none made, or the row's)."""


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits (from the resolved settings)."""

    ctx_size: int = 4096
    """Positions per sequence (0 = the model's trained context); a prompt must be shorter, and
    generation stops with `length` at the end."""
    max_num_seqs: int = 16
    """Sequences holding a KV slot at once; more requests queue."""
    max_batched_tokens: int = 2048
    """Rows in one forward pass."""
    batch_size: int = 512
    """Largest prefill chunk of one sequence per step."""
    max_queue: int = 0
    """Requests that may wait for a KV slot at once (0 = no bound); one more is refused with
    EngineBusy, so a burst is shed instead of queueing without limit."""
    kv_cache_bytes: int = 0
    """KV memory the running sequences and kept prefixes may hold (0 = no bound beyond
    max_num_seqs x ctx_size): a sequence waits until its prompt and token limit fit."""
    prefix_caching: bool = False
    """Keep finished prompts' whole prefill chunks in the KV cache and start a request that shares
    them from there (see runtime.prefix_cache); the tokens are the same either way."""
    fault_hook: FaultHook | None = None
    """Test-only failure injection (see request.FaultHook)."""
    thread_setup: Callable[[], None] | None = None
    """Called first in the background step thread (`start`): thread-local settings of the kernels'
    libraries, such as numba's thread count, must be made in the thread that runs the steps."""
    adaptive_threads: bool = False
    """Set the cpu kernels' thread count before each step from the cores other processes keep busy
    (backends/cpu_threads.py); False leaves numba's count alone (a count the user fixed)."""


class Engine:
    """Owns the model, the KV cache and the scheduler; turns requests into event streams."""

    def __init__(
        self,
        model: Model,
        tokenizer: Tokenizer,
        config: EngineConfig,
        *,
        load_seconds: float = 0.0,
        draft_model: Model | None = None,
    ) -> None:
        if config.ctx_size <= 0:  # 0 = the context the model was trained for
            config = replace(config, ctx_size=model.config.max_position_embeddings)
        self.model = model
        self.tokenizer = tokenizer
        self.config = config
        self.load_seconds = load_seconds
        self.cache = model.make_cache(config.max_num_seqs, config.ctx_size)
        prefix_cache = None
        if config.prefix_caching:
            window = getattr(model.config, "sliding_window", None)
            prefix_cache = PrefixCache(self.cache, config.batch_size, window)
        self.kv_budget = KVBudget.for_cache(self.cache, config.kv_cache_bytes, config.ctx_size)
        self.scheduler = Scheduler(
            SchedulerLimits(config.max_num_seqs, config.max_batched_tokens, config.batch_size),
            self.cache,
            prefix_cache=prefix_cache,
            budget=self.kv_budget if self.kv_budget.bounded else None,
        )
        self.drafters: dict[str, Drafter] = {"prompt_lookup": PromptLookupDrafter()}
        """The drafter of each speculative method this engine can run (draft_model only with a
        draft model, which then has its own KV cache beside the target's)."""
        if draft_model is not None:
            self.drafters["draft_model"] = DraftModelDrafter(
                draft_model,
                slots=config.max_num_seqs,
                capacity=config.ctx_size,
                chunk_size=config.batch_size,
                max_rows=config.max_batched_tokens,
                vocab_limit=model.vocab_size,
            )
        self.steps = 0
        """Engine steps run so far."""
        backend = getattr(model, "backend", None)
        self._device_xp = (
            getattr(backend, "sampling_module", None) if hasattr(model, "forward_logits") else None
        )
        """The array module the logits are sampled on where a request is inside the envelope (a GPU
        backend's); None: every row is copied to the host and drawn there."""
        self.grammar_vocabulary = GrammarVocabulary(tokenizer, model.vocab_size)
        """The model's token table for constraints: built on the first constrained request, then shared."""
        self._incoming: deque[Sequence] = deque()
        self._incoming_lock = threading.Lock()
        self._step_lock = threading.RLock()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._done_listeners: list[Callable[[DoneEvent], None]] = []
        self.kernel_threads = KernelThreads.for_this_machine() if config.adaptive_threads else None
        """The cpu kernels' thread count, adapted to the load before each step (None: left alone)."""

    def warm_up(self) -> None:
        """Run one throwaway decode row (token 0 at position 0 of a free KV slot), so that whatever a
        backend prepares on first use (the cpu backend's numba kernels, compiled or loaded from their
        cache) happens now, at load time, instead of inside the first request. The slot goes back
        at once; its next owner writes position 0 before anything reads it."""
        with self._step_lock:
            slot = self.cache.acquire()
            if slot is None:
                return
            try:
                batch = ForwardBatch(
                    np.zeros(1, dtype=np.int64), (Segment(slot, 0, 1),), np.zeros(1, dtype=np.int64)
                )
                self.model.forward(batch, self.cache)
            finally:
                self.cache.release(slot)

    # -- submitting ----------------------------------------------------------------------------
    def validate(self, request: Request) -> None:
        """Raise RequestError when the engine could never run `request` (its grammar included)."""
        self._check_request(request)
        self._constraint(request)  # builds the model's token table once; a bad grammar fails here

    def _check_request(self, request: Request) -> None:
        """`validate` without building the grammar's matcher (submit builds it once, to keep)."""
        prompt = len(request.prompt_ids)
        if prompt >= self.config.ctx_size:
            raise RequestError(
                f"the prompt has {prompt} tokens but the context holds {self.config.ctx_size} "
                "(prompt plus at least one generated token); shorten it or raise ctx_size",
                "prompt",
            )
        budget = self.kv_budget
        need = budget.positions(prompt, request.max_tokens)
        if budget.bounded and need > budget.max_positions:
            mib = 1 << 20
            raise RequestError(
                f"the prompt and max_tokens need {need} positions of KV cache "
                f"({budget.bytes_for(need) / mib:.0f} MiB) but kv_cache_memory holds "
                f"{budget.max_positions} ({budget.budget_bytes / mib:.0f} MiB); lower max_tokens or raise it",
                "max_tokens" if request.max_tokens is not None else "prompt",
            )
        vocab = self.model.vocab_size
        bad = next((t for t in request.prompt_ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"prompt token id {bad} is outside the vocabulary (0..{vocab - 1})", "prompt")
        spec = request.spec
        if spec is not None and spec.method not in self.drafters:
            raise RequestError(
                f"spec_method {spec.method} needs a draft model loaded with the model "
                "(--model-draft / speculative.draft_model)",
                "spec_method",
            )

    @property
    def waiting_sequences(self) -> int:
        """Requests submitted and not yet holding a KV slot."""
        # Both read under the lock that the step thread holds while it moves requests from one to
        # the other, so a request in the middle of the move is counted once, not twice.
        with self._incoming_lock:
            return len(self._incoming) + len(self.scheduler.waiting)

    def submit(self, request: Request) -> RequestStream:
        """Queue a request and return its event stream (raises RequestError for an impossible one,
        EngineBusy when `max_queue` requests already wait).

        Everything that grows with the request (its grammar's matcher and first mask, the sampler
        chain, DRY's breaker tokens) is built here, in the caller's thread, before the request joins
        the step loop; a server calls this off its event loop."""
        self._check_request(request)
        constraint = self._constraint(request)
        limit = self.config.max_queue
        if limit and self.waiting_sequences >= limit:
            raise EngineBusy(f"{limit} requests are already waiting for a slot; try again shortly", 1)
        seed = request.seed  # resolved once, when the request was made
        stop_ids = () if request.ignore_eos else self.tokenizer.stop_ids
        sampler = SequenceSampler(
            request.sampling,
            seed=seed,
            vocab_size=self.model.vocab_size,
            prompt_ids=request.prompt_ids,
            token_texts=self.tokenizer.token_texts() if request.sampling.dry_multiplier > 0 else None,
            eos_ids=self.tokenizer.stop_ids,
        )
        output = OutputProcessor(
            self.tokenizer,
            stop=request.stop,
            stop_ids=stop_ids,
            skip_special=request.skip_special,
            prompt_ids=request.prompt_ids,
        )
        stream = RequestStream(request.request_id, self.step, self._background_running, self.reap_cancelled)
        sequence = Sequence(request, stream, sampler, output, seed, constraint=constraint)
        if sequence.constraint is not None:  # drafts the grammar forbids are cut before scheduling
            sequence.draft_filter = sequence.constraint.allowed_drafts
        if request.spec is not None:
            spec = request.spec
            sequence.draft_length = AdaptiveLength(spec.num_tokens, max(spec.draft_min, 1), spec.adaptive)
            sequence.spec_counters = SpecCounters()
        with self._incoming_lock:
            self._incoming.append(sequence)
        self._wakeup.set()
        return stream

    def _constraint(self, request: Request) -> Constraint | None:
        """The request's grammar matcher at its start state, or None (RequestError if unbuildable)."""
        spec = request.grammar
        if spec is None:
            return None
        try:
            return Constraint(spec, self.grammar_vocabulary)
        except (GrammarError, RuntimeError) as exc:
            raise RequestError(str(exc), getattr(exc, "parameter", None) or "grammar") from exc

    def generate(self, request: Request) -> Completion:
        """Submit and wait for the whole completion."""
        return self.submit(request).result()

    # -- the step loop -------------------------------------------------------------------------
    @property
    def active_sequences(self) -> int:
        """Sequences queued or holding a KV slot (0 when idle)."""
        # Under the lock, as waiting_sequences; `waiting` is read before `running`, so a sequence
        # admitted from one to the other between the reads is counted twice rather than missed.
        with self._incoming_lock:
            return len(self._incoming) + len(self.scheduler.waiting) + len(self.scheduler.running)

    def _admit_and_reap(self) -> None:
        """Move submitted requests to the scheduler and end cancelled ones (step lock held)."""
        with self._incoming_lock:
            while self._incoming:
                self.scheduler.add(self._incoming.popleft())
        for seq in [*self.scheduler.running, *self.scheduler.waiting]:
            if seq.stream.cancel_requested:
                self._finish(seq, "cancelled")

    def reap_cancelled(self) -> None:
        """Free the slots of cancelled requests now, unless a step is running (it reaps them itself)."""
        if self._step_lock.acquire(blocking=False):
            try:
                self._admit_and_reap()
            finally:
                self._step_lock.release()

    def step(self, skip_if: Callable[[], bool] | None = None) -> bool:
        """Run one engine step; False when there was nothing to do.

        `skip_if` is checked under the step lock: a pull-mode consumer whose next event arrived while
        it waited for the lock skips the step, so no token is computed before it is consumed.
        """
        with self._step_lock:
            if skip_if is not None and skip_if():
                return True
            self._admit_and_reap()
            if self.kernel_threads is not None:
                self.kernel_threads.before_step()
            self._propose_drafts()
            work = self.scheduler.schedule()
            if not work:
                return False
            self.steps += 1
            now = time.perf_counter()
            runnable: list[ScheduledWork] = []
            for item in work:
                seq = item.sequence
                if seq.scheduled_at is None:
                    seq.scheduled_at = now
                if self._run_fault_hook(item):
                    runnable.append(item)
            logits = self._execute(runnable)
            for item in runnable:
                if not item.sequence.is_finished:
                    self._complete(item, logits.get(id(item.sequence)))
            return True

    # -- drafting ------------------------------------------------------------------------------
    def _propose_drafts(self) -> None:
        """Give every speculating sequence that is generating its drafts for this step: one
        `propose` call per method for all of them, then the sequence's draft filter and the
        request's draft_min. A drafter that fails ends only the sequences it fails for."""
        groups: dict[str, list[tuple[Sequence, DraftAsk]]] = {}
        for seq in self.scheduler.running:
            spec, length = seq.request.spec, seq.draft_length
            if spec is None or length is None or seq.in_prefill or seq.is_finished:
                continue
            seq.draft_ids = []  # drafts left from a step that did not schedule the sequence: ask again
            k = min(length.next_length(), self._draft_room(seq))
            if k <= 0 or not self._hook_allows(seq, "draft", len(seq.generated)):
                continue
            groups.setdefault(spec.method, []).append((seq, DraftAsk(id(seq), seq.token_ids, k, spec)))
        for method, group in groups.items():
            for seq, drafts in self._ask_drafter(self.drafters[method], group):
                if seq.draft_filter is not None and drafts:
                    kept = list(seq.draft_filter(drafts))
                    if kept != drafts[: len(kept)]:
                        problem = ValueError("the draft filter returned no prefix of its drafts")
                        self._fail(seq, self._draft_label(seq), problem)
                        continue
                    drafts = kept
                assert seq.request.spec is not None
                seq.draft_ids = drafts if len(drafts) >= seq.request.spec.draft_min else []

    def _ask_drafter(
        self, drafter: Drafter, group: list[tuple[Sequence, DraftAsk]]
    ) -> list[tuple[Sequence, list[int]]]:
        """The drafts of every sequence of `group`, asked all at once; if that fails, each alone, so
        only a sequence whose own drafting fails is ended."""
        try:
            return list(zip([s for s, _ in group], drafter.propose([a for _, a in group]), strict=True))
        except Exception as exc:
            if len(group) == 1:
                self._fail(group[0][0], self._draft_label(group[0][0]), exc)
                return []
        answers: list[tuple[Sequence, list[int]]] = []
        for seq, ask in group:
            try:
                answers.append((seq, drafter.propose([ask])[0]))
            except Exception as exc:
                self._fail(seq, self._draft_label(seq), exc)
        return answers

    @staticmethod
    def _draft_label(seq: Sequence) -> str:
        return f"drafting for decode step {len(seq.generated)}"

    def _draft_room(self, seq: Sequence) -> int:
        """Drafts that can still matter: a verify emits up to k + 1 tokens, within max_tokens and
        the context."""
        room = self.config.ctx_size - seq.num_tokens - 1
        limit = seq.request.max_tokens
        if limit is not None:
            room = min(room, limit - len(seq.generated) - 1)
        return room

    def _hook_allows(self, seq: Sequence, phase: str, index: int) -> bool:
        """Run the fault hook (tests) for one phase of `seq`; False (and the request ended) if it raises."""
        hook = self.config.fault_hook
        if hook is None:
            return True
        try:
            hook(seq.request.request_id, phase, index)
        except Exception as exc:
            self._fail(seq, self._draft_label(seq) if phase == "draft" else f"{phase} step {index}", exc)
            return False
        return True

    def _run_fault_hook(self, item: ScheduledWork) -> bool:
        hook = self.config.fault_hook
        if hook is None:
            return True
        try:
            hook(item.sequence.request.request_id, item.kind, item.index)
        except Exception as exc:
            self._fail(item.sequence, item.label, exc)
            return False
        return True

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
        if self._device_xp is None:
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
        backend = self.model.backend  # type: ignore[attr-defined]
        eligible = [
            i for i, (seq, _) in enumerate(owners) if seq.constraint is None and not seq.sampler.plain_greedy
        ]
        draws: list[SampledToken | None] = [None] * len(owners)
        if eligible:
            rows = device_logits
            if len(eligible) < len(owners):
                rows = device_logits[backend.asarray(np.asarray(eligible, dtype=np.int32))]  # type: ignore[index]
            found = sample_on_device(
                self._device_xp,
                rows,
                [owners[i][0].sampler for i in eligible],
                [owners[i][1] for i in eligible],
                backend.to_host,
            )
            for i, draw in zip(eligible, found, strict=True):
                draws[i] = draw
        host = backend.to_host(device_logits) if any(d is None for d in draws) else None
        return host, draws

    def _execute(self, work: list[ScheduledWork]) -> dict[int, ItemLogits]:
        """One forward for the whole batch; if it fails, rerun each sequence alone so only the
        sequence whose step really fails is ended (each rerun rewrites the same cache positions)."""
        if not work:
            return {}
        try:
            return self._forward(work)
        except Exception as exc:
            if len(work) == 1:
                self._fail(work[0].sequence, work[0].label, exc)
                return {}
        logits: dict[int, ItemLogits] = {}
        for item in work:
            try:
                logits |= self._forward([item])
            except Exception as exc:
                self._fail(item.sequence, item.label, exc)
        return logits

    def _complete(self, item: ScheduledWork, logits: ItemLogits | None) -> None:
        """After the forward: sample the item's logits rows, advance the sequence by what was
        accepted, and end it if a draw failed."""
        seq = item.sequence
        if not item.logit_rows:  # a prefill chunk short of the prompt's end: only the cache moved
            seq.num_computed_tokens = item.start + len(item.tokens)
            return
        assert logits is not None
        accepted, error = self._sample(item, logits)
        if item.kind == "verify":
            self._count_verify(item, accepted)
        if accepted:
            self.advance(seq, accepted)
        if error is not None and not seq.is_finished:
            stage = "grammar" if isinstance(error, GrammarViolationError) else "sampling"
            self._fail(seq, f"decode step {len(seq.generated)} ({stage})", error)

    @staticmethod
    def _count_verify(item: ScheduledWork, accepted: list[SampledToken]) -> None:
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
                    sampled = Engine._draw(seq, block[i], position + j, None if argmax is None else argmax[i])
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

    @staticmethod
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

    def advance(self, seq: Sequence, accepted: Iterable[SampledToken]) -> None:
        """Move `seq` forward by the tokens accepted for its last work item (one per step today;
        several once drafts are verified), in order.

        Each token is appended and emitted as its own TokenEvent; stop tokens, stop strings,
        max_tokens and the context end are checked after each one, and once the request finishes
        the rest are dropped. The position counter then ends at the last kept token's position:
        every token before it is in the KV cache (its own, the prompt's, the accepted drafts'),
        and cache entries past it (rejected drafts) are simply overwritten by later steps. The
        sampler has already recorded the tokens (the sampling step does, as it draws them).
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
        self._emit(seq, events, reason)

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
                len(seq.prompt_ids) + len(seq.generated) >= self.config.ctx_size
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
            self.steps,
        )
        return event, reason

    def _emit(self, seq: Sequence, events: list[TokenEvent], reason: FinishReason | None) -> None:
        """Push the step's token events in order, then end the request if one of them finished it."""
        for event in events:
            seq.stream.push(event)
        if reason is not None:
            self._finish(seq, reason)

    def _fail(self, seq: Sequence, label: str, exc: BaseException) -> None:
        message = f"{label} failed after {len(seq.generated)} tokens: {type(exc).__name__}: {exc}"
        # a sampler or grammar error names the request setting responsible (its `parameter`)
        param = exc.parameter if isinstance(exc, (NoFiniteLogitsError, GrammarViolationError)) else None
        self._finish(seq, "error", message, param)

    def _finish(
        self, seq: Sequence, reason: FinishReason, error: str | None = None, error_param: str | None = None
    ) -> None:
        self.scheduler.remove(seq)
        seq.draft_ids.clear()
        if seq.request.spec is not None and seq.request.spec.method in self.drafters:
            self.drafters[seq.request.spec.method].release(id(seq))
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
        seq.stream.push(done)
        for listener in self._done_listeners:
            listener(done)

    def add_done_listener(self, listener: Callable[[DoneEvent], None]) -> None:
        """Call `listener` with every request's DoneEvent, on the thread that ends the request (the
        server's metrics count requests this way, whichever route or stream consumed them)."""
        self._done_listeners.append(listener)

    # -- background loop (server) --------------------------------------------------------------
    def _background_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run the step loop in a background thread (the server's mode); idempotent."""
        if self._background_running():
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="infer-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        if self.config.thread_setup is not None:
            self.config.thread_setup()
        while not self._stopping:
            if not self.step():
                self._wakeup.wait(0.05)
                self._wakeup.clear()

    def shutdown(self, *, cancel: bool = True, timeout: float = 30.0) -> None:
        """Stop the background loop, cancelling (or first finishing) every request in flight."""
        if cancel:
            for seq in [*self.scheduler.running, *self.scheduler.waiting, *list(self._incoming)]:
                seq.stream.cancel()
        deadline = time.monotonic() + timeout
        while self.active_sequences and time.monotonic() < deadline and self._background_running():
            time.sleep(0.01)
        self._stopping = True
        self._wakeup.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None


def load_engine(
    model_path: Path | str,
    config: EngineConfig,
    backend_name: str = "cpu",
    dtype: str = "float32",
    *,
    cpu_kernels: str = "blas",
    draft_model: Path | str | None = None,
) -> Engine:
    """Load a checkpoint, build its family's model (through the model registry) on backend
    `backend_name` computing in `dtype` (the cpu backend multiplying in `cpu_kernels` mode), wrap
    it in an Engine and warm it up (see `Engine.warm_up`); `load_seconds` includes the warm-up. With
    `draft_model`, load that too on the same backend, for speculative method draft_model (raises
    `DraftModelError` when its tokenizer is not the target's)."""
    from infer.engine.backends import create_backend
    from infer.engine.loader import load_checkpoint
    from infer.engine.models import build_model

    started = time.perf_counter()
    backend = create_backend(
        backend_name, dtype, cpu_kernels=cpu_kernels
    )  # a dtype the backend lacks fails before loading
    checkpoint = load_checkpoint(model_path)
    model = build_model(checkpoint, backend)
    drafter = None if draft_model is None else load_draft_model(draft_model, backend, checkpoint.tokenizer)
    engine = Engine(model, checkpoint.tokenizer, config, draft_model=drafter)
    engine.warm_up()
    engine.load_seconds = time.perf_counter() - started
    return engine
