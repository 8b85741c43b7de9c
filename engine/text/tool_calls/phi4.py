"""Phi-4-mini and Granite 3.x: `<|tool_call|>` followed by a JSON list of `{"name": ...,
"arguments": {...}}` (a single object read too), closed by `<|/tool_call|>` (Phi-4-mini) or by the
end of the reply (Granite, whose template asks for "<|tool_call|> followed by a JSON list of tools
used").
"""

from __future__ import annotations

from infer.engine.text.tool_calls.base import (
    BodyResult,
    CallSyntax,
    calls_from_json,
    decode_json_prefix,
    lazy_after_marker,
)

OPEN = "<|tool_call|>"
CLOSE = "<|/tool_call|>"


class Phi4Syntax(CallSyntax):
    """`<|tool_call|>` + a JSON list of calls, `<|/tool_call|>` optional."""

    name = "phi4_mini_json"
    markers = (OPEN,)
    marker_texts = (OPEN, CLOSE)

    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """The list of calls and the closing marker if it follows."""
        decoded = decode_json_prefix(text, start)
        if decoded is None:
            if final or (text[start:].strip() and text[start:].lstrip()[0] not in "[{"):
                return BodyResult(None, start)
            return None
        calls = calls_from_json(decoded[0])
        if calls is None:
            return BodyResult(None, start)
        end = decoded[1]
        tail = text[end:]
        stripped = tail.lstrip()
        if stripped.startswith(CLOSE):
            end += len(tail) - len(stripped) + len(CLOSE)
        elif not final and CLOSE.startswith(stripped):
            return None  # the closing marker may be on its way
        return BodyResult(calls, end)

    def lark(self, call: str, parallel: bool) -> str:
        """`<|tool_call|>[` calls `]<|/tool_call|>`."""
        more = ' (", " ' + call + ")*" if parallel else ""
        return f'start: "{OPEN}[" {call}{more} "]{CLOSE}"\n'

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Free text, or text then `<|tool_call|>` and the constrained list."""
        more = ' (", " ' + call + ")*" if parallel else ""
        return lazy_after_marker(OPEN, "rest") + f'rest: "[" {call}{more} "]{CLOSE}"\n'
