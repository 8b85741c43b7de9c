"""Gemma and other models without a call syntax of their own: the reply is a JSON call,
`{"name": ..., "arguments": {...}}` (or `"parameters"`), a JSON list of them, or
`{"tool_calls": [...]}`; only as the whole reply, from its first character (text with braces in it
stays text).
"""

from __future__ import annotations

from typing import Any

from infer.engine.text.tool_calls.base import (
    BodyResult,
    CallSyntax,
    ToolCall,
    calls_from_json,
    decode_json_prefix,
    lazy_at_start,
)


class GenericJsonSyntax(CallSyntax):
    """A bare JSON call (or list of calls) as the reply."""

    name = "json"
    json_at_start = True

    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """The JSON value at the start, when it is a call or a list of calls."""
        decoded = decode_json_prefix(text, start)
        if decoded is None:
            return None if not final else BodyResult(None, len(text))
        calls = _calls(decoded[0])
        if calls is None:
            return BodyResult(None, decoded[1])
        return BodyResult(calls, decoded[1])

    def lark(self, call: str, parallel: bool) -> str:
        """One call object, or (parallel) also a JSON list of them."""
        if parallel:
            return f'start: {call} | "[" {call} (", " {call})* "]"\n'
        return f"start: {call}\n"

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Text that does not open with `{` or `[`, or the constrained call(s)."""
        return lazy_at_start(self.lark(call, parallel).replace("start:", "calls:", 1))


def _calls(value: Any) -> tuple[ToolCall, ...] | None:
    if isinstance(value, dict) and isinstance(value.get("tool_calls"), list):
        value = value["tool_calls"]
    items = value if isinstance(value, list) else [value]
    return calls_from_json([item.get("function", item) if isinstance(item, dict) else item for item in items])
