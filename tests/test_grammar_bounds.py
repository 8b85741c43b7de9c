"""Grammars and schemas that crashed llguidance or leaked its internals (issue 29, items 1 and 2): each
is a GrammarError naming its field, before llguidance's native code sees it or in the compile worker,
and the process that asked is never the one that crashes."""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pytest
from hostile_requests import defs_chain, gbnf_chain, lark_chain

from infer.engine.grammar import Constraint, GrammarError, GrammarSpec, GrammarViolationError, limits
from infer.engine.grammar.compiler import CompileRefused, GrammarCompiler
from infer.engine.grammar.vocabulary import on_deep_stack
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Engine:
    return load_engine(
        tiny_gguf, EngineConfig(ctx_size=128, max_num_seqs=2, max_batched_tokens=64, batch_size=8)
    )


def _refused(make, needle: str, parameter: str = "grammar") -> str:  # type: ignore[no-untyped-def]
    started = time.monotonic()
    with pytest.raises(GrammarError) as info:
        make()
    assert time.monotonic() - started < 15
    message = str(info.value)
    assert info.value.parameter == parameter
    assert needle in message, message
    assert "\n" not in message and len(message) <= 400 and "non-verbose" not in message, message
    return message


# -- bounds, checked before llguidance ------------------------------------------------------------
def test_a_deep_defs_chain_is_refused_by_its_depth() -> None:
    message = _refused(lambda: GrammarSpec.json_schema(defs_chain(1000), "response_format"), "levels deep",
                       "response_format")  # fmt: skip
    assert f"at most {limits.MAX_SCHEMA_DEPTH}" in message


def test_long_lark_and_gbnf_chains_are_refused_by_their_rule_count() -> None:
    _refused(lambda: GrammarSpec.lark_or_gbnf(lark_chain(3000), "grammar"), "3002 rules")
    _refused(lambda: GrammarSpec.lark_or_gbnf(gbnf_chain(2000), "grammar"), "2002 rules")
    _refused(lambda: GrammarSpec.lark_or_gbnf(gbnf_chain(10_000), "grammar"), "bytes")


def test_a_schema_inside_a_lark_grammar_is_bounded_too() -> None:
    grammar = "start: %json " + json.dumps(defs_chain(400))
    _refused(lambda: GrammarSpec.lark_or_gbnf(grammar, "grammar"), "inside the grammar")


@pytest.mark.parametrize(
    ("schema", "depth"),
    [
        ({"type": "string"}, 1),
        ({"type": "object", "properties": {"a": {"type": "string"}}}, 3),
        (defs_chain(10), 33),
        # a recursive schema counts its cycle once
        ({"$ref": "#/$defs/n", "$defs": {"n": {"type": "array", "items": {"$ref": "#/$defs/n"}}}}, 4),
        # a $ref is as deep as what it names, plus itself: JSON pointer, $anchor, $id
        ({"properties": {"p": {"$ref": "#/$defs/a"}}, "$defs": {"a": {"items": {"items": {}}}}}, 6),
        ({"properties": {"p": {"$ref": "#x"}}, "$defs": {"a": {"$anchor": "x", "items": {"items": {}}}}}, 6),
        (
            {
                "properties": {"p": {"$ref": "urn:a"}},
                "$defs": {"a": {"$id": "urn:a", "items": {"items": {}}}},
            },
            6,
        ),
    ],
)
def test_schema_depth_follows_refs(schema: dict, depth: int) -> None:
    assert limits.schema_depth(schema) == depth


def test_rule_counts_cover_both_syntaxes() -> None:
    assert limits.count_rules(lark_chain(10)) == 12
    assert limits.count_rules(gbnf_chain(10)) == 12
    assert limits.count_rules('start: a\n  a[lazy]: "x"\nB: /b/') == 3


def test_a_legitimate_schema_near_the_bounds_still_compiles() -> None:
    spec = GrammarSpec.json_schema(defs_chain(60), "response_format")  # 183 levels
    assert spec.grammar
    properties = {f"field_{i}": {"type": "string", "maxLength": 20} for i in range(300)}
    assert GrammarSpec.json_schema({"type": "object", "properties": properties}).grammar
    assert GrammarSpec.lark_or_gbnf(gbnf_chain(400), "grammar").kind == "lark"


# -- llguidance's own refusals: one line, naming the field ------------------------------------------
@pytest.mark.parametrize(
    ("grammar", "needle"),
    [
        ("", "empty"),
        ("   \n", "empty"),
        ("root ::= foo", "Rule 'foo' not found"),
        ('x ::= "a"', "No 'root' rule found"),
        ("root ::= (", "invalid GBNF grammar"),
        ('start: "a" b', "b"),
    ],
)
def test_a_broken_grammar_is_one_line_naming_the_field(grammar: str, needle: str) -> None:
    _refused(lambda: GrammarSpec.lark_or_gbnf(grammar, "grammar"), needle)


def test_a_regex_bomb_fails_in_the_worker_without_internal_state() -> None:
    message = _refused(lambda: GrammarSpec.lark_or_gbnf("start: /(a{1000}){1000}/", "grammar"), "")
    assert "too many expressions" in message or "CPU time" in message or "longer than" in message, message
    assert "<" not in message, message


# -- the worker ---------------------------------------------------------------------------------
def test_a_grammar_that_crashes_the_compiler_is_a_refusal_and_is_remembered() -> None:
    compiler = GrammarCompiler()
    try:
        started = time.monotonic()
        with pytest.raises(CompileRefused, match="crashed the grammar compiler"):
            compiler.compile("lark", lark_chain(4000))  # past the bounds: only the worker stands here
        assert compiler.worker_pid is None
        assert compiler.compile("lark", 'start: "ok"').grammar  # a fresh worker
        pid = compiler.worker_pid
        with pytest.raises(CompileRefused, match="crashed"):
            compiler.compile("lark", lark_chain(4000))  # from the cache: no worker died
        assert compiler.worker_pid == pid
        assert time.monotonic() - started < 30
    finally:
        compiler.close()


def test_a_deep_stack_thread_returns_and_raises() -> None:
    assert on_deep_stack(lambda: 7, 16) == 7
    with pytest.raises(ZeroDivisionError):
        on_deep_stack(lambda: 1 // 0, 16)


# -- matching -----------------------------------------------------------------------------------
WORDS = GrammarSpec("regex", "[a-z]{1,40}", parameter="grammar")


def test_a_mask_past_its_time_fails_the_constraint(engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = WORDS
    constraint = Constraint(spec, engine.grammar_vocabulary)
    first = constraint.mask()
    assert first.any() and not first.flags.writeable  # kept from when it was made
    token = int(np.flatnonzero(first)[0])
    constraint.consume(token)
    monkeypatch.setattr(limits, "MASK_TIME_LIMIT_S", 0.0)
    with pytest.raises(GrammarViolationError) as info:
        constraint.mask()
    assert info.value.parameter == "grammar"
    assert "too complex to match" in str(info.value)
    assert constraint.allowed_drafts([token]) == []
    with pytest.raises(GrammarError, match="too complex"):
        Constraint(spec, engine.grammar_vocabulary)  # the first mask is timed too


def test_a_mask_past_its_time_mid_request_ends_it_with_an_error_naming_the_field(
    engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    request = Request((1, 2, 3), SamplingParams(temperature=0.0), max_tokens=8, grammar=WORDS)
    stream = engine.submit(request)  # the start mask is computed here, within its time
    monkeypatch.setattr(limits, "MASK_TIME_LIMIT_S", 0.0)
    done = stream.result().done
    assert done.finish_reason == "error"
    assert done.error_param == "grammar"
    assert len(done.token_ids) == 1  # the first token came from the start mask
    assert "too complex to match" in (done.error or "")
    monkeypatch.undo()
    assert engine.generate(request).done.finish_reason in ("stop", "length")  # the engine serves on
