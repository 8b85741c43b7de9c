"""What a request constrains its output to: a `GrammarSpec`, checked once when it is made.

A spec is tokenizer-free (a JSON schema, a regex, a Lark grammar, a list of choices, or any JSON
object); `llguidance` compiles it to its grammar format and checks it here, so an invalid schema,
regex or grammar, or a schema feature llguidance does not implement, is a `GrammarError` naming the
field before any model is loaded or any token generated. The per-model part (the token table) is in
`vocabulary.py`, the per-request state in `constraint.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import llguidance
from llguidance.gbnf_to_lark import GbnfToLarkError, any_to_lark

GrammarKind = Literal["json_schema", "json_object", "regex", "lark", "choice"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "json_object", "regex", "lark", "choice")

JSON_OPTIONS: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
"""llguidance's JSON compiler options: one fixed layout (", " and ": ", no free whitespace), so a
small model cannot wander into endless newlines inside a structure it has to close."""


class GrammarError(ValueError):
    """A constraint that cannot be compiled; `parameter` names the field or flag that held it."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


@dataclass(frozen=True)
class GrammarSpec:
    """One output constraint, validated at construction.

    `source` is the schema as JSON text (json_schema), the pattern (regex) or the Lark grammar
    (lark); `choices` holds the alternatives of kind choice; json_object takes neither.
    `parameter` names where it came from (`response_format`, `--regex`) for error messages.
    """

    kind: GrammarKind
    source: str = ""
    choices: tuple[str, ...] = ()
    parameter: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in GRAMMAR_KINDS:
            raise GrammarError(f"unknown constraint kind {self.kind!r}", self.parameter)
        if self.kind == "choice":
            if not self.choices or any(not c for c in self.choices):
                raise GrammarError("choice needs at least one non-empty choice", self.parameter)
        elif self.kind != "json_object" and not self.source.strip():
            raise GrammarError(f"the {self.kind.replace('_', ' ')} is empty", self.parameter)
        object.__setattr__(self, "_grammar", self._compile())

    @classmethod
    def json_schema(cls, schema: str | dict[str, Any], parameter: str | None = None) -> GrammarSpec:
        """A JSON schema given as a dict or JSON text."""
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as exc:
                raise GrammarError(f"the JSON schema is not valid JSON: {exc}", parameter) from None
        if not isinstance(schema, dict):
            raise GrammarError("a JSON schema must be a JSON object", parameter)
        return cls(
            "json_schema", json.dumps(schema), parameter=parameter
        )  # key order is kept: it is the output order

    @classmethod
    def lark_or_gbnf(cls, text: str, parameter: str | None = None) -> GrammarSpec:
        """A grammar in llguidance's Lark syntax, or in llama.cpp's GBNF (converted by llguidance;
        GBNF is recognised by having no `start:` rule)."""
        try:
            lark = any_to_lark(text)
        except GbnfToLarkError as exc:
            raise GrammarError(f"invalid GBNF grammar: {' '.join(str(exc).split())}", parameter) from None
        return cls("lark", lark, parameter=parameter)

    @property
    def grammar(self) -> str:
        """The llguidance grammar (its JSON form), compiled and checked once at construction."""
        return self._grammar  # type: ignore[attr-defined,no-any-return]

    def describe(self) -> str:
        """A short label for messages and stats: `regex /[0-9]+/`, `json_schema`, ..."""
        if self.kind == "regex":
            return f"regex /{self.source}/"
        if self.kind == "choice":
            return f"choice {list(self.choices)}"
        return self.kind

    def _compile(self) -> str:
        matcher = llguidance.LLMatcher
        try:
            if self.kind == "json_schema":
                grammar = matcher.grammar_from_json_schema(self.source, overrides=JSON_OPTIONS)
            elif self.kind == "json_object":
                grammar = matcher.grammar_from_json_schema({"type": "object"}, overrides=JSON_OPTIONS)
            elif self.kind == "regex":
                grammar = matcher.grammar_from_regex(self.source)
            elif self.kind == "lark":
                grammar = matcher.grammar_from_lark(self.source)
            else:
                alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in self.choices)
                grammar = matcher.grammar_from_lark(f"start: {alternatives}")
        except ValueError as exc:
            raise GrammarError(f"invalid {self.kind.replace('_', ' ')}: {exc}", self.parameter) from None
        is_error, messages = matcher.validate_grammar_with_warnings(grammar)
        if is_error or messages:
            # A warning is a feature llguidance would not enforce: refused, never silently ignored.
            detail = "; ".join(" ".join(m.split()) for m in messages) or "rejected by llguidance"
            raise GrammarError(f"invalid {self.kind.replace('_', ' ')}: {detail}", self.parameter)
        return grammar
