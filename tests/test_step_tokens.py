"""The step loop counts tokens: work items with several logits rows (drafts), and `Engine.advance`
taking several accepted tokens at once (events, stop conditions, the position counter).

Drafts are simulated by setting `Sequence.draft_ids` between steps, as a drafter will; everything
runs on the tiny synthetic model in pull mode (no background loop).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from infer.engine.batch import ForwardBatch
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.engine.runtime.request import Request
from infer.engine.runtime.sequence import Sequence, SequenceStatus
from infer.engine.sampling import SampledToken, SamplingParams

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

GREEDY = SamplingParams(temperature=0.0)
N_TOKENS = 12


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Engine:
    """Room for 4 sequences, 4-token prefill chunks, 64 rows per step."""
    return load_engine(
        tiny_gguf, EngineConfig(ctx_size=96, max_num_seqs=4, max_batched_tokens=64, batch_size=4)
    )


@pytest.fixture
def idle_engine(engine: Engine) -> Iterator[Engine]:
    yield engine
    assert engine.active_sequences == 0
    assert engine.cache.free_slots == engine.cache.num_slots


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(text, add_bos=False))


def byte_token(engine: Engine, char: str) -> int:
    (token,) = ids(engine, char)
    return token


def submitted(engine: Engine, request: Request) -> Sequence:
    """Submit `request` and hand it to the scheduler at once; its Sequence."""
    engine.submit(request)
    engine.reap_cancelled()  # moves submissions to the scheduler
    (seq,) = [s for s in engine.scheduler.waiting if s.request.request_id == request.request_id]
    return seq


def start_decoding(engine: Engine, request: Request) -> Sequence:
    """Submit `request` and step until its prompt is in the cache (it has its first token)."""
    seq = submitted(engine, request)
    while seq.in_prefill:
        assert engine.step()
    assert len(seq.generated) == 1
    return seq


def plain_run(engine: Engine, request: Request) -> tuple[int, ...]:
    return engine.generate(request).token_ids


def drain(engine: Engine) -> None:
    while engine.step():
        pass


# ---- the scheduler: a work item with k drafts asks for k + 1 logits rows ---------------------------


def test_decode_item_feeds_drafts_and_asks_for_one_row_each(idle_engine: Engine) -> None:
    engine = idle_engine
    request = Request(ids(engine, "hello the"), GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    seq = start_decoding(engine, request)
    assert seq.num_computed_tokens == len(request.prompt_ids) == seq.num_tokens - 1

    seq.draft_ids = [5, 6, 7]
    (item,) = engine.scheduler.schedule()
    assert item.sequence is seq and item.kind == "verify" and item.index == 1
    assert item.start == seq.num_computed_tokens
    assert item.tokens == (seq.last_token, 5, 6, 7)
    assert item.logit_rows == (0, 1, 2, 3)

    seq.draft_ids = []
    (item,) = engine.scheduler.schedule()
    assert item.tokens == (seq.last_token,) and item.logit_rows == (0,) and item.kind == "decode"
    seq.stream.cancel()
    engine.reap_cancelled()


def test_drafts_are_cut_by_the_step_budget_and_the_context(tiny_gguf: Path) -> None:
    engine = load_engine(
        tiny_gguf, EngineConfig(ctx_size=24, max_num_seqs=2, max_batched_tokens=3, batch_size=4)
    )
    request = Request(ids(engine, "hello"), GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    seq = start_decoding(engine, request)
    seq.draft_ids = [5, 6, 7, 8]
    (item,) = engine.scheduler.schedule()
    assert item.tokens == (seq.last_token, 5, 6) and item.logit_rows == (0, 1, 2)

    seq.num_computed_tokens = 22  # two positions left in the context: the newest token and one draft
    (item,) = engine.scheduler.schedule()
    assert item.tokens == (seq.last_token, 5) and item.logit_rows == (0, 1)
    seq.stream.cancel()
    engine.reap_cancelled()


def test_prefill_chunks_end_at_multiples_of_the_chunk_size_after_a_budget_cut(tiny_gguf: Path) -> None:
    """Budget 6, chunks of 4: the second prompt's first chunk is cut to 2 tokens, its next chunk
    ends at 4 again; decode rows come before prefill chunks."""
    engine = load_engine(
        tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=2, max_batched_tokens=6, batch_size=4)
    )
    batches: list[ForwardBatch] = []
    forward = engine.model.forward

    def recording_forward(batch, cache):  # type: ignore[no-untyped-def]
        batches.append(batch)
        return forward(batch, cache)

    engine.model.forward = recording_forward  # type: ignore[method-assign]
    first = Request(tuple(range(10, 16)), GREEDY, max_tokens=3, ignore_eos=True)
    second = Request(tuple(range(20, 30)), GREEDY, max_tokens=3, ignore_eos=True)
    streams = [engine.submit(first), engine.submit(second)]
    drain(engine)
    spans = [[(s.slot, s.start, s.length) for s in b.segments] for b in batches]
    assert spans[:4] == [
        [(0, 0, 4), (1, 0, 2)],  # both prompts start; the second is cut by the budget
        [(0, 4, 2), (1, 2, 2)],  # the first prompt ends; the second realigns to position 4
        [(0, 6, 1), (1, 4, 4)],  # decode first, then the second prompt's next whole chunk
        [(0, 7, 1), (1, 8, 2)],
    ]
    assert [list(b.logit_rows) for b in batches[:4]] == [[], [1], [0], [0, 2]]
    assert all(s.result().done.finish_reason == "length" for s in streams)


# ---- advance: several accepted tokens at once ------------------------------------------------------


def events_of(seq: Sequence) -> list[TokenEvent | DoneEvent]:
    """Every event the stream holds (the pull-mode iterator only steps when none is queued)."""
    events: list[TokenEvent | DoneEvent] = []
    for event in seq.stream:
        events.append(event)
        if isinstance(event, DoneEvent):
            break
    return events


def accepted(*token_ids: int) -> list[SampledToken]:
    return [SampledToken(t, None, ()) for t in token_ids]


def test_advance_emits_one_event_per_token_in_order(idle_engine: Engine) -> None:
    engine = idle_engine
    a, b, c = (byte_token(engine, ch) for ch in "abc")
    request = Request(ids(engine, "the sea"), GREEDY, max_tokens=N_TOKENS, ignore_eos=True)
    seq = start_decoding(engine, request)
    first = seq.generated[0]
    seq.draft_ids = [9, 9]

    engine.updater.advance(seq, accepted(a, b, c))

    assert seq.generated == [first, a, b, c]
    assert seq.num_computed_tokens == len(request.prompt_ids) + 3 == seq.num_tokens - 1
    assert seq.draft_ids == [] and seq.status is SequenceStatus.RUNNING
    seq.stream.cancel()
    engine.reap_cancelled()
    events = events_of(seq)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    assert [(t.index, t.token_id) for t in tokens] == [(0, first), (1, a), (2, b), (3, c)]
    # (the first token may be half a UTF-8 character, which "a" then completes)
    assert tokens[1].text.endswith("a") and [t.text for t in tokens[2:]] == ["b", "c"]
    assert {t.step for t in tokens[1:]} == {engine.steps}, "one advance: the tokens of one step"
    done = events[-1]
    assert isinstance(done, DoneEvent) and done.finish_reason == "cancelled"
    assert done.token_ids == (first, a, b, c)


@pytest.mark.parametrize("stopper", ["eos", "stop_string", "max_tokens"])
def test_a_stop_inside_a_multi_token_advance_ends_the_request_there(
    idle_engine: Engine, stopper: str
) -> None:
    engine = idle_engine
    a, b, x = (byte_token(engine, ch) for ch in "abx")
    eos = min(engine.tokenizer.stop_ids)
    prompt = ids(engine, "is it")
    request = {
        "eos": Request(prompt, GREEDY, max_tokens=N_TOKENS),
        "stop_string": Request(prompt, GREEDY, max_tokens=N_TOKENS, stop=("x",), ignore_eos=True),
        "max_tokens": Request(prompt, GREEDY, max_tokens=3, ignore_eos=True),
    }[stopper]
    seq = start_decoding(engine, request)
    if seq.is_finished:
        pytest.skip("the tiny model's first token already ended the request")
    first = seq.generated[0]
    third = {"eos": eos, "stop_string": x, "max_tokens": b}[stopper]

    engine.updater.advance(seq, accepted(a, third, b, a))

    assert seq.is_finished and seq.slot is None
    assert seq.generated == [first, a, third], "the tokens after the stop are dropped"
    assert seq.num_computed_tokens == len(prompt) + 2, "the counter ends at the last kept token"
    events = events_of(seq)
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    done = events[-1]
    assert isinstance(done, DoneEvent) and len(events) == 4
    assert [t.token_id for t in tokens] == [first, a, third] and list(done.token_ids) == [first, a, third]
    assert done.finish_reason == ("length" if stopper == "max_tokens" else "stop")
    assert "x" not in done.text and done.text == "".join(t.text for t in tokens)
    assert done.text.endswith("ab" if stopper == "max_tokens" else "a")


# ---- drafts verified through the step loop equal plain decoding ------------------------------------


def run_with_drafts(
    engine: Engine, request: Request, reference: tuple[int, ...]
) -> tuple[list[TokenEvent], int]:
    """Pull-mode run where every decode step carries 3 drafts taken from `reference`, the second of
    them wrong every other step; returns the token events and the steps the request took."""
    seq = submitted(engine, request)
    steps = 0
    while not seq.is_finished:
        if not seq.in_prefill:
            n = len(seq.generated)
            drafts = list(reference[n : n + 3])
            if steps % 2 and len(drafts) > 1:
                drafts[1] = (drafts[1] + 1) % engine.model.vocab_size
            seq.draft_ids = drafts
        assert engine.step()
        steps += 1
    events = list(seq.stream)
    return [e for e in events if isinstance(e, TokenEvent)], steps


@pytest.mark.parametrize(
    "params",
    [GREEDY, SamplingParams(temperature=1.0, seed=7, repeat_penalty=1.5, logprobs=True)],
    ids=["greedy", "sampled-penalized"],
)
def test_verified_drafts_give_the_tokens_of_plain_decoding(
    idle_engine: Engine, params: SamplingParams
) -> None:
    engine = idle_engine
    prompt = ids(engine, "hello the world is")
    reference_request = Request(prompt, params, max_tokens=N_TOKENS, ignore_eos=True)
    reference = engine.generate(reference_request)
    assert len(reference.token_ids) == N_TOKENS

    tokens, steps = run_with_drafts(
        engine, Request(prompt, params, max_tokens=N_TOKENS, ignore_eos=True), reference.token_ids
    )

    assert tuple(t.token_id for t in tokens) == reference.token_ids
    assert [t.index for t in tokens] == list(range(N_TOKENS))
    assert [t.text for t in tokens] == [t.text for t in reference.tokens]
    if params.logprobs:
        assert [t.logprob for t in tokens] == pytest.approx([t.logprob for t in reference.tokens], abs=1e-5)
    per_step = [t.step for t in tokens]
    assert len(set(per_step)) < N_TOKENS, "no step accepted a draft"
    assert steps < N_TOKENS


def test_wrong_drafts_cost_nothing_but_rows(idle_engine: Engine) -> None:
    """Every draft wrong: one token per step, the same tokens as plain decoding."""
    engine = idle_engine
    prompt = ids(engine, "a haiku is")
    reference = plain_run(engine, Request(prompt, GREEDY, max_tokens=N_TOKENS, ignore_eos=True))
    wrong = tuple((t + 1) % engine.model.vocab_size for t in reference)
    tokens, _ = run_with_drafts(engine, Request(prompt, GREEDY, max_tokens=N_TOKENS, ignore_eos=True), wrong)
    assert tuple(t.token_id for t in tokens) == reference
    steps = [t.step for t in tokens]
    assert steps == sorted(set(steps)), "one token per step when every draft is rejected"
