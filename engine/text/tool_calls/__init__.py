"""Tool calls in model text: one module per call syntax, the parser every syntax shares, the choice
of syntax from a model's chat template, and the generic tool prompt for templates that cannot render
tools.

`syntax_named(name)` is `--tool-call-parser NAME`; `syntax_for_template(template)` picks one from the
markers a template writes; `parse_output(syntax, text)` splits a whole generation, and
`CallStreamParser(syntax)` does the same piece by piece (the same result for any cut of the text).
"""

from __future__ import annotations

from infer.engine.text.tool_calls.base import (
    CallStreamParser,
    CallSyntax,
    ParsedOutput,
    ParseEvent,
    TextPiece,
    ToolCall,
    parse_output,
)
from infer.engine.text.tool_calls.generic import GenericJsonSyntax
from infer.engine.text.tool_calls.hermes import HermesSyntax
from infer.engine.text.tool_calls.llama3 import Llama3JsonSyntax
from infer.engine.text.tool_calls.mistral import MistralSyntax
from infer.engine.text.tool_calls.phi4 import Phi4Syntax
from infer.engine.text.tool_calls.prompt import GENERIC_TOOL_SYNTAX, with_generic_tool_prompt

__all__ = [
    "GENERIC_TOOL_SYNTAX",
    "SYNTAX_NAMES",
    "CallStreamParser",
    "CallSyntax",
    "ParseEvent",
    "ParsedOutput",
    "TextPiece",
    "ToolCall",
    "parse_output",
    "syntax_for_template",
    "syntax_named",
    "with_generic_tool_prompt",
]

_SYNTAXES: dict[str, type[CallSyntax]] = {
    "hermes": HermesSyntax,
    "llama3_json": Llama3JsonSyntax,
    "mistral": MistralSyntax,
    "phi4_mini_json": Phi4Syntax,
    "json": GenericJsonSyntax,
}
_ALIASES = {"qwen": "hermes", "qwen3": "hermes", "llama3": "llama3_json", "granite": "phi4_mini_json"}

SYNTAX_NAMES: tuple[str, ...] = tuple(sorted({*_SYNTAXES, *_ALIASES}))
"""Every name `--tool-call-parser` takes (vLLM's names where it has one, plus aliases)."""

_TEMPLATE_MARKERS: tuple[tuple[str, str], ...] = (
    ("<tool_call>", "hermes"),
    ("[TOOL_CALLS]", "mistral"),
    ("<|tool_call|>", "phi4_mini_json"),
    ("<|python_tag|>", "llama3_json"),
    ('"parameters"', "llama3_json"),
)
"""Text a template writes when it renders calls, and the syntax that text means, first match wins."""


def syntax_named(name: str) -> CallSyntax:
    """The syntax `name` names; ValueError listing the names for an unknown one."""
    key = _ALIASES.get(name, name)
    if key not in _SYNTAXES:
        raise ValueError(f"unknown tool-call parser {name!r}; expected one of {', '.join(SYNTAX_NAMES)}")
    return _SYNTAXES[key]()


def syntax_for_template(template: str) -> CallSyntax:
    """The call syntax a chat template teaches its model, from the markers it writes; the generic
    JSON syntax when it writes none of them."""
    for marker, name in _TEMPLATE_MARKERS:
        if marker in template:
            return _SYNTAXES[name]()
    return GenericJsonSyntax()
