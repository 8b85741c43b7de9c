"""Issue 5 acceptance: one event path for every mode, honest failure, stop strings, cancellation.

Everything goes through the public API: `load_engine`, `Engine.submit`, the `RequestStream` it
returns (sync and async iteration), `EngineConfig.fault_hook`, and the events. Most tests run on the
tiny synthetic model (tests/synthetic.py); the multi-byte detokenizer test needs real text.

How "each token is delivered before the next is computed" is proven:
* pull mode (no background loop): the consumer's own `next()` drives the step loop, so when it
  receives a TokenEvent made at step s, `engine.steps` must still be s;
* background loop (thread or asyncio consumers): the fault hook holds decode step n until the
  consumer has received token n-1; an engine that buffered events would never release the hold and
  the held step fails after GATE_TIMEOUT_S with an error naming it.
"""

from __future__ import annotations

import asyncio
import math
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from infer.engine.backends.probe import BACKENDS, probe_backend, select_backend
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.engine.runtime.request import Request
from infer.engine.runtime.stream import RequestStream
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

N_TOKENS = 8
GATE_TIMEOUT_S = 10.0
GREEDY = SamplingParams(temperature=0.0)
SEEDS = (11, 12, 13, 14)
PROMPTS = ("hello the world is", "the sea and a haiku", "is it", "a")
"""Different lengths on purpose: with batch_size 4, their prefills take 1 to 3 chunks (ragged batches)."""
SAME_LENGTH_PROMPTS = ("the sea and", "is it on", "a haiku is", "the world is")
"""Cut to the same token count (`same_length`), so in pull mode all four produce their tokens in the
same steps."""


def sampled(seed: int) -> SamplingParams:
    """Temperature 1 with the default sampler chain, reporting logprobs: must not reproduce greedy."""
    return SamplingParams(temperature=1.0, seed=seed, logprobs=True)


# ---- the fault hook: injected failures and the streaming gate ------------------------------------


@dataclass
class Faults:
    """The engine's fault hook. `fail_at[request_id] = (phase, index)` makes that step raise;
    `gate(request_id)` holds each decode step n of that request until `received(request_id)` was
    called n times (the consumer got token n-1)."""

    fail_at: dict[str, tuple[str, int]] = field(default_factory=dict)
    calls: list[tuple[str, str, int]] = field(default_factory=list)
    _gated: dict[str, int] = field(default_factory=dict)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def __call__(self, request_id: str, phase: str, index: int) -> None:
        self.calls.append((request_id, phase, index))
        if self.fail_at.get(request_id) == (phase, index):
            raise RuntimeError(f"injected fault at {phase} {index}")
        if phase == "decode" and request_id in self._gated:
            with self._cond:
                if not self._cond.wait_for(lambda: self._gated[request_id] >= index, GATE_TIMEOUT_S):
                    raise RuntimeError(
                        f"decode step {index} was about to run before the consumer received token {index - 1}"
                    )

    def gate(self, request_id: str) -> None:
        with self._cond:
            self._gated[request_id] = 0

    def received(self, request_id: str) -> None:
        with self._cond:
            self._gated[request_id] += 1
            self._cond.notify_all()

    def steps_of(self, request_id: str) -> list[tuple[str, int]]:
        return [(phase, index) for rid, phase, index in self.calls if rid == request_id]


@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults()


def unavailable_backend() -> str | None:
    """A backend whose probe fails on this machine (cuda or metal), or None."""
    return next((b for b in BACKENDS if b != "cpu" and probe_backend(b) is not None), None)


def make_config(faults: Faults) -> EngineConfig:
    return EngineConfig(ctx_size=160, max_num_seqs=4, max_batched_tokens=64, batch_size=4, fault_hook=faults)


@pytest.fixture(scope="module")
def engines(tiny_gguf: Path, faults: Faults) -> dict[str, Engine]:
    """{"cpu": the cpu backend, "fallback": the engine built from an unavailable backend's choice}."""
    result = {"cpu": load_engine(tiny_gguf, make_config(faults), "cpu")}
    missing = unavailable_backend()
    if missing is not None:
        choice = select_backend(missing, strict=False)
        assert choice.selected == "cpu" and choice.reason, choice
        result["fallback"] = load_engine(tiny_gguf, make_config(faults), choice.selected)
    if probe_backend("metal") is None:  # MLX (Metal, or its Linux CPU build) runs the same matrix
        result["metal"] = load_engine(tiny_gguf, make_config(faults), "metal")
    return result


@pytest.fixture
def cpu_engine(engines: dict[str, Engine]) -> Iterator[Engine]:
    engine = engines["cpu"]
    yield engine
    assert_idle(engine)


def engine_for(engines: dict[str, Engine], backend: str) -> Engine:
    if backend not in engines:
        pytest.skip(f"no {backend} engine here (every backend is available, or mlx is not installed)")
    return engines[backend]


def assert_idle(engine: Engine) -> None:
    assert engine.active_sequences == 0
    assert engine.cache.free_slots == engine.cache.num_slots


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(text, add_bos=False))


def same_length(engine: Engine, count: int) -> list[tuple[int, ...]]:
    """`count` different prompts of exactly 4 tokens (one prefill chunk each)."""
    prompts = [ids(engine, t)[:4] for t in SAME_LENGTH_PROMPTS[:count]]
    assert all(len(p) == 4 for p in prompts) and len(set(prompts)) == count, prompts
    return prompts


# ---- consumers -----------------------------------------------------------------------------------


@dataclass
class Run:
    request: Request
    events: list = field(default_factory=list)
    engine_steps_at_receipt: list[int] = field(default_factory=list)

    @property
    def tokens(self) -> list[TokenEvent]:
        return [e for e in self.events if isinstance(e, TokenEvent)]

    @property
    def done(self) -> DoneEvent:
        assert isinstance(self.events[-1], DoneEvent), self.events[-1:]
        return self.events[-1]

    @property
    def text(self) -> str:
        return "".join(t.text for t in self.tokens)


def consume_pull(engine: Engine, requests: list[Request], *, strict: bool = True) -> list[Run]:
    """No background loop: one thread interleaves `next()` over the streams (each call may drive
    steps). With `strict`, every TokenEvent must arrive while `engine.steps` is still its step."""
    assert engine._thread is None
    runs = [Run(r) for r in requests]
    iterators = [iter(engine.submit(r)) for r in requests]
    live = list(range(len(runs)))
    while live:
        for i in list(live):
            event = next(iterators[i])
            runs[i].events.append(event)
            runs[i].engine_steps_at_receipt.append(engine.steps)
            if isinstance(event, TokenEvent) and strict:
                assert event.step == engine.steps, (
                    f"token {event.index} of step {event.step} reached the consumer only at step "
                    f"{engine.steps}: the engine ran ahead of the consumer"
                )
            if isinstance(event, DoneEvent):
                live.remove(i)
                with pytest.raises(StopIteration):  # nothing after the DoneEvent
                    next(iterators[i])
    return runs


def consume_threads(engine: Engine, requests: list[Request], faults: Faults) -> list[Run]:
    """Background loop; one consumer thread per stream; decode steps gated on receipt."""
    runs = [Run(r) for r in requests]
    for r in requests:
        faults.gate(r.request_id)
    engine.start()
    try:
        streams = [engine.submit(r) for r in requests]

        def consume(run: Run, stream: RequestStream) -> None:
            for event in stream:
                run.events.append(event)
                if isinstance(event, TokenEvent):
                    faults.received(run.request.request_id)

        threads = [
            threading.Thread(target=consume, args=(run, s)) for run, s in zip(runs, streams, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive(), "a consumer never got its DoneEvent"
    finally:
        engine.shutdown()
    return runs


def consume_async(engine: Engine, requests: list[Request], faults: Faults) -> list[Run]:
    """Background loop; `async for` over every stream in one event loop; decode steps gated."""
    runs = [Run(r) for r in requests]
    for r in requests:
        faults.gate(r.request_id)
    engine.start()

    async def consume(run: Run) -> None:
        async for event in engine.submit(run.request):
            run.events.append(event)
            if isinstance(event, TokenEvent):
                faults.received(run.request.request_id)

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(consume(run) for run in runs)), timeout=60)

    try:
        asyncio.run(main())
    finally:
        engine.shutdown()
    return runs


def check_stream(run: Run, engine: Engine, *, finish: str = "length") -> None:
    """The invariants of every event stream, whatever the mode."""
    request = run.request
    dones = [e for e in run.events if isinstance(e, DoneEvent)]
    assert len(dones) == 1 and run.events[-1] is dones[0], "exactly one DoneEvent, and it comes last"
    done, tokens = run.done, run.tokens
    assert done.finish_reason == finish, done.error
    if finish != "error":
        assert done.error is None
    assert done.request_id == request.request_id
    assert all(t.request_id == request.request_id for t in tokens)
    assert [t.index for t in tokens] == list(range(len(tokens))), "tokens out of order"
    steps = [t.step for t in tokens]
    assert steps == sorted(set(steps)), f"one token per step, in step order: {steps}"
    assert tuple(t.token_id for t in tokens) == done.token_ids
    assert done.usage.completion_tokens == len(tokens)
    assert done.usage.prompt_tokens == len(request.prompt_ids)
    assert run.text == done.text, "concatenated deltas must equal the final text"
    if request.sampling.seed is not None:
        assert done.seed == request.sampling.seed
    for t in tokens:
        if request.sampling.logprobs:
            assert t.logprob is not None and math.isfinite(t.logprob) and t.logprob <= 0.0
        else:
            assert t.logprob is None, "a logprob nobody asked for (a log-softmax per token wasted)"
    # The detokenizer through the engine: text only in whole characters (no U+FFFD of its own).
    if not request.stop:
        decoded = engine.tokenizer.decode(done.token_ids, skip_special=request.skip_special)
        assert done.text == decoded
        if "\ufffd" not in decoded:
            assert not any("\ufffd" in t.text for t in tokens)


ALONE: dict[tuple, tuple[int, ...]] = {}


def alone(engine: Engine, prompt: tuple[int, ...], params: SamplingParams) -> tuple[int, ...]:
    """Token ids of the request run by itself (pull mode), memoised per engine."""
    key = (id(engine), prompt, params)
    if key not in ALONE:
        (run,) = consume_pull(engine, [Request(prompt, params, max_tokens=N_TOKENS, ignore_eos=True)])
        check_stream(run, engine)
        ALONE[key] = run.done.token_ids
    return ALONE[key]


# ---- 1. the mode matrix --------------------------------------------------------------------------

CONSUMERS: dict[str, Callable[..., list[Run]]] = {
    "pull": lambda engine, requests, faults: consume_pull(engine, requests),
    "thread": consume_threads,
    "async": consume_async,
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("concurrency", [1, 4])
@pytest.mark.parametrize("mode", ["greedy", "sampled"])
@pytest.mark.parametrize("backend", ["cpu", "fallback", "metal"])
def test_mode_matrix(
    engines: dict[str, Engine], faults: Faults, backend: str, mode: str, concurrency: int, consumer: str
) -> None:
    engine = engine_for(engines, backend)
    if consumer == "pull":
        prompts = same_length(engine, concurrency)
    else:
        prompts = [ids(engine, t) for t in PROMPTS[:concurrency]]
    params = [GREEDY if mode == "greedy" else sampled(SEEDS[i]) for i in range(concurrency)]
    requests = [
        Request(p, s, max_tokens=N_TOKENS, ignore_eos=True) for p, s in zip(prompts, params, strict=True)
    ]

    runs = CONSUMERS[consumer](engine, requests, faults)

    assert_idle(engine)
    for run in runs:
        check_stream(run, engine)
        assert len(run.tokens) == N_TOKENS
        prompt, params_ = run.request.prompt_ids, run.request.sampling
        # Alone or in the batch of 4, pulled or pushed: the same tokens.
        assert run.done.token_ids == alone(engine, prompt, params_)
        # The fallback samples exactly like the primary cpu path.
        assert run.done.token_ids == alone(engines["cpu"], prompt, params_)
        if mode == "sampled":  # the classic bug: a path that ignores the sampling settings
            assert run.done.token_ids != alone(engine, prompt, GREEDY), "sampled run reproduced greedy"


@pytest.mark.parametrize("backend", ["cpu", "fallback", "metal"])
def test_sampling_differs_from_greedy_across_seeds(engines: dict[str, Engine], backend: str) -> None:
    engine = engine_for(engines, backend)
    prompt = ids(engine, PROMPTS[0])
    greedy = alone(engine, prompt, GREEDY)
    runs = {seed: alone(engine, prompt, sampled(seed)) for seed in (1, 2, 3)}
    assert all(tokens != greedy for tokens in runs.values()), "temperature 1 gave the greedy tokens"
    assert len(set(runs.values())) == 3, "different seeds gave identical samples"
    # Repeatable: the same seed again, on a fresh request, gives the same tokens.
    (again,) = consume_pull(engine, [Request(prompt, sampled(2), max_tokens=N_TOKENS, ignore_eos=True)])
    assert again.done.token_ids == runs[2]


def test_pull_mode_with_consumer_threads(cpu_engine: Engine) -> None:
    """Pull mode, one thread per stream: every token reaches its consumer before the engine
    computes the next step."""
    engine = cpu_engine
    requests = [Request(p, GREEDY, max_tokens=N_TOKENS, ignore_eos=True) for p in same_length(engine, 4)]
    runs = [Run(r) for r in requests]
    streams = [engine.submit(r) for r in requests]
    barrier = threading.Barrier(len(runs))

    def consume(run: Run, stream: RequestStream) -> None:
        for event in stream:
            run.events.append(event)
            run.engine_steps_at_receipt.append(engine.steps)
            if isinstance(event, TokenEvent):
                barrier.wait(timeout=30)  # round-robin: nobody asks for token n+1 before all got n

    threads = [threading.Thread(target=consume, args=(run, s)) for run, s in zip(runs, streams, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert_idle(engine)
    for run in runs:
        check_stream(run, engine)
        received = [
            (e.step, at)
            for e, at in zip(run.events, run.engine_steps_at_receipt, strict=True)
            if e in run.tokens
        ]
        assert all(step == at for step, at in received), f"(token step, engine.steps at receipt): {received}"
        assert run.done.token_ids == alone(engine, run.request.prompt_ids, GREEDY)


# ---- 2. failures ---------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["cpu", "fallback"])
def test_decode_step_failure_keeps_tokens_and_spares_the_batch(
    engines: dict[str, Engine], faults: Faults, backend: str
) -> None:
    engine = engine_for(engines, backend)
    requests = [Request(ids(engine, t), GREEDY, max_tokens=N_TOKENS, ignore_eos=True) for t in PROMPTS[:3]]
    victim = requests[1]
    faults.fail_at[victim.request_id] = ("decode", 5)

    runs = consume_pull(engine, requests, strict=False)

    assert_idle(engine)
    failed = runs[1]
    check_stream(failed, engine, finish="error")
    assert re.search(r"\bdecode step 5\b", failed.done.error), failed.done.error
    assert "after 5 tokens" in failed.done.error and "injected fault" in failed.done.error
    assert len(failed.tokens) == 5 and failed.done.usage.completion_tokens == 5
    assert failed.done.token_ids == alone(engine, victim.prompt_ids, GREEDY)[:5]
    assert ("decode", 5) in faults.steps_of(victim.request_id)
    for run in (runs[0], runs[2]):
        check_stream(run, engine)
        assert run.done.token_ids == alone(engine, run.request.prompt_ids, GREEDY)


@pytest.mark.parametrize("chunk", [0, 1])
def test_prefill_chunk_failure(cpu_engine: Engine, faults: Faults, chunk: int) -> None:
    engine = cpu_engine
    prompt = ids(engine, PROMPTS[0])
    assert len(prompt) > engine.config.batch_size, "the prompt needs two prefill chunks"
    victim = Request(prompt, GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    bystander = Request(ids(engine, PROMPTS[1]), GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    faults.fail_at[victim.request_id] = ("prefill", chunk)

    failed, ok = consume_pull(engine, [victim, bystander], strict=False)

    check_stream(failed, engine, finish="error")
    assert re.search(rf"\bprefill chunk {chunk}\b", failed.done.error), failed.done.error
    assert "after 0 tokens" in failed.done.error
    assert failed.tokens == [] and failed.done.token_ids == () and failed.done.text == ""
    check_stream(ok, engine)
    assert ok.done.token_ids == alone(engine, bystander.prompt_ids, GREEDY)
    # The engine keeps serving: the same request again succeeds.
    assert alone(engine, prompt, GREEDY)


def test_no_finite_logits_is_an_error_not_a_crash(cpu_engine: Engine) -> None:
    """Every token banned by logit_bias: that request fails with an error naming its step."""
    engine = cpu_engine
    vocab = engine.model.vocab_size
    banned = SamplingParams(temperature=0.0, logit_bias={t: -math.inf for t in range(vocab)})
    sampled_banned = SamplingParams(temperature=1.0, seed=5, logit_bias={t: -math.inf for t in range(vocab)})
    requests = [
        Request(ids(engine, PROMPTS[0]), banned, max_tokens=N_TOKENS),
        Request(ids(engine, PROMPTS[1]), GREEDY, max_tokens=N_TOKENS, ignore_eos=True),
        Request(ids(engine, PROMPTS[2]), sampled_banned, max_tokens=N_TOKENS),
    ]
    greedy_fail, ok, sampled_fail = consume_pull(engine, requests, strict=False)
    for failed in (greedy_fail, sampled_fail):
        check_stream(failed, engine, finish="error")
        assert failed.done.token_ids == ()
        assert re.search(r"\bdecode step 0\b", failed.done.error), failed.done.error
        assert "after 0 tokens" in failed.done.error and "-inf" in failed.done.error
    check_stream(ok, engine)
    assert ok.done.token_ids == alone(engine, ok.request.prompt_ids, GREEDY)


def test_greedy_rows_with_and_without_logprobs_share_a_batch(cpu_engine: Engine) -> None:
    """Plain greedy rows take the batch-wide argmax, rows asking for logprobs the full sampler: the
    same tokens either way, and a logprob only where one was asked for (the greedy token's logprob
    is the row's largest)."""
    engine = cpu_engine
    with_logprobs = SamplingParams(temperature=0.0, logprobs=True)
    prompts = same_length(engine, 4)
    params = [GREEDY, with_logprobs, GREEDY, with_logprobs]
    requests = [
        Request(p, s, max_tokens=N_TOKENS, ignore_eos=True) for p, s in zip(prompts, params, strict=True)
    ]
    runs = consume_pull(engine, requests)
    for run in runs:
        check_stream(run, engine)
        assert run.done.token_ids == alone(engine, run.request.prompt_ids, GREEDY)
        if run.request.sampling.logprobs:  # the argmax has at least the uniform share, 1 / vocab
            floor = -math.log(engine.model.vocab_size) - 1e-6
            assert all(floor <= t.logprob <= 0.0 for t in run.tokens)


def test_nan_logits_end_only_their_request(cpu_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A NaN row through the batch-wide argmax (which lands on the NaN) is still the sampler's error,
    naming the step; the plain greedy request beside it is untouched."""
    engine = cpu_engine
    prompts = same_length(engine, 2)
    poisoned = Request(prompts[0], GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    healthy = Request(prompts[1], GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    forward = engine.model.forward

    def poisoning_forward(batch, cache):  # type: ignore[no-untyped-def]
        logits = forward(batch, cache)
        slots = [seg.slot for seg in batch.segments]
        for seq in engine.scheduler.running:
            if seq.request.request_id == poisoned.request_id and len(seq.generated) == 2:
                logits[slots.index(seq.slot), 7] = np.nan
        return logits

    monkeypatch.setattr(engine.model, "forward", poisoning_forward)
    bad, good = consume_pull(engine, [poisoned, healthy], strict=False)
    check_stream(bad, engine, finish="error")
    assert len(bad.done.token_ids) == 2
    assert re.search(r"\bdecode step 2\b.*NaN", bad.done.error), bad.done.error
    check_stream(good, engine)
    assert good.done.token_ids == alone(engine, healthy.prompt_ids, GREEDY)


# ---- 3. the detokenizer through the engine -------------------------------------------------------


def test_multibyte_characters_split_across_tokens(cpu_engine: Engine) -> None:
    """Only the two bytes of "é" (C3 A9) and "e" may be sampled, one byte token each: characters
    arrive split across tokens, and each must appear whole, once its last byte is in."""
    engine = cpu_engine
    tok = engine.tokenizer
    allowed = {tok.encode(ch, add_bos=False)[0] for ch in "e"}
    byte_ids = {t for t in range(engine.model.vocab_size) if tok.token_bytes(t) in (b"\xc3", b"\xa9")}
    assert len(byte_ids) == 2
    allowed |= byte_ids
    bias = {t: -math.inf for t in range(engine.model.vocab_size) if t not in allowed}
    split_seen = whole_seen = False
    for seed in range(6):
        params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=seed, logit_bias=bias)
        (run,) = consume_pull(engine, [Request(ids(engine, "hello"), params, max_tokens=16)])
        check_stream(run, engine)  # deltas == decode(ids); no U+FFFD unless the bytes are invalid
        raw = [tok.token_bytes(t.token_id) for t in run.tokens]
        for i in range(1, len(raw)):
            if raw[i - 1 : i + 1] == [b"\xc3", b"\xa9"]:
                split_seen = True
                lead = run.tokens[i - 1].text
                # The lead byte shows nothing of é (at most the U+FFFD of an earlier, orphaned C3).
                assert lead == ("\ufffd" if i >= 2 and raw[i - 2] == b"\xc3" else ""), lead
                assert run.tokens[i].text == "é"
        whole_seen |= "é" in run.done.text
    assert split_seen and whole_seen, "the random draws never produced a split é: pick other seeds"


@pytest.mark.real_model
def test_multibyte_real_text_streams_whole_characters(default_model_path: Path) -> None:
    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=1))
    prompt = tuple(engine.tokenizer.encode("日本語の文: 東京は日本の首都です。大阪は日本の", add_bos=False))
    (run,) = consume_pull(engine, [Request(prompt, GREEDY, max_tokens=12, ignore_eos=True)])
    check_stream(run, engine)
    tokens = run.tokens
    assert any(not t.text for t in tokens), "no character was split across tokens: choose another prompt"
    assert any(ord(ch) > 0x7FF for ch in run.done.text), run.done.text
    # U+FFFD only as the flush of a character cut off by max_tokens, at the very end.
    assert "\ufffd" not in run.done.text.rstrip("\ufffd"), run.done.text
    assert all("\ufffd" not in t.text for t in tokens[:-1])
    for t in tokens:
        t.text.encode("utf-8")  # whole code points only (no lone surrogates)


# ---- 4. stop strings -----------------------------------------------------------------------------


def greedy_run(engine: Engine, max_tokens: int, stop: tuple[str, ...] = ()) -> Run:
    request = Request(ids(engine, PROMPTS[0]), GREEDY, max_tokens=max_tokens, stop=stop, ignore_eos=True)
    (run,) = consume_pull(engine, [request])
    return run


def spanning_stop(run: Run) -> tuple[str, int, int]:
    """(stop string, index of the token completing it, offset in the text) for a 2-character string
    made of the last character of token k and the first of token k+1, whose first occurrence in the
    text is exactly there, so it truly spans two tokens. Prefers printable ASCII."""
    text = run.text
    candidates = []
    offset = 0
    tokens = run.tokens
    for k in range(len(tokens) - 1):
        offset += len(tokens[k].text)
        left, right = tokens[k].text, tokens[k + 1].text
        if not left or not right:
            continue
        stop = left[-1] + right[0]
        if text.find(stop) == offset - 1:
            candidates.append((not stop.isascii() or not stop.isprintable(), stop, k + 1, offset - 1))
    assert candidates, f"no token boundary to split a stop string over in {text!r}"
    _, stop, completing, at = min(candidates)
    return stop, completing, at


def test_stop_string_spanning_two_tokens_never_leaks(cpu_engine: Engine) -> None:
    engine = cpu_engine
    reference = greedy_run(engine, 16)
    check_stream(reference, engine)
    stop, completing, at = spanning_stop(reference)

    run = greedy_run(engine, 16, stop=(stop,))

    check_stream(run, engine, finish="stop")
    assert run.done.text == reference.text[:at]
    assert run.done.token_ids == reference.done.token_ids[: completing + 1]
    assert not any(stop[0] in t.text[-1:] and stop in t.text for t in run.tokens)
    assert stop not in run.text


def test_stop_string_completed_by_the_last_allowed_token(cpu_engine: Engine) -> None:
    """The match ends on token max_tokens-1: finish_reason stop, nothing of it flushed as length."""
    engine = cpu_engine
    reference = greedy_run(engine, 16)
    stop, completing, at = spanning_stop(reference)

    run = greedy_run(engine, completing + 1, stop=(stop,))

    check_stream(run, engine, finish="stop")
    assert run.done.text == reference.text[:at]
    assert len(run.tokens) == completing + 1


def test_held_back_text_is_flushed_at_length(cpu_engine: Engine) -> None:
    """The last text produced is the first half of a stop string: it was held back, the string
    never completed, so it must come out when max_tokens ends the request."""
    engine = cpu_engine
    reference = greedy_run(engine, N_TOKENS)
    check_stream(reference, engine)
    tail = reference.text[-2:]
    assert tail, reference.text
    stop = tail + "\x00never"

    run = greedy_run(engine, N_TOKENS, stop=(stop,))

    check_stream(run, engine, finish="length")
    assert run.done.text == reference.text
    assert run.done.token_ids == reference.done.token_ids
    assert run.tokens[-1].text.endswith(tail), "the held-back text arrives with the last token"


# ---- 5. cancellation -----------------------------------------------------------------------------


def test_cancel_from_another_thread_pull_mode(cpu_engine: Engine) -> None:
    engine = cpu_engine
    request = Request(ids(engine, PROMPTS[0]), GREEDY, max_tokens=100, ignore_eos=True)
    stream = engine.submit(request)
    run = Run(request)
    for event in stream:
        run.events.append(event)
        if isinstance(event, TokenEvent) and event.index == 2:
            canceller = threading.Thread(target=stream.cancel)
            canceller.start()
            canceller.join()
        if isinstance(event, DoneEvent):
            # Released at once: by the time the consumer sees DoneEvent(cancelled).
            assert_idle(engine)
    check_stream(run, engine, finish="cancelled")
    assert len(run.tokens) == 3
    assert run.done.token_ids == alone(engine, request.prompt_ids, GREEDY)[:3]


def test_cancel_from_another_thread_background_loop(cpu_engine: Engine, faults: Faults) -> None:
    engine = cpu_engine
    request = Request(ids(engine, PROMPTS[0]), GREEDY, max_tokens=100, ignore_eos=True)
    faults.gate(request.request_id)
    run = Run(request)
    three = threading.Event()
    idle_at_done: list[tuple[int, int]] = []
    engine.start()
    try:
        stream = engine.submit(request)

        def consume() -> None:
            for event in stream:
                run.events.append(event)
                if isinstance(event, TokenEvent):
                    if event.index == 2:
                        three.set()
                        three.wait()
                    faults.received(request.request_id)
                else:
                    idle_at_done.append((engine.active_sequences, engine.cache.free_slots))

        consumer = threading.Thread(target=consume)
        consumer.start()
        assert three.wait(timeout=30)
        stream.cancel()
        consumer.join(timeout=30)
        assert not consumer.is_alive()
    finally:
        engine.shutdown()
    check_stream(run, engine, finish="cancelled")
    assert 3 <= len(run.tokens) < 100
    assert idle_at_done == [(0, engine.cache.num_slots)]


def test_abandoned_iteration_cancels(cpu_engine: Engine) -> None:
    """Leaving the loop early cancels the request; with the background loop its slot is freed
    within a step."""
    engine = cpu_engine
    request = Request(ids(engine, PROMPTS[0]), GREEDY, max_tokens=100, ignore_eos=True)
    engine.start()
    try:
        stream = engine.submit(request)
        seen = 0
        for event in stream:
            seen += isinstance(event, TokenEvent)
            if seen == 2:
                break
        deadline = time.monotonic() + 5
        while engine.active_sequences and time.monotonic() < deadline:
            time.sleep(0.005)
        assert_idle(engine)
    finally:
        engine.shutdown()


def test_cancel_while_queued(cpu_engine: Engine) -> None:
    """A request still waiting for a KV slot can be cancelled too; the others are unaffected."""
    engine = cpu_engine
    prompts = [*same_length(engine, 4), ids(engine, PROMPTS[0])]
    requests = [Request(p, GREEDY, max_tokens=N_TOKENS, ignore_eos=True) for p in prompts]
    streams = [engine.submit(r) for r in requests]
    streams[-1].cancel()
    runs = [Run(r) for r in requests]
    for run, stream in zip(runs, streams, strict=True):
        run.events.extend(stream)
    assert_idle(engine)
    check_stream(runs[-1], engine, finish="cancelled")
    assert runs[-1].tokens == []
    for run in runs[:-1]:
        check_stream(run, engine)
        assert run.done.token_ids == alone(engine, run.request.prompt_ids, GREEDY)
