"""llama.cpp's JSON-schema integration cases, matched through infer's schema path (no model).

`tests/data/llamacpp_schema_cases.json` holds every `test_schema(...)` case of llama.cpp's
`tests/test-grammar-integration.cpp` (llama-cpp-python 0.3.36 sdist; regenerate with
`scripts/extract_llamacpp_schema_tests.py`): a schema, the strings its grammar must accept and the
ones it must reject. Each schema goes through `GrammarSpec.json_schema` (infer's digit caps
included), with `"x-guidance": {"whitespace_flexible": true}` (infer's opt-in to llama.cpp's
bounded whitespace rule: the strings are written with the spacing people use, and infer's default
is one fixed layout) and each string is matched byte by byte by llguidance, as llama.cpp's test
matches it by its grammar's stacks. The differences are listed in DIFFERENCES, each with its reason;
they run as strict xfails, so one that stops differing fails the test.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from grammar_bytes import matches

from infer.engine.grammar import GrammarError, GrammarSpec

CASES = json.loads((Path(__file__).parent / "data" / "llamacpp_schema_cases.json").read_text())["cases"]

DIFFERENCES: dict[tuple[str, str], str] = {
    (
        "min+max items",
        "1",
    ): "the schema has `items` but no `type`; JSON Schema applies `items` to arrays only, so `1` is "
    "valid (llguidance follows the spec; llama.cpp's converter assumes an array)",
    (
        "object properties",
        '{ "number": 1600, "street_name": "Pennsylvania", "street_type":"Avenue", "direction":"NW"}',
    ): "`additionalProperties` left out means any further property is allowed (the spec, and "
    "llguidance); llama.cpp's converter defaults it to false for generation",
}
"""(case description, string) -> why infer's verdict differs from llama.cpp's."""

REFUSED: dict[str, str] = {
    "required props": "`uniqueItems` is refused (llguidance cannot enforce it, and infer accepts no "
    "keyword it would ignore); llama.cpp ignores it. The strings are matched without it.",
}
"""Case description -> why infer refuses its schema (the remaining keywords are still checked)."""


def _params() -> list:
    params = []
    for index, case in enumerate(CASES):
        for verdict, strings in ((True, case["pass"]), (False, case["fail"])):
            for text in strings:
                reason = DIFFERENCES.get((case["description"], text))
                marks = [pytest.mark.xfail(reason=reason, strict=True)] if reason else []
                label = f"{index}-{'pass' if verdict else 'fail'}-{text[:30]}"
                params.append(pytest.param(index, text, verdict, marks=marks, id=label))
    return params


def _schema(index: int) -> dict:
    case = CASES[index]
    schema = {**case["schema"], "x-guidance": {"whitespace_flexible": True}}
    if case["description"] in REFUSED:
        with pytest.raises(GrammarError, match="uniqueItems"):
            GrammarSpec.json_schema(schema)
        schema = json.loads(json.dumps(schema).replace('"uniqueItems": true', '"description": "-"'))
    return schema


def test_the_data_file_holds_every_case_of_the_cpp_file() -> None:
    assert len(CASES) == 33
    assert sum(len(c["pass"]) + len(c["fail"]) for c in CASES) == 248


@pytest.mark.parametrize(("index", "text", "accepted"), _params())
def test_llamacpp_schema_case(index: int, text: str, accepted: bool) -> None:
    grammar = GrammarSpec.json_schema(_schema(index)).grammar
    assert matches(grammar, text) is accepted
