"""The constrained form of a tool call: a Lark grammar that allows only a call syntax's blocks, with
each call's JSON valid against the called function's parameters schema.

`tool_choice: "required"` gets the grammar over every function, a named function the grammar over
that one; `auto` gets the syntax's lazy form where it has one (free text that never contains the
opening marker, then calls constrained from the marker on). The grammar is an ordinary
`GrammarSpec` of kind lark (bounds, worker compile, masks), so a hostile schema is refused the way a
hostile `response_format` is, and special tokens are never allowed inside it.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from infer.engine.grammar.spec import JSON_OPTIONS, GrammarError, GrammarSpec
from infer.engine.text.reasoning import ThinkingStart, after_thinking
from infer.engine.text.tool_calls.base import CallSyntax


@dataclass(frozen=True)
class FunctionSchema:
    """A function a call may name, and the JSON schema of its arguments (an object)."""

    name: str
    parameters: dict[str, Any]


def call_schema(functions: Sequence[FunctionSchema], arguments_key: str) -> dict[str, Any]:
    """The JSON schema of one call object `{"name": <one of the functions>, <arguments_key>: ...}`,
    name first (llguidance writes properties in schema order)."""
    shapes = [
        {
            "type": "object",
            "properties": {"name": {"const": f.name}, arguments_key: f.parameters or {"type": "object"}},
            "required": ["name", arguments_key],
            "additionalProperties": False,
        }
        for f in functions
    ]
    schema = shapes[0] if len(shapes) == 1 else {"anyOf": shapes}
    # The fixed layout of every constrained JSON (spec.JSON_OPTIONS), which an inline `%json` takes
    # from the schema's `x-guidance` key: a small model cannot wander into endless whitespace.
    return {"x-guidance": JSON_OPTIONS, **schema}


def tool_call_grammar(
    syntax: CallSyntax,
    functions: Sequence[FunctionSchema],
    *,
    mode: Literal["required", "auto"],
    parallel: bool,
    parameter: str = "tools",
    thinking: ThinkingStart | None = None,
) -> GrammarSpec | None:
    """The constraint for a tool-calling request: only calls (`required`, also a named function:
    pass just that one), or text with constrained calls (`auto`; None when `syntax` has no lazy
    form). `thinking`: the reply may (`closed`) or does (`open`) start with a reasoning block, which
    stays free text and the grammar applies after it (`reasoning.after_thinking`). GrammarError
    (naming `parameter`) for a schema llguidance refuses or that is too large."""
    if not functions:
        raise GrammarError("no function to call", parameter)
    schema = json.dumps(call_schema(functions, syntax.arguments_key), ensure_ascii=False)
    rules = syntax.lark("call", parallel) if mode == "required" else syntax.lark_auto("call", parallel)
    if rules is None:
        return None
    if thinking is not None:
        rules = after_thinking(rules, thinking)
    return GrammarSpec("lark", f"{rules}call: %json {schema}\n", parameter=parameter)
