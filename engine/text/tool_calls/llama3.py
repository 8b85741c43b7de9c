"""Llama 3.1 / 3.2 / 3.3 JSON tool calls: `{"name": ..., "parameters": {...}}` as the whole reply
(the templates ask for exactly that), optionally after `<|python_tag|>`; several calls are joined
with `;`.

The templates write a past call as `{"name": "...", "parameters": ...}`, and models answer the same;
`<|python_tag|>` opens a call anywhere in the text. A bare JSON call counts only as the very start of
the reply (text that merely contains braces stays text). The built-in tools' Python form
(`brave_search.call(query="...")`) is not parsed: it stays text.
"""

from __future__ import annotations

from infer.engine.text.tool_calls.base import (
    BodyResult,
    CallSyntax,
    ToolCall,
    call_from_json,
    decode_json_prefix,
    lazy_at_start,
)

PYTHON_TAG = "<|python_tag|>"


class Llama3JsonSyntax(CallSyntax):
    """JSON calls at the start of the reply or after `<|python_tag|>`, `;`-separated."""

    name = "llama3_json"
    markers = (PYTHON_TAG,)
    marker_texts = (PYTHON_TAG,)
    json_at_start = True
    arguments_key = "parameters"

    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """One or more `;`-separated call objects."""
        calls: list[ToolCall] = []
        position = start
        while True:
            decoded = decode_json_prefix(text, position)
            if decoded is None:
                if not final:
                    return None
                return BodyResult(None, len(text)) if not calls else BodyResult(tuple(calls), position)
            call = call_from_json(decoded[0])
            if call is None:
                if calls:
                    return BodyResult(tuple(calls), position)
                return BodyResult(None, decoded[1] if not marker else start)
            calls.append(call)
            position = decoded[1]
            rest = text[position:]
            stripped = rest.lstrip()
            if not stripped:
                if not final:
                    return None  # a `;` and another call may follow
                return BodyResult(tuple(calls), len(text))
            if not stripped.startswith(";"):
                return BodyResult(tuple(calls), position)
            after = position + len(rest) - len(stripped) + 1
            if not text[after:].strip() and not final:
                return None
            position = after

    def lark(self, call: str, parallel: bool) -> str:
        """One call object, or (parallel) several joined by `; `."""
        more = ' ("; " ' + call + ")*" if parallel else ""
        return f"start: {call}{more}\n"

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Text that does not open with `{`, or the constrained calls."""
        return lazy_at_start(self.lark(call, parallel).replace("start:", "calls:", 1))
