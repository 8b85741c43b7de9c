"""Constraints on the default model's tokenizer (49k tokens) and on the default model itself.

- The BOS test: no special token (BOS, role markers, EOS before the grammar accepts) is ever allowed
  inside `/(.+)/` or inside a JSON string, on the real tokenizer.
- The audit: 1,000+ sampled tokens of each kind (regex, choice, JSON schema), drawn through the engine
  from adversarial logits (a stub model over the real vocabulary that pushes every special token up),
  replayed through a fresh matcher: no token the grammar did not allow, no special token in the text.
- Ten JSON schemas x {greedy, temperature 1.0 with 5 seeds} on the default model, batched: every
  output parses and validates (`jsonschema`), and with drafts fed at every step (speculation by hand:
  correct drafts, with a wrong one every other step) the tokens are the same.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import jsonschema
import numpy as np
import pytest
from grammar_schemas import SCHEMAS

from infer.engine.batch import ForwardBatch
from infer.engine.grammar import Constraint, GrammarSpec, GrammarVocabulary, audit_tokens
from infer.engine.loader import load_checkpoint
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.runtime.stream import Completion
from infer.engine.sampling import SamplingParams
from infer.engine.text.prompts import prompt_ids
from infer.engine.text.tokenizer import Tokenizer

pytest_plugins = ["conftest_synthetic"]
pytestmark = [pytest.mark.real_model, pytest.mark.usefixtures("single_blas_thread")]

SEEDS = range(5)


@pytest.fixture(scope="module")
def tokenizer(default_model_path: Path) -> Tokenizer:
    return load_checkpoint(default_model_path).tokenizer


@pytest.fixture(scope="module")
def vocabulary(tokenizer: Tokenizer) -> GrammarVocabulary:
    return GrammarVocabulary(tokenizer, tokenizer.vocab_size)


# ---- the BOS test -----------------------------------------------------------------------------------


def check_no_special_inside(tokenizer: Tokenizer, constraint: Constraint, text_ids: list[int]) -> None:
    """At every position while `text_ids` are consumed: no special token allowed but the stop tokens,
    and those only where the grammar accepts."""
    specials = sorted(tokenizer.special_ids)
    stops = sorted(tokenizer.stop_ids)
    others = [t for t in specials if t not in tokenizer.stop_ids]
    assert tokenizer.bos_id in others
    for token in text_ids:
        allowed = constraint.mask()
        assert not allowed[others].any(), f"a special token is allowed after {constraint.consumed} tokens"
        assert allowed[stops].any() == constraint.is_accepting
        assert allowed[token]
        constraint.consume(token)


def test_bos_is_never_legal_inside_a_free_text_regex(
    tokenizer: Tokenizer, vocabulary: GrammarVocabulary
) -> None:
    constraint = Constraint(GrammarSpec("regex", "(.+)"), vocabulary)
    text = tokenizer.encode("report_2024 final<|im_start|>.txt", parse_special=False, add_bos=False)
    check_no_special_inside(tokenizer, constraint, text)
    assert constraint.is_accepting
    assert tokenizer.bos_id not in text, "the special-token text was plain text, as the grammar sees it"


def test_bos_is_never_legal_inside_a_json_string(tokenizer: Tokenizer, vocabulary: GrammarVocabulary) -> None:
    spec = GrammarSpec.json_schema(
        {"type": "object", "properties": {"file": {"type": "string"}}, "required": ["file"]}
    )
    constraint = Constraint(spec, vocabulary)
    text = tokenizer.encode('{"file": "a b<|im_start|>c.txt"}', parse_special=False, add_bos=False)
    check_no_special_inside(tokenizer, constraint, text)
    assert constraint.is_accepting


# ---- the audit, through the engine, from adversarial logits -----------------------------------------


class AdversarialModel:
    """A stand-in model over the real vocabulary: random logits (seeded by the rows' tokens) with every
    special token pushed far above the rest, so only the mask keeps them out. Its KV cache is a tiny
    model's (the scheduler needs slots; the logits ignore it)."""

    def __init__(self, tiny: Engine, vocab_size: int, special_ids: list[int]) -> None:
        self.config = replace(tiny.model.config, vocab_size=vocab_size)
        self.vocab_size = vocab_size
        self._special = np.asarray(special_ids)
        self._tiny = tiny.model

    def make_cache(self, slots: int, capacity: int, dtype: str = "f32") -> object:
        return self._tiny.make_cache(slots, capacity, dtype)

    def forward(self, batch: ForwardBatch, cache: object) -> np.ndarray:
        rows = []
        for r in batch.logit_rows.tolist():
            rng = np.random.default_rng([int(t) for t in batch.token_ids[: r + 1][-4:]] + [r])
            logits = rng.standard_normal(self.vocab_size).astype(np.float32) * 3.0
            logits[self._special] += 12.0
            rows.append(logits)
        return np.stack(rows)


@pytest.fixture(scope="module")
def adversarial_engine(tokenizer: Tokenizer, tiny_gguf: Path) -> Engine:
    tiny = load_engine(tiny_gguf, EngineConfig(ctx_size=8, max_num_seqs=1))
    model = AdversarialModel(tiny, tokenizer.vocab_size, sorted(tokenizer.special_ids))
    return Engine(model, tokenizer, EngineConfig(ctx_size=256, max_num_seqs=64, max_batched_tokens=4096))  # type: ignore[arg-type]


AUDITED = {
    "regex": GrammarSpec("regex", r"[a-z]{1,6}(, [a-z]{1,6}){0,7}\."),
    "choice": GrammarSpec("choice", choices=("yes", "no", "maybe later", "ask me again")),
    "json_schema": GrammarSpec.json_schema(SCHEMAS["nested_object"][1]),
}


@pytest.mark.parametrize("kind", list(AUDITED))
def test_the_audit_finds_no_illegal_token_in_1000_sampled_tokens(
    adversarial_engine: Engine, tokenizer: Tokenizer, kind: str
) -> None:
    engine = adversarial_engine
    spec = AUDITED[kind]
    prompt = tuple(tokenizer.encode("Answer:", add_bos=False))
    completions: list[Completion] = []
    seed = 0
    while sum(len(c.token_ids) for c in completions) < 1000:
        streams = [
            engine.submit(
                Request(prompt, SamplingParams(temperature=1.0, seed=seed + i), max_tokens=64, grammar=spec)
            )
            for i in range(32)
        ]
        completions += [s.result() for s in streams]
        seed += 32
    specials = tokenizer.special_ids - tokenizer.stop_ids
    for completion in completions:
        assert completion.done.finish_reason == "stop", completion.done.error
        assert audit_tokens(spec, engine.grammar_vocabulary, completion.token_ids) is None
        assert not specials & set(completion.token_ids)
        text = completion.done.text
        if kind == "regex":
            assert re.fullmatch(spec.source, text)
        elif kind == "choice":
            assert text in spec.choices
        else:
            jsonschema.validate(json.loads(text), SCHEMAS["nested_object"][1])


# ---- ten schemas on the default model ---------------------------------------------------------------


def runs() -> list[tuple[str, SamplingParams]]:
    return [
        (name, params)
        for name in SCHEMAS
        for params in [
            SamplingParams(temperature=0.0),
            *(SamplingParams(temperature=1.0, seed=s) for s in SEEDS),
        ]
    ]


@pytest.mark.slow
def test_ten_schemas_validate_greedy_and_sampled_with_and_without_drafts(default_model_path: Path) -> None:
    engine = load_engine(
        default_model_path,
        EngineConfig(ctx_size=128, max_num_seqs=64, max_batched_tokens=4096),
        cpu_kernels="exact",
    )
    requests = []
    for name, params in runs():
        prompt, schema = SCHEMAS[name]
        ids = prompt_ids(engine.tokenizer, prompt=f"{prompt}\n", chat=False)
        requests.append(
            (
                name,
                lambda ids=ids, params=params, schema=schema: Request(
                    tuple(ids), params, max_tokens=48, grammar=GrammarSpec.json_schema(schema)
                ),
            )
        )

    steps = engine.steps
    plain = [engine.submit(make()) for _, make in requests]
    results = [stream.result() for stream in plain]
    for (name, _), completion in zip(requests, results, strict=True):
        assert completion.done.finish_reason == "stop", (name, completion.done.text)
        jsonschema.validate(json.loads(completion.done.text), SCHEMAS[name][1])

    # Speculation by hand: every sequence gets 3 drafts per step from its plain run, the second one
    # wrong every other step; the tokens must not change.
    plain_steps, steps = engine.steps - steps, engine.steps
    streams = [engine.submit(make()) for _, make in requests]
    engine.reap_cancelled()
    by_id = {s.request_id: results[i].token_ids for i, s in enumerate(streams)}
    step = 0
    while engine.active_sequences:
        for seq in engine.scheduler.running:
            if not seq.in_prefill:
                reference = by_id[seq.request.request_id]
                n = len(seq.generated)
                drafts = list(reference[n : n + 3])
                if step % 2 and len(drafts) > 1:
                    drafts[1] = (drafts[1] + 1) % engine.model.vocab_size
                seq.draft_ids = drafts
        engine.step()
        step += 1
    drafted = [stream.result() for stream in streams]
    for (name, _), a, b in zip(requests, results, drafted, strict=True):
        assert b.token_ids == a.token_ids, name
    assert engine.steps - steps < plain_steps, "no step accepted a draft"
