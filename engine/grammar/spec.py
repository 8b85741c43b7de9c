"""What a request constrains its output to: a `GrammarSpec`, checked once when it is made.

A spec is tokenizer-free (a JSON schema, a regex, a Lark grammar, a list of choices, or any JSON
object). Making one checks it against the bounds of `limits.py` (size, rules, nesting), then has
`llguidance` compile and check it in the compile worker (`compiler.py`), so an invalid, too large or
too deep schema, regex or grammar, a schema feature llguidance does not implement, or one that
crashes the compiler, is a `GrammarError` naming the field before any model is loaded or any token
generated. The per-model part (the token table) is in `vocabulary.py`, the per-request state in
`constraint.py`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

from infer.engine.grammar import limits
from infer.engine.grammar.compiler import CompileRefused, default_compiler
from infer.engine.grammar.json_bounds import ANY_OBJECT, bound_numbers
from infer.engine.grammar.json_layout import FIXED, LayoutError, layout_options

GrammarKind = Literal["json_schema", "json_object", "regex", "lark", "choice"]
GRAMMAR_KINDS: tuple[GrammarKind, ...] = ("json_schema", "json_object", "regex", "lark", "choice")

JSON_OPTIONS: dict[str, Any] = FIXED
"""llguidance's JSON compiler options where no schema chooses (json_object, a grammar's `%json`):
the fixed layout of `json_layout.py`."""


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
        self._check_bounds()
        kind, source, options = self.kind, self.source, JSON_OPTIONS
        if kind == "json_object":  # any object, as a schema: so its numbers are bounded too
            kind, source = "json_schema", json.dumps(ANY_OBJECT)
        if kind == "json_schema":  # llama.cpp's digit caps (json_bounds.py); its layout (json_layout.py)
            schema = json.loads(source)
            try:
                options = layout_options(schema)
            except LayoutError as exc:
                raise GrammarError(f"invalid JSON schema: {exc}", self.parameter) from None
            source = json.dumps(bound_numbers(schema))
        try:
            compiled = default_compiler().compile(kind, source, self.choices, options)
        except CompileRefused as exc:
            raise GrammarError(str(exc), self.parameter) from None
        object.__setattr__(self, "_grammar", compiled.grammar)

    @classmethod
    def json_schema(cls, schema: str | dict[str, Any], parameter: str | None = None) -> GrammarSpec:
        """A JSON schema given as a dict or JSON text."""
        try:
            if isinstance(schema, str):
                limits.check_size(schema, "JSON schema")
                schema = json.loads(schema)
            if not isinstance(schema, dict):
                raise GrammarError("a JSON schema must be a JSON object", parameter)
            limits.check_schema(schema)
            text = json.dumps(schema)  # key order is kept: it is the output order
        except json.JSONDecodeError as exc:
            raise GrammarError(f"the JSON schema is not valid JSON: {exc}", parameter) from None
        except RecursionError:
            raise GrammarError("the JSON schema nests too deeply", parameter) from None
        except limits.BoundsError as exc:
            raise GrammarError(str(exc), parameter) from None
        return cls("json_schema", text, parameter=parameter)

    @classmethod
    def lark_or_gbnf(cls, text: str, parameter: str | None = None) -> GrammarSpec:
        """A grammar in llguidance's Lark syntax, or in llama.cpp's GBNF (converted by llguidance in
        the compile worker; GBNF is recognised by having no `start:` rule)."""
        if not text.strip():
            raise GrammarError("the grammar is empty", parameter)
        try:
            limits.check_grammar(text)
            compiled = default_compiler().compile("lark_or_gbnf", text, (), JSON_OPTIONS)
        except (limits.BoundsError, CompileRefused) as exc:
            raise GrammarError(str(exc), parameter) from None
        return cls("lark", compiled.lark, parameter=parameter)

    @property
    def grammar(self) -> str:
        """The llguidance grammar (its JSON form), compiled and checked once at construction."""
        return self._grammar  # type: ignore[attr-defined,no-any-return]

    def describe(self) -> str:
        """A short label for messages and stats: `regex /[0-9]+/`, `json_schema`, ... (at most ~70
        characters: a long pattern or choice list is cut)."""
        if self.kind == "regex":
            label = f"regex /{self.source}/"
        elif self.kind == "choice":
            label = f"choice {list(self.choices)}"
        else:
            return self.kind
        return label if len(label) <= 70 else label[:67] + "..."

    def _check_bounds(self) -> None:
        """GrammarError if the source is larger or deeper than `limits.py` allows."""
        try:
            if self.kind == "choice":
                if len(self.choices) > limits.MAX_CHOICES:
                    raise limits.BoundsError(
                        f"{len(self.choices)} choices; at most {limits.MAX_CHOICES} are accepted"
                    )
                limits.check_size("".join(self.choices), "choice list")
            elif self.kind == "lark":
                limits.check_grammar(self.source)
            elif self.kind == "json_schema":
                limits.check_size(self.source, "JSON schema")
                limits.check_schema(json.loads(self.source))
            else:
                limits.check_size(self.source, self.kind.replace("_", " "))
        except (ValueError, RecursionError) as exc:  # BoundsError, or schema text that is not JSON
            message = str(exc) if isinstance(exc, limits.BoundsError) else f"invalid JSON schema: {exc}"
            raise GrammarError(message, self.parameter) from None
