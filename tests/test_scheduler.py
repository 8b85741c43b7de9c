"""Continuous batching on the default model: batch independence, chunked prefill, queueing, limits."""

from __future__ import annotations

import threading

import pytest

from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.engine.runtime.request import Request, RequestError
from infer.engine.sampling import SamplingParams

pytestmark = pytest.mark.real_model

GREEDY = SamplingParams(temperature=0.0)
PROMPTS = [
    "The capital of France is",
    "Once upon a time",
    "def fibonacci(n):",
    "List three colors:",
    "In 1969, the first humans",
    "The quick brown fox jumps over the lazy dog. Then the dog",
    "Water boils at",
    "My favourite programming language is Python because it is simple, readable and",
]


@pytest.fixture(scope="module")
def engine(default_model_path) -> Engine:
    """One engine with room for 8 sequences and 512-token prefill chunks."""
    return load_engine(
        default_model_path,
        EngineConfig(ctx_size=2304, max_num_seqs=8, max_batched_tokens=1024, batch_size=512),
    )


def _request(engine: Engine, text: str, n: int = 12) -> Request:
    return Request(tuple(engine.tokenizer.encode(text)), GREEDY, max_tokens=n, ignore_eos=True)


def test_eight_concurrent_requests_match_their_solo_runs(engine: Engine) -> None:
    solo = [engine.generate(_request(engine, text)).token_ids for text in PROMPTS]
    streams = [engine.submit(_request(engine, text)) for text in PROMPTS]
    batched = [s.result().token_ids for s in streams]
    assert batched == solo
    assert len({len(engine.tokenizer.encode(t)) for t in PROMPTS}) > 4  # really different prompt lengths


@pytest.mark.slow  # ~18 s: a 2,000-token prefill on the default model
def test_long_prompt_is_prefilled_beside_decoding_sequences(engine: Engine) -> None:
    decoders = [engine.submit(_request(engine, text, n=40)) for text in PROMPTS[:3]]
    # Let the three get going, then admit a 2,000-token prompt.
    for _ in range(3):
        engine.step()
    long_prompt = tuple(100 + (i * 31) % 20000 for i in range(2000))
    long_stream = engine.submit(Request(long_prompt, GREEDY, max_tokens=2, ignore_eos=True))
    admitted_at = engine.steps
    done_long = long_stream.result()
    first_token_step = done_long.tokens[0].step
    # 2000 tokens in 512-token chunks, but the step budget (1024) is shared with 3 decode rows.
    assert first_token_step - admitted_at >= 4
    for stream in decoders:
        steps = [e.step for e in stream if isinstance(e, TokenEvent)]
        during = [s for s in steps if admitted_at < s <= first_token_step]
        # One token in every step while the long prompt was prefilled: never stalled.
        assert during == list(range(admitted_at + 1, first_token_step + 1))


def test_queueing_when_all_slots_are_held(default_model_path) -> None:
    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=2))
    streams = [engine.submit(_request(engine, text, n=4)) for text in PROMPTS[:5]]
    peak = 0
    while engine.step():
        peak = max(peak, len(engine.scheduler.running))
    assert peak == 2
    results = [s.result() for s in streams]
    assert all(r.done.finish_reason == "length" and len(r.token_ids) == 4 for r in results)
    assert engine.cache.free_slots == 2


def test_a_sequence_counts_as_active_until_its_slot_is_back(default_model_path) -> None:
    """active_sequences takes no step lock, so a reader that sees 0 must also see every slot free:
    the slot goes back while the sequence is still listed (the order a CI run raced on)."""
    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=2))
    release = engine.cache.release
    counted_at_release: list[int] = []

    def watched_release(slot: int) -> None:
        counted_at_release.append(engine.active_sequences)
        release(slot)

    engine.cache.release = watched_release  # type: ignore[method-assign]
    streams = [engine.submit(_request(engine, text, n=3)) for text in PROMPTS[:3]]
    while engine.step():
        pass
    assert all(s.result().done.finish_reason == "length" for s in streams)
    assert len(counted_at_release) == 3 and min(counted_at_release) >= 1
    assert engine.active_sequences == 0 and engine.cache.free_slots == 2


def test_cancel_frees_the_slot_at_once(default_model_path) -> None:
    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=1))
    engine.start()
    try:
        stream = engine.submit(_request(engine, "Tell me a long story", n=200))
        seen = threading.Event()
        events: list = []

        def consume() -> None:
            for event in stream:
                events.append(event)
                seen.set()

        thread = threading.Thread(target=consume)
        thread.start()
        assert seen.wait(30)
        stream.cancel()
        thread.join(30)
        done = events[-1]
        assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled"
        assert 0 < done.usage.completion_tokens < 200
        assert engine.cache.free_slots == 1 and engine.active_sequences == 0
        # The freed slot serves the next request.
        assert engine.generate(_request(engine, "Hi", n=2)).done.finish_reason == "length"
    finally:
        engine.shutdown()


def test_context_limits(default_model_path) -> None:
    engine = load_engine(default_model_path, EngineConfig(ctx_size=32, max_num_seqs=2))
    prompt = tuple(engine.tokenizer.encode("one two three four five six seven eight nine ten"))
    done = engine.generate(Request(prompt, GREEDY, max_tokens=None, ignore_eos=True)).done
    assert done.finish_reason == "length"
    assert done.usage.prompt_tokens + done.usage.completion_tokens == 32
    with pytest.raises(RequestError, match="context holds 32") as info:
        engine.submit(Request(tuple(range(100, 132)), GREEDY, max_tokens=1))
    assert info.value.parameter == "prompt"
