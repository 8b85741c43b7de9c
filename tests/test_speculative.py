"""Speculative decoding changes nothing but the speed: prompt lookup and a draft model, verified by
sample-and-compare in the step loop, give the very tokens of plain decoding, greedy or seeded, alone
or 8 at a time, and count what they drafted and kept.

Synthetic target/draft pairs (tiny Q8_0 llama models on the exact CPU kernels, so verify rows are
the same bits as decode rows): the draft is either the target itself (every draft right when greedy)
or a model of other random weights with the same tokenizer (mostly wrong). A few default-model runs
live in tests/test_speculative_model.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.engine.runtime.request import Request, RequestError
from infer.engine.sampling import SamplingParams
from infer.engine.speculative import (
    AdaptiveLength,
    DraftModelError,
    SpecConfig,
    SpecConfigError,
    SpecCounters,
    lookup,
    summary,
)

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

N_TOKENS = 16
SAMPLERS = {
    "greedy": SamplingParams(temperature=0.0),
    "t0.8": SamplingParams(temperature=0.8, seed=11),
    "t1.3": SamplingParams(temperature=1.3, seed=12, repeat_penalty=1.1),
}
SPECS: dict[str, SpecConfig | None] = {
    "off": None,
    "lookup-2": SpecConfig("prompt_lookup", num_tokens=2),
    "lookup-4": SpecConfig("prompt_lookup", num_tokens=4),
    "lookup-8": SpecConfig("prompt_lookup", num_tokens=8, ngram_max=4),
    "draft-self": SpecConfig("draft_model", num_tokens=4, p_min=0.0),
    "draft-self-pmin": SpecConfig("draft_model", num_tokens=6, p_min=0.3),
}
PROMPTS = (
    "hello the world is the sea",
    "the sea is the sea is the",
    "a haiku is a haiku",
    "and of to in is it",
    "hello hello world",
    "user assistant system user",
    "the world and the sea",
    "is it the world",
)


def config(slots: int = 8) -> EngineConfig:
    return EngineConfig(ctx_size=128, max_num_seqs=slots, max_batched_tokens=256, batch_size=16)


@pytest.fixture(scope="module")
def target(tiny_model_factory: Callable[..., object]) -> Path:
    return tiny_model_factory(quant="Q8_0", kv_heads=2).gguf_path  # type: ignore[attr-defined]


@pytest.fixture(scope="module")
def engine(target: Path) -> Engine:
    """The target drafting for itself with draft_model (and prompt lookup, which needs no model)."""
    return load_engine(target, config(), cpu_kernels="exact", draft_model=target)


@pytest.fixture(scope="module")
def other_engine(target: Path, tiny_model_factory: Callable[..., object]) -> Engine:
    """The target with a draft model of other weights (same tokenizer): drafts mostly wrong."""
    other = tiny_model_factory(quant="Q8_0", kv_heads=2, seed=5).gguf_path  # type: ignore[attr-defined]
    return load_engine(target, config(), cpu_kernels="exact", draft_model=other)


def prompt_ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(text, add_bos=False))


def request(
    engine: Engine, text: str, params: SamplingParams, spec: SpecConfig | None, **kw: object
) -> Request:
    ids = prompt_ids(engine, text)
    return Request(ids, params, max_tokens=N_TOKENS, ignore_eos=True, spec=spec, **kw)  # type: ignore[arg-type]


def run_all(engine: Engine, requests: list[Request]) -> list[DoneEvent]:
    """Submit every request at once and drive the step loop until all are done."""
    streams = [engine.submit(r) for r in requests]
    while engine.step():
        pass
    dones = [s.result().done for s in streams]
    assert engine.active_sequences == 0
    return dones


# ---- the mode matrix -------------------------------------------------------------------------------


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_every_mode_gives_the_tokens_of_plain_decoding(engine: Engine, sampler: str) -> None:
    params = SAMPLERS[sampler]
    plain = {text: engine.generate(request(engine, text, params, None)).token_ids for text in PROMPTS}
    assert all(len(ids) == N_TOKENS for ids in plain.values())
    accepted: dict[str, int] = {}
    for name, spec in SPECS.items():
        # alone, one prompt at a time
        for text in PROMPTS[:2]:
            done = engine.generate(request(engine, text, params, spec)).done
            assert done.token_ids == plain[text], (name, text)
            accepted[name] = accepted.get(name, 0) + done.counters.get("accepted_tokens", 0)
        # eight at once
        dones = run_all(engine, [request(engine, text, params, spec) for text in PROMPTS])
        for text, done in zip(PROMPTS, dones, strict=True):
            assert done.token_ids == plain[text], (name, "batched", text)
            assert done.finish_reason == "length"
            assert (spec is None) == (done.counters == {})
    if sampler == "greedy":  # the draft model is the target: greedy drafts are its own tokens
        assert accepted["draft-self"] > 0
    assert accepted["lookup-4"] + accepted["lookup-8"] > 0 or sampler != "greedy"


def test_a_draft_model_of_other_weights_changes_nothing_but_the_counters(other_engine: Engine) -> None:
    engine = other_engine
    for params in SAMPLERS.values():
        plain = [engine.generate(request(engine, t, params, None)).token_ids for t in PROMPTS]
        spec = SpecConfig("draft_model", num_tokens=4, p_min=0.0, adaptive=False)
        dones = run_all(engine, [request(engine, t, params, spec) for t in PROMPTS])
        assert [d.token_ids for d in dones] == plain
        assert all(d.counters["drafts"] > 0 for d in dones)


def test_counters_are_the_same_alone_and_batched(engine: Engine) -> None:
    params = SAMPLERS["t0.8"]
    for spec in (SPECS["lookup-4"], SPECS["draft-self-pmin"]):
        alone = [engine.generate(request(engine, t, params, spec)).done.counters for t in PROMPTS]
        batched = [d.counters for d in run_all(engine, [request(engine, t, params, spec) for t in PROMPTS])]
        assert alone == batched


def test_self_drafting_greedy_accepts_every_draft_and_takes_fewer_steps(engine: Engine) -> None:
    params = SAMPLERS["greedy"]
    spec = SpecConfig("draft_model", num_tokens=4, p_min=0.0, adaptive=False)
    before = engine.steps
    plain = engine.generate(request(engine, PROMPTS[0], params, None))
    plain_steps = engine.steps - before
    before = engine.steps
    fast = engine.generate(request(engine, PROMPTS[0], params, spec))
    fast_steps = engine.steps - before
    assert fast.token_ids == plain.token_ids
    counters = fast.done.counters
    assert counters["accepted_tokens"] == counters["draft_tokens"] > 0
    assert fast_steps < plain_steps / 2
    stats = summary(counters)
    assert stats is not None and stats["acceptance_rate"] == 1.0
    mean = 1 + counters["accepted_tokens"] / counters["drafts"]
    assert stats["mean_accepted_length"] == pytest.approx(mean)
    assert stats["accepted_per_position"][0] == counters["drafts"]


def test_events_arrive_as_each_verify_ends(engine: Engine) -> None:
    """Pull mode steps only when no event is queued: every token is delivered by the step that
    accepted it, several tokens of one verify together, in order."""
    spec = SpecConfig("draft_model", num_tokens=4, p_min=0.0, adaptive=False)
    stream = engine.submit(request(engine, PROMPTS[1], SAMPLERS["greedy"], spec))
    seen: list[tuple[int, int, int]] = []
    for event in stream:
        if isinstance(event, TokenEvent):
            seen.append((event.index, event.step, engine.steps))
    assert [index for index, _, _ in seen] == list(range(N_TOKENS))
    assert all(step == now for _, step, now in seen), "a token waited for a later step"
    steps = [step for _, step, _ in seen]
    assert len(set(steps)) < len(steps) / 2


# ---- failures end only their own request -----------------------------------------------------------


def faulty_engine(target: Path, phase: str, victim: str) -> Engine:
    def hook(request_id: str, kind: str, index: int) -> None:
        if request_id == victim and kind == phase and index >= 4:
            raise RuntimeError(f"injected {phase} fault")

    cfg = EngineConfig(ctx_size=128, max_num_seqs=4, max_batched_tokens=256, batch_size=16, fault_hook=hook)
    return load_engine(target, cfg, cpu_kernels="exact", draft_model=target)


@pytest.mark.parametrize("phase", ["verify", "draft"])
def test_a_fault_in_a_verify_or_drafting_step_ends_only_that_request(
    engine: Engine, target: Path, phase: str
) -> None:
    params = SAMPLERS["t0.8"]
    spec = SpecConfig("draft_model", num_tokens=3, p_min=0.0, adaptive=False)
    plain = [engine.generate(request(engine, t, params, None)).token_ids for t in PROMPTS[:3]]
    faulty = faulty_engine(target, phase, "victim")
    requests = [
        request(faulty, t, params, spec, **({"request_id": "victim"} if i == 1 else {}))
        for i, t in enumerate(PROMPTS[:3])
    ]
    dones = run_all(faulty, requests)
    assert [d.token_ids for i, d in enumerate(dones) if i != 1] == [plain[0], plain[2]]
    assert all(d.finish_reason == "length" for i, d in enumerate(dones) if i != 1)
    victim = dones[1]
    assert victim.finish_reason == "error" and f"injected {phase} fault" in (victim.error or "")
    assert ("verify step" if phase == "verify" else "drafting for decode step") in (victim.error or "")
    assert 4 <= len(victim.token_ids) < N_TOKENS
    assert victim.token_ids == plain[1][: len(victim.token_ids)], "the tokens so far are kept"
    assert faulty.cache.free_slots == faulty.cache.num_slots


# ---- the draft filter seam, draft_min, limits --------------------------------------------------------


def test_a_draft_filter_cuts_drafts_before_they_are_scheduled(engine: Engine) -> None:
    spec = SpecConfig("draft_model", num_tokens=4, p_min=0.0, adaptive=False)
    params = SAMPLERS["greedy"]
    plain = engine.generate(request(engine, PROMPTS[0], params, None)).token_ids
    stream = engine.submit(request(engine, PROMPTS[0], params, spec))
    engine.reap_cancelled()
    (seq,) = [s for s in engine.scheduler.waiting if s.stream is stream]
    offered: list[list[int]] = []

    def keep_one(drafts: list[int]) -> list[int]:
        offered.append(list(drafts))
        return drafts[:1]

    seq.draft_filter = keep_one
    done = stream.result().done
    assert done.token_ids == plain
    assert len(offered[0]) == 4 and all(len(d) <= 4 for d in offered)
    assert done.counters["draft_tokens"] == done.counters["drafts"], "one draft per verify"


def test_draft_min_drops_short_proposals(engine: Engine) -> None:
    """Prompt lookup rarely finds 8 tokens to copy: with draft_min 8 nearly nothing is verified."""
    params = SAMPLERS["greedy"]
    loose = engine.generate(request(engine, PROMPTS[1], params, SpecConfig("prompt_lookup", num_tokens=8)))
    strict = engine.generate(
        request(engine, PROMPTS[1], params, SpecConfig("prompt_lookup", num_tokens=8, draft_min=8))
    )
    assert strict.token_ids == loose.token_ids
    assert strict.done.counters["draft_tokens"] % 8 == 0
    assert strict.done.counters["drafts"] <= loose.done.counters["drafts"]


def test_drafts_never_pass_max_tokens_or_the_context(engine: Engine) -> None:
    spec = SpecConfig("draft_model", num_tokens=8, p_min=0.0, adaptive=False)
    ids = prompt_ids(engine, PROMPTS[0])
    done = engine.generate(Request(ids, SAMPLERS["greedy"], max_tokens=5, ignore_eos=True, spec=spec)).done
    assert len(done.token_ids) == 5 and done.counters["draft_tokens"] <= 4
    long_prompt = (ids * 40)[: 128 - 6]
    done = engine.generate(Request(long_prompt, SAMPLERS["greedy"], ignore_eos=True, spec=spec)).done
    assert done.finish_reason == "length" and len(done.token_ids) == 6


def test_draft_model_method_without_a_draft_model_is_refused(target: Path) -> None:
    plain_engine = load_engine(target, config(2), cpu_kernels="exact")
    with pytest.raises(RequestError, match="needs a draft model"):
        plain_engine.submit(request(plain_engine, "hello", SAMPLERS["greedy"], SpecConfig("draft_model")))


def test_a_draft_model_with_another_tokenizer_is_refused(
    target: Path, tiny_model_factory: Callable[..., object]
) -> None:
    other = tiny_model_factory(quant="Q8_0", kv_heads=2, gguf_metadata={"tokenizer.ggml.eos_token_id": 0})
    with pytest.raises(DraftModelError, match="tokenizer differs") as info:
        load_engine(target, config(2), cpu_kernels="exact", draft_model=other.gguf_path)  # type: ignore[attr-defined]
    assert "\n" not in str(info.value)


# ---- the parts -------------------------------------------------------------------------------------


def test_lookup_takes_the_longest_suffix_match_and_what_followed() -> None:
    context = [1, 2, 3, 9, 9, 7, 2, 3, 4, 5, 6, 1, 2, 3]
    assert lookup(context, 3, 1, 3) == [9, 9, 7], "the 3-gram 1 2 3 wins over the later 2 3"
    assert lookup(context, 3, 1, 2) == [4, 5, 6], "the most recent 2-gram 2 3"
    assert lookup(context, 2, 1, 3) == [9, 9]
    assert lookup([5, 6, 7, 8], 3, 1, 3) == []
    assert lookup([4, 4, 4, 4, 4], 2, 1, 1) == [4, 4], "a run copies itself"
    assert lookup([1], 3, 1, 3) == []


def test_adaptive_length_shrinks_pauses_and_grows() -> None:
    length = AdaptiveLength(8)
    assert length.next_length() == 8
    length.record(8, 2)
    assert length.next_length() == 3
    length.record(3, 3)
    assert length.next_length() == 6
    length.record(6, 0)
    length.record(1, 0)
    assert length.next_length() == 0, "two misses in a row pause drafting"
    assert length.next_length() == 1
    length.record(1, 1)
    assert length.next_length() == 2
    fixed = AdaptiveLength(5, adaptive=False)
    fixed.record(5, 0)
    assert fixed.next_length() == 5


def test_counters_and_their_summary() -> None:
    counters = SpecCounters()
    counters.record(4, 2)
    counters.record(4, 0)
    counters.record(2, 2)
    flat = counters.as_counters()
    assert flat == {
        "drafts": 3,
        "draft_tokens": 10,
        "accepted_tokens": 4,
        "accepted_at_1": 2,
        "accepted_at_2": 2,
    }
    stats = summary(flat)
    assert stats == {
        "drafts": 3,
        "draft_tokens": 10,
        "accepted_tokens": 4,
        "acceptance_rate": 0.4,
        "mean_accepted_length": round(1 + 4 / 3, 4),
        "accepted_per_position": [2, 2],
    }
    assert summary({}) is None


@pytest.mark.parametrize(
    ("kwargs", "parameter"),
    [
        ({"num_tokens": 0}, "spec_num_tokens"),
        ({"draft_min": 6}, "spec_draft_min"),
        ({"p_min": 1.5}, "spec_p_min"),
        ({"ngram_min": 4, "ngram_max": 3}, "spec_ngram_min"),
        ({"method": "medusa"}, "spec_method"),
    ],
)
def test_spec_config_is_validated_once(kwargs: dict[str, object], parameter: str) -> None:
    fields: dict[str, object] = {"method": "prompt_lookup", **kwargs}
    with pytest.raises(SpecConfigError) as info:
        SpecConfig(**fields)  # type: ignore[arg-type]
    assert info.value.parameter == parameter
