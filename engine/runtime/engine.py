"""The Engine: submit(request) -> a stream of events, produced by one step loop for every mode.

Each step is schedule -> execute -> update, as vLLM's `EngineCore.step`: speculating sequences get
their drafts (runtime/drafting.py), the scheduler picks each sequence's tokens not yet in the KV
cache (decode tokens, drafts, prefill chunks) and the rows whose logits it needs, the executor
(runtime/executor.py) runs them as one ragged batch and draws each item's rows (drafts kept while
the draws equal them), and the updater (runtime/updater.py) advances each sequence by the accepted
tokens, sends its events and finishes the requests that end.
Greedy or sampled, alone or batched, on any backend, every request goes through here.
A step that fails ends only the requests it belongs to, with finish_reason "error", a message
naming the step, and every token produced before it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from infer.engine.grammar import Constraint, GrammarError, GrammarVocabulary
from infer.engine.models.base import Model
from infer.engine.runtime.config import EngineConfig
from infer.engine.runtime.drafting import DraftProposer
from infer.engine.runtime.events import DoneEvent
from infer.engine.runtime.executor import Executor
from infer.engine.runtime.kv_budget import KVBudget
from infer.engine.runtime.output import OutputProcessor
from infer.engine.runtime.prefix_cache import PrefixCache
from infer.engine.runtime.request import EngineBusy, Request, RequestError
from infer.engine.runtime.scheduler import ScheduledWork, Scheduler, SchedulerLimits
from infer.engine.runtime.sequence import Sequence
from infer.engine.runtime.stream import Completion, RequestStream
from infer.engine.runtime.updater import SequenceUpdater
from infer.engine.sampling import SequenceSampler
from infer.engine.speculative import AdaptiveLength, SpecCounters, load_draft_model
from infer.engine.text.tokenizer import Tokenizer


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
        self.cache = model.make_cache(config.max_num_seqs, config.ctx_size, config.kv_cache_dtype)
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
        self.drafting = DraftProposer(
            config.ctx_size,
            draft_model=draft_model,
            slots=config.max_num_seqs,
            chunk_size=config.batch_size,
            max_rows=config.max_batched_tokens,
            vocab_limit=model.vocab_size,
            kv_cache_dtype=config.kv_cache_dtype,
        )
        """The drafters of the speculative methods this engine can run, asked before each step."""
        self.executor = Executor(model, self.cache)
        """Runs each step's batch and draws its tokens."""
        self.updater = SequenceUpdater(
            self.scheduler, config.ctx_size, lambda: self.steps, self.drafting.release, config.fault_hook
        )
        """Advances the sequences by what the executor drew, emits, finishes."""
        self.steps = 0
        """Engine steps run so far."""
        self.grammar_vocabulary = GrammarVocabulary(tokenizer, model.vocab_size)
        """The model's token table for constraints: built on the first constrained request, then shared."""
        self._incoming: deque[Sequence] = deque()
        self._incoming_lock = threading.Lock()
        self._step_lock = threading.RLock()
        self._wakeup = threading.Event()
        self._thread: threading.Thread | None = None
        self._stopping = False

    @property
    def backend(self) -> object | None:
        """The model's backend (None for a model without one)."""
        return self.executor.backend

    def warm_up(self) -> None:
        """Run a throwaway decode row and two-row prefill (token 0 from position 0 of a free KV slot:
        `Executor.warm_up`), so that whatever a backend prepares on first use (the cpu backend's numba
        kernels, compiled or loaded from their cache) happens now, at load time, instead of inside the
        first request. The slot goes back at once; its next owner writes positions 0 and 1 before
        anything reads them. Inside `Backend.loading` the weights may still be placeholders: nothing
        computed here is kept."""
        with self._step_lock:
            slot = self.cache.acquire()
            if slot is None:
                return
            try:
                self.executor.warm_up(slot)
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
        if spec is not None and spec.method not in self.drafting.drafters:
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
            shown_special=request.shown_special_ids,
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
                self.updater.finish(seq, "cancelled")

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
            self.executor.prepare_step()
            self.drafting.propose(self.scheduler.running, self.updater.fail, self.updater.hook_allows)
            work = self.scheduler.schedule()
            if not work:
                return False
            self.steps += 1
            self.updater.update(self.executor.run(self._started(work)))
            return True

    def _started(self, work: list[ScheduledWork]) -> list[ScheduledWork]:
        """The items that may run: each sequence's first schedule time noted, and the items whose
        fault hook (tests) raised left out, their requests ended."""
        now = time.perf_counter()
        runnable: list[ScheduledWork] = []
        for item in work:
            seq = item.sequence
            if seq.scheduled_at is None:
                seq.scheduled_at = now
            if self.updater.hook_allows(seq, item.kind, item.index, item.label):
                runnable.append(item)
        return runnable

    def add_done_listener(self, listener: Callable[[DoneEvent], None]) -> None:
        """Call `listener` with every request's DoneEvent, on the thread that ends the request (the
        server's metrics count requests this way, whichever route or stream consumed them)."""
        self.updater.add_done_listener(listener)

    # -- background loop (server) --------------------------------------------------------------
    def _background_running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Run the step loop in a background thread (the server's mode); idempotent."""
        if self._background_running():
            return
        self._stopping = False
        self.executor.release_thread()  # this thread runs no step while the loop runs
        self._thread = threading.Thread(target=self._loop, name="infer-engine", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        self.executor.prepare_thread()
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
    threads: int | None = None,
    draft_model: Path | str | None = None,
    mmap: bool = True,
) -> Engine:
    """Load a checkpoint, build its family's model (through the model registry) on backend
    `backend_name` computing in `dtype` (`cpu_kernels` and `threads`: the backend's matmul mode and
    host threads; `mmap` False: the cpu backend copies the weights out of the file map, see
    backends.BackendOptions), wrap it in an Engine and warm it up (see
    `Engine.warm_up`); `load_seconds` includes the warm-up. With `draft_model`, load that too on the
    same backend, for speculative method draft_model (raises `DraftModelError` when its tokenizer is
    not the target's)."""
    from infer.engine.backends import create_backend
    from infer.engine.backends.kv_cache import check_kv_cache_dtype
    from infer.engine.loader import load_checkpoint
    from infer.engine.models import build_model

    started = time.perf_counter()
    # a dtype the backend lacks fails before loading
    backend = create_backend(backend_name, dtype, kernels=cpu_kernels, threads=threads, mmap=mmap)
    check_kv_cache_dtype(backend, config.kv_cache_dtype)  # so does a KV cache dtype it cannot store
    checkpoint = load_checkpoint(model_path)
    with backend.loading():  # the warm-up may run before the weights are in place: see Backend.loading
        model = build_model(checkpoint, backend)
        drafter = None
        if draft_model is not None:
            drafter = load_draft_model(draft_model, backend, checkpoint.tokenizer)
        engine = Engine(model, checkpoint.tokenizer, config, draft_model=drafter)
        engine.warm_up()
    engine.load_seconds = time.perf_counter() - started
    return engine
