"""Hermes / Qwen 2.5 / Qwen 3 (and the generic tool prompt): `<tool_call>{"name": ..., "arguments":
{...}}</tool_call>`, one block per call, any number of blocks.

Qwen 2.5's template asks for exactly this ("return a json object with function name and arguments
within <tool_call></tool_call> XML tags") and writes past calls the same way; Qwen 3's and Hermes
2 Pro / 3's templates too. A block whose body is not one call object is text; a block still open at
the end of the output is a call when its body is already a whole call (the end token closed it).
"""

from __future__ import annotations

from infer.engine.text.tool_calls.base import (
    BodyResult,
    CallSyntax,
    call_from_json,
    decode_json_prefix,
    lazy_after_marker,
)

OPEN = "<tool_call>"
CLOSE = "</tool_call>"


class HermesSyntax(CallSyntax):
    """`<tool_call>` JSON `</tool_call>` blocks."""

    name = "hermes"
    markers = (OPEN,)
    marker_texts = (OPEN, CLOSE)

    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """The call between the marker and `</tool_call>` (or the end, when `final`)."""
        close = text.find(CLOSE, start)
        if close == -1 and not final:
            return None
        body_end = len(text) if close == -1 else close
        decoded = decode_json_prefix(text[:body_end], start)
        if decoded is None or text[decoded[1] : body_end].strip():
            return BodyResult(None, start)
        call = call_from_json(decoded[0])
        if call is None:
            return BodyResult(None, start)
        return BodyResult((call,), body_end if close == -1 else close + len(CLOSE))

    def lark(self, call: str, parallel: bool) -> str:
        """Blocks `<tool_call>\\n{call}\\n</tool_call>`, one or (parallel) more, a newline between."""
        more = ' ("\\n" block)*' if parallel else ""
        return f'start: block{more}\nblock: "{OPEN}\\n" {call} "\\n{CLOSE}"\n'

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Free text without the marker, or text up to the first marker then blocks."""
        more = ' ("\\n" block)*' if parallel else ""
        return lazy_after_marker(OPEN, "rest") + (
            f'rest: "\\n" {call} "\\n{CLOSE}"{more}\nblock: "{OPEN}\\n" {call} "\\n{CLOSE}"\n'
        )
