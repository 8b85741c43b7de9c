"""Digit caps and layouts of infer's JSON-schema grammars (engine/grammar/json_bounds.py, json_layout.py)."""

from __future__ import annotations

import json

import pytest
from grammar_bytes import matches

from infer.engine.grammar import GrammarError, GrammarSpec
from infer.engine.grammar.json_bounds import ANY_VALUE_NAME, bound_numbers


def schema_grammar(schema: dict) -> str:
    return GrammarSpec.json_schema(schema).grammar


def test_an_integer_has_at_most_16_digits_unless_the_schema_bounds_it() -> None:
    grammar = schema_grammar({"type": "integer"})
    assert matches(grammar, "1234567890123456") and matches(grammar, "-9999999999999999")
    assert not matches(grammar, "12345678901234567")
    assert not matches(grammar, "1" * 33)
    wide = schema_grammar({"type": "integer", "minimum": 0, "maximum": 10**18})
    assert matches(wide, str(10**18)) and not matches(wide, "-1")


def test_a_number_has_at_most_16_integral_digits_and_10_decimals() -> None:
    grammar = schema_grammar({"type": "number"})
    for text in ("0", "-0.359", "12.50", "1600", "1.0123456789", "1234567890123456.5"):
        assert matches(grammar, text), text
    for text in ("1.01234567891", "12345678901234567", "1e5", "01"):
        assert not matches(grammar, text), text
    halves = schema_grammar({"type": "number", "multipleOf": 0.5})
    assert matches(halves, "2.5") and not matches(halves, "2.25")


def test_numbers_inside_open_values_and_json_object_are_bounded() -> None:
    for grammar in (GrammarSpec("json_object").grammar, schema_grammar({"type": "object"})):
        assert matches(grammar, '{"a": [1, 2.5, {"b": null}], "c": true, "d": "x"}')
        assert not matches(grammar, '{"a": 12345678901234567}')
        assert not matches(grammar, '{"a": [{"b": 12345678901234567}]}')
        assert not matches(grammar, "[]")
    assert not matches(schema_grammar({}), "12345678901234567")
    assert matches(schema_grammar({"type": "array"}), '[1, "a", [null]]')


def test_keywords_that_judge_a_value_are_left_alone() -> None:
    schema = {"not": {"type": "integer"}, "if": {"type": "number"}, "then": {"type": "integer"}}
    bounded = bound_numbers(schema)
    assert bounded["not"] == {"type": "integer"} and bounded["if"] == {"type": "number"}
    assert bounded["then"]["maximum"] == 10**16 - 1
    assert schema == {"not": {"type": "integer"}, "if": {"type": "number"}, "then": {"type": "integer"}}


def test_the_any_value_definition_is_added_only_when_used() -> None:
    closed = {"type": "object", "properties": {"n": {"type": "integer"}}, "additionalProperties": False}
    assert "$defs" not in bound_numbers(closed)
    open_ = bound_numbers({"type": "object", "$defs": {"x": {"type": "string"}}})
    assert set(open_["$defs"]) == {"x", ANY_VALUE_NAME}


def test_the_spec_keeps_the_schema_it_was_given() -> None:
    spec = GrammarSpec.json_schema({"type": "integer"})
    assert json.loads(spec.source) == {"type": "integer"}


@pytest.mark.parametrize(
    ("text", "accepted"),
    [
        ('{"a":1,"b":["x","y"]}', True),
        ('{"a": 1, "b": ["x", "y"]}', True),
        ('{ "a" : 1 , "b" : [ "x" , "y" ] }', True),
        ('{\n  "a": 1,\n  "b": [\n    "x"\n  ]\n}', True),
        ('{\n\n\t\t"a": 1}', True),
        ('{\n\n\n"a": 1}', False),  # at most two newlines in a row
        ("{" + " " * 21 + '"a": 1}', False),  # then at most 20 spaces or tabs
        ('{  "a": 1}', False),  # llama.cpp's rule: one space, or newlines then indentation
    ],
)
def test_flexible_whitespace_is_llamacpps_bounded_space_rule(text: str, accepted: bool) -> None:
    schema = {**LAYOUT_SCHEMA, "x-guidance": {"whitespace_flexible": True}}
    assert matches(schema_grammar(schema), text) is accepted


LAYOUT_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}, "b": {"type": "array", "items": {"type": "string"}}},
    "required": ["a"],
}


def test_the_default_layout_is_one_fixed_layout() -> None:
    grammar = schema_grammar(LAYOUT_SCHEMA)
    assert matches(grammar, '{"a": 1, "b": ["x", "y"]}')
    assert not matches(grammar, '{"a":1,"b":["x","y"]}')
    assert not matches(grammar, '{\n  "a": 1\n}')
    spaced = {**LAYOUT_SCHEMA, "x-guidance": {"item_separator": ",", "key_separator": ":"}}
    assert matches(schema_grammar(spaced), '{"a":1,"b":["x","y"]}')


@pytest.mark.parametrize(
    ("guidance", "needle"),
    [
        ({"lenient": True}, "lenient not accepted"),
        ({"coerce_one_of": True}, "coerce_one_of not accepted"),
        ({"whitespace_flexible": "yes"}, "true or false"),
        ({"item_separator": ";"}, "item_separator"),
        ([], "must be an object"),
    ],
)
def test_an_x_guidance_key_infer_would_not_honour_is_refused(guidance: object, needle: str) -> None:
    with pytest.raises(GrammarError, match=needle):
        GrammarSpec.json_schema({**LAYOUT_SCHEMA, "x-guidance": guidance}, parameter="response_format")
