"""Constraints through llguidance on the tiny synthetic model: specs refused before any token, the
token table checked against our tokenizer, masks without special tokens, per-row masks for drafts,
rollback with the kept tokens, and the step loop's errors.

Drafts are fed by hand (`Sequence.draft_ids`), as a drafter will; everything runs in pull mode.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from synthetic import BOS_ID, ENDOFTEXT_ID, EOS_ID

from infer.engine.grammar import (
    Constraint,
    GrammarError,
    GrammarSpec,
    GrammarViolationError,
    GrammarVocabulary,
    VocabularyMismatchError,
    audit_tokens,
)
from infer.engine.grammar import vocabulary as vocabulary_module
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import TokenEvent
from infer.engine.runtime.request import Request, RequestError
from infer.engine.runtime.sequence import Sequence
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

GREEDY = SamplingParams(temperature=0.0)
SAMPLED = SamplingParams(temperature=1.0, seed=11, logprobs=True, n_probs=5)
SPECIALS = (ENDOFTEXT_ID, BOS_ID, EOS_ID)
WORDS = GrammarSpec("regex", r"(the|sea|is|hello)( (the|sea|is|hello)){2,5}")
PERSON = GrammarSpec.json_schema(
    {
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 6},
            "age": {"type": "integer", "minimum": 0, "maximum": 99},
        },
        "required": ["name", "age"],
        "additionalProperties": False,
    }
)


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Engine:
    return load_engine(
        tiny_gguf, EngineConfig(ctx_size=128, max_num_seqs=4, max_batched_tokens=64, batch_size=8)
    )


@pytest.fixture
def idle_engine(engine: Engine) -> Iterator[Engine]:
    yield engine
    assert engine.active_sequences == 0
    assert engine.cache.free_slots == engine.cache.num_slots


def ids(engine: Engine, text: str) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(text, add_bos=False))


def constraint(engine: Engine, spec: GrammarSpec) -> Constraint:
    return Constraint(spec, engine.grammar_vocabulary)


# ---- specs: refused when made, naming the field -----------------------------------------------------


@pytest.mark.parametrize(
    ("make", "needle"),
    [
        (lambda: GrammarSpec("regex", "a(b", parameter="--regex"), "unclosed group"),
        (lambda: GrammarSpec("lark", "start: foo", parameter="--grammar"), "foo"),
        (lambda: GrammarSpec.json_schema('{"type": "strin"}', parameter="json_schema"), "strin"),
        (lambda: GrammarSpec.json_schema("{not json", parameter="json_schema"), "not valid JSON"),
        (lambda: GrammarSpec.json_schema("[1]", parameter="json_schema"), "JSON object"),
        (lambda: GrammarSpec.json_schema({"$ref": "#/$defs/missing"}, parameter="json_schema"), "missing"),
        (lambda: GrammarSpec("choice", choices=("a", ""), parameter="--choice"), "non-empty"),
        (lambda: GrammarSpec("regex", "  ", parameter="--regex"), "empty"),
    ],
)
def test_an_invalid_spec_is_refused_naming_its_field(make, needle: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(GrammarError, match=re.escape(needle)) as info:
        make()
    assert info.value.parameter is not None


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "array", "uniqueItems": True},
        {"type": "object", "not": {"required": ["a"]}},
        {"if": {"type": "string"}, "then": {"minLength": 1}},
        {"type": "object", "dependentRequired": {"a": ["b"]}},
    ],
)
def test_a_schema_feature_llguidance_does_not_enforce_is_an_error(schema: dict) -> None:
    with pytest.raises(GrammarError, match="Unimplemented keys"):
        GrammarSpec.json_schema(schema, parameter="json_schema")


def test_schema_properties_keep_their_order() -> None:
    spec = GrammarSpec.json_schema({"type": "object", "properties": {"z": {}, "a": {}}})
    assert json.loads(spec.source)["properties"] == {"z": {}, "a": {}}


# ---- the token table --------------------------------------------------------------------------------


def test_the_token_table_matches_our_tokenizer(idle_engine: Engine) -> None:
    lltok = idle_engine.grammar_vocabulary.lltokenizer
    tokenizer = idle_engine.tokenizer
    assert lltok is idle_engine.grammar_vocabulary.lltokenizer, "built once per model"
    assert lltok.vocab_size == idle_engine.model.vocab_size
    assert set(lltok.eos_tokens) == set(tokenizer.stop_ids)
    for token in range(3, tokenizer.vocab_size, 7):
        assert lltok.decode_bytes([token]) == tokenizer.token_bytes(token)
    assert all(lltok.is_special_token(t) for t in SPECIALS)


def test_a_token_table_that_disagrees_with_ours_is_refused(
    idle_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = vocabulary_module.verify_mapping

    def shifted(lltok, tokenizer, tokens):  # type: ignore[no-untyped-def]
        real(lltok, tokenizer, [*tokens[:100], tokens[101], *tokens[101:]])  # our token 100 differs

    monkeypatch.setattr(vocabulary_module, "verify_mapping", shifted)
    with pytest.raises(VocabularyMismatchError, match="token 100"):
        vocabulary_module.build_lltokenizer(idle_engine.tokenizer, idle_engine.model.vocab_size)
    fresh = GrammarVocabulary(idle_engine.tokenizer, idle_engine.model.vocab_size)
    engine_like = Request(ids(idle_engine, "hello"), GREEDY, grammar=WORDS)
    idle_engine.grammar_vocabulary, saved = fresh, idle_engine.grammar_vocabulary
    try:
        with pytest.raises(RequestError, match="token 100"):
            idle_engine.validate(engine_like)
    finally:
        idle_engine.grammar_vocabulary = saved


# ---- masks ------------------------------------------------------------------------------------------


def test_no_special_token_inside_constrained_text_and_eos_only_where_accepting(idle_engine: Engine) -> None:
    c = constraint(idle_engine, GrammarSpec("regex", "(.+)"))
    first = c.mask()
    assert not first[list(SPECIALS)].any(), "nothing special, and no EOS before the first character"
    assert first.sum() > 200
    c.consume(ids(idle_engine, "hello")[0])
    after = c.mask()
    stops = idle_engine.tokenizer.stop_ids
    assert stops == {EOS_ID, ENDOFTEXT_ID}
    assert after[list(stops)].all() and c.is_accepting, "the stop tokens where the grammar accepts"
    assert not after[BOS_ID]
    assert not after[idle_engine.tokenizer.vocab_size :].any(), "padded ids are never allowed"


def test_a_completed_grammar_allows_only_the_end(idle_engine: Engine) -> None:
    c = constraint(idle_engine, GrammarSpec("choice", choices=("sea", "is")))
    for token in ids(idle_engine, "sea"):
        c.consume(token)
    assert c.is_accepting and set(np.flatnonzero(c.mask()).tolist()) <= set(idle_engine.tokenizer.stop_ids)
    c.consume(EOS_ID)
    assert c.is_stopped


def test_valid_prefix_row_masks_and_rollback(idle_engine: Engine) -> None:
    c = constraint(idle_engine, WORDS)
    good = list(ids(idle_engine, "the sea is"))
    drafts = [*good, *ids(idle_engine, "x")]
    assert c.valid_prefix(drafts) == len(good)
    before = c.mask().copy()

    masks = c.row_masks(good)

    assert c.consumed == 0 and np.array_equal(c.mask(), before), "row_masks leaves the matcher as it was"
    stepwise = []
    for token in good:
        stepwise.append(c.mask().copy())
        c.consume(token)
    stepwise.append(c.mask().copy())
    assert len(masks) == len(good) + 1
    assert all(np.array_equal(a, b) for a, b in zip(masks, stepwise, strict=True))
    c.rollback(2)
    assert c.consumed == len(good) - 2 and np.array_equal(c.mask(), stepwise[-3])
    with pytest.raises(ValueError, match="cannot roll back"):
        c.rollback(c.consumed + 1)


def test_consuming_a_forbidden_token_is_an_error(idle_engine: Engine) -> None:
    c = constraint(idle_engine, WORDS)
    with pytest.raises(GrammarViolationError, match="not allowed"):
        c.consume(BOS_ID)
    with pytest.raises(GrammarViolationError):
        c.mask()


def test_audit_names_the_first_forbidden_token(idle_engine: Engine) -> None:
    vocab = idle_engine.grammar_vocabulary
    good = ids(idle_engine, "the sea")
    assert audit_tokens(WORDS, vocab, good) is None
    message = audit_tokens(WORDS, vocab, (*good, BOS_ID))
    assert message is not None and message.startswith(f"token {len(good)} (id {BOS_ID}) is not allowed")


# ---- the step loop ----------------------------------------------------------------------------------


def run(engine: Engine, spec: GrammarSpec, params: SamplingParams, **kwargs):  # type: ignore[no-untyped-def]
    request = Request(ids(engine, "hello the"), params, max_tokens=kwargs.pop("max_tokens", 48), grammar=spec)
    return engine.generate(request)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize(
    "spec",
    [WORDS, GrammarSpec("choice", choices=("sea", "hello world", "is it")), PERSON],
    ids=["regex", "choice", "json_schema"],
)
def test_constrained_output_matches_and_ends_with_stop(
    idle_engine: Engine, spec: GrammarSpec, params: SamplingParams
) -> None:
    completion = run(idle_engine, spec, params)
    done = completion.done
    assert done.finish_reason == "stop", done.error
    text = idle_engine.tokenizer.decode(completion.token_ids, skip_special=True)
    assert text == done.text
    if spec.kind == "regex":
        assert re.fullmatch(spec.source, text)
    elif spec.kind == "choice":
        assert text in spec.choices
    else:
        person = json.loads(text)
        assert set(person) == {"name", "age"} and 0 <= person["age"] <= 99 and len(person["name"]) <= 6
    assert audit_tokens(spec, idle_engine.grammar_vocabulary, completion.token_ids) is None


def test_logprobs_and_alternatives_come_from_the_constrained_distribution(idle_engine: Engine) -> None:
    spec = GrammarSpec("choice", choices=("sea", "is"))
    completion = run(idle_engine, spec, SAMPLED)
    first = completion.tokens[0]
    allowed = set(np.flatnonzero(constraint(idle_engine, spec).mask()).tolist())
    assert {t for t, _ in first.top_logprobs} == allowed, "every allowed token, nothing else"
    assert sum(np.exp(lp) for _, lp in first.top_logprobs) == pytest.approx(1.0, abs=1e-5)


def test_ignore_eos_still_ends_when_the_grammar_is_complete(idle_engine: Engine) -> None:
    spec = GrammarSpec("choice", choices=("sea", "is"))
    request = Request(ids(idle_engine, "hello"), GREEDY, max_tokens=40, ignore_eos=True, grammar=spec)
    completion = idle_engine.generate(request)
    assert completion.done.finish_reason == "stop" and completion.done.text in spec.choices


def test_a_stop_string_inside_constrained_text_ends_the_request(idle_engine: Engine) -> None:
    reference = run(idle_engine, WORDS, GREEDY)
    words = reference.done.text.split(" ")
    request = Request(ids(idle_engine, "hello the"), GREEDY, max_tokens=48, stop=(words[1],), grammar=WORDS)
    completion = idle_engine.generate(request)
    assert completion.done.finish_reason == "stop" and words[1] not in completion.done.text


def test_a_grammar_that_allows_nothing_ends_the_request_with_an_error_naming_the_step(
    idle_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real = Constraint.mask

    def mask_that_empties(self: Constraint) -> np.ndarray:
        calls["n"] += 1
        allowed = real(self)
        return np.zeros_like(allowed) if calls["n"] == 3 else allowed

    monkeypatch.setattr(Constraint, "mask", mask_that_empties)
    done = run(idle_engine, WORDS, GREEDY).done
    assert done.finish_reason == "error"
    assert done.error is not None and done.error.startswith("decode step 2 (grammar) failed after 2 tokens")
    assert "allows no token" in done.error and len(done.token_ids) == 2


def test_allowed_tokens_all_banned_by_logit_bias_is_an_error_not_a_crash(idle_engine: Engine) -> None:
    spec = GrammarSpec("choice", choices=("sea",))
    first = next(iter(np.flatnonzero(constraint(idle_engine, spec).mask()).tolist()))
    allowed = np.flatnonzero(constraint(idle_engine, spec).mask()).tolist()
    params = SamplingParams(temperature=1.0, seed=1, logit_bias={t: float("-inf") for t in allowed})
    done = run(idle_engine, spec, params).done
    assert first in allowed and done.finish_reason == "error" and "decode step 0" in (done.error or "")


# ---- drafts: cut to the grammar, one mask per verify row, rollback with the kept tokens ---------------


def submitted(engine: Engine, request: Request) -> Sequence:
    engine.submit(request)
    engine.reap_cancelled()
    (seq,) = [s for s in engine.scheduler.waiting if s.request.request_id == request.request_id]
    return seq


def run_with_drafts(
    engine: Engine, request: Request, reference: tuple[int, ...]
) -> tuple[list[TokenEvent], int]:
    """Every decode step carries 3 drafts from `reference`, the second of them wrong (a token the
    grammar forbids, BOS) every other step."""
    seq = submitted(engine, request)
    steps = 0
    while not seq.is_finished:
        if not seq.in_prefill:
            n = len(seq.generated)
            drafts = list(reference[n : n + 3])
            if steps % 2 and len(drafts) > 1:
                drafts[1] = BOS_ID
            seq.draft_ids = drafts
        assert engine.step()
        steps += 1
        if not seq.is_finished:
            assert seq.constraint is not None and seq.constraint.consumed == len(seq.generated)
    events = list(seq.stream)
    return [e for e in events if isinstance(e, TokenEvent)], steps


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
@pytest.mark.parametrize("spec", [WORDS, PERSON], ids=["regex", "json_schema"])
def test_verified_drafts_give_the_tokens_of_plain_constrained_decoding(
    idle_engine: Engine, spec: GrammarSpec, params: SamplingParams
) -> None:
    reference = run(idle_engine, spec, params)
    request = Request(ids(idle_engine, "hello the"), params, max_tokens=48, grammar=spec)
    tokens, steps = run_with_drafts(idle_engine, request, reference.token_ids)
    assert tuple(t.token_id for t in tokens) == reference.token_ids
    assert [t.text for t in tokens] == [t.text for t in reference.tokens]
    if params.logprobs:
        assert [t.logprob for t in tokens] == pytest.approx([t.logprob for t in reference.tokens], abs=1e-5)
    assert steps < len(reference.token_ids), "no step accepted a draft"


def test_drafts_are_cut_to_the_grammar_before_they_are_scheduled(idle_engine: Engine) -> None:
    engine = idle_engine
    reference = run(engine, WORDS, GREEDY)
    seq = submitted(engine, Request(ids(engine, "hello the"), GREEDY, max_tokens=24, grammar=WORDS))
    while seq.in_prefill:
        assert engine.step()
    good = list(reference.token_ids[1:3])
    assert seq.draft_filter is not None
    seq.draft_ids = list(seq.draft_filter([*good, BOS_ID, *good]))
    assert seq.draft_ids == good
    (item,) = engine.scheduler.schedule()
    assert item.tokens == (seq.last_token, *good) and len(item.logit_rows) == len(good) + 1
    seq.stream.cancel()
    engine.reap_cancelled()


def test_each_verify_row_is_masked_by_the_state_after_the_drafts_before_it(
    idle_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Record the mask each row sees in a step with drafts, and compare with row_masks."""
    engine = idle_engine
    reference = run(engine, WORDS, GREEDY)
    seq = submitted(engine, Request(ids(engine, "hello the"), GREEDY, max_tokens=48, grammar=WORDS))
    while seq.in_prefill:
        assert engine.step()
    assert seq.constraint is not None
    drafts = list(reference.token_ids[1:4])
    expected = seq.constraint.row_masks(drafts)
    seen: list[np.ndarray] = []
    real = Constraint.mask

    def recording(self: Constraint) -> np.ndarray:
        mask = real(self)
        seen.append(mask.copy())
        return mask

    monkeypatch.setattr(Constraint, "mask", recording)
    seq.draft_ids = drafts
    assert engine.step()
    assert len(seq.generated) == 5, "three drafts accepted plus the bonus token"
    assert len(seen) == 4 and all(np.array_equal(a, b) for a, b in zip(seen, expected, strict=True))
    assert seq.constraint.consumed == len(seq.generated)
    seq.stream.cancel()
    engine.reap_cancelled()


def test_tokens_dropped_after_a_stop_are_rolled_back_from_the_matcher(idle_engine: Engine) -> None:
    engine = idle_engine
    reference = run(engine, WORDS, GREEDY)
    seq = submitted(engine, Request(ids(engine, "hello the"), GREEDY, max_tokens=3, grammar=WORDS))
    while seq.in_prefill:
        assert engine.step()
    seq.draft_ids = list(reference.token_ids[1:5])  # four drafts; max_tokens keeps only two of them
    assert engine.step()
    assert seq.is_finished and seq.generated == list(reference.token_ids[:3])
    assert seq.constraint is not None and seq.constraint.consumed == 3
