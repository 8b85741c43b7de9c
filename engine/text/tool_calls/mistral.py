"""Mistral (7B v0.3, Nemo, Small, Devstral): `[TOOL_CALLS]` followed by a JSON list of
`{"name": ..., "arguments": {...}}` (the v3 tokenizers, as Mistral Nemo's template writes past calls),
or by `name[ARGS]{...}` (the v11+ tokenizers; `name[CALL_ID]id[ARGS]{...}` also read), one marker per
call. Mistral's call ids are 9 alphanumeric characters (its templates refuse others).
"""

from __future__ import annotations

import re

from infer.engine.text.tool_calls.base import (
    BodyResult,
    CallSyntax,
    ToolCall,
    call_from_json,
    calls_from_json,
    decode_json_prefix,
    lazy_after_marker,
)

MARKER = "[TOOL_CALLS]"
_NAMED = re.compile(r"([A-Za-z0-9_.\-]+)(?:\[CALL_ID\]([A-Za-z0-9]+))?\[ARGS\]")
_NAMED_PREFIX = re.compile(r"[A-Za-z0-9_.\-]*(\[[A-Za-z0-9_\[\]]*)?$")
"""What the named form may look like before its arguments start (to wait for more text)."""


class MistralSyntax(CallSyntax):
    """`[TOOL_CALLS]` + a JSON list of calls, or `[TOOL_CALLS]name[ARGS]{...}`."""

    name = "mistral"
    markers = (MARKER,)
    marker_texts = (MARKER, "[ARGS]", "[CALL_ID]")

    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """The list (or single object) of calls, or the named form's one call."""
        rest = text[start:].lstrip()
        offset = len(text) - len(rest)
        if not rest:
            return None if not final else BodyResult(None, start)
        if rest[0] in "[{":
            decoded = decode_json_prefix(text, offset)
            if decoded is None:
                return None if not final else BodyResult(None, start)
            calls = calls_from_json(decoded[0])
            return BodyResult(None, start) if calls is None else BodyResult(calls, decoded[1])
        named = _NAMED.match(rest)
        if named is None:
            if not final and _NAMED_PREFIX.match(rest):
                return None
            return BodyResult(None, start)
        decoded = decode_json_prefix(text, offset + named.end())
        if decoded is None:
            return None if not final else BodyResult(None, start)
        call = call_from_json({"name": named.group(1), "arguments": decoded[0]})
        if call is None:
            return BodyResult(None, start)
        return BodyResult((ToolCall(call.name, call.arguments, named.group(2)),), decoded[1])

    def lark(self, call: str, parallel: bool) -> str:
        """`[TOOL_CALLS][` calls `]`: one, or (parallel) several joined by `, `."""
        more = ' (", " ' + call + ")*" if parallel else ""
        return f'start: "{MARKER}[" {call}{more} "]"\n'

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Free text, or text then `[TOOL_CALLS]` and the constrained list."""
        more = ' (", " ' + call + ")*" if parallel else ""
        return lazy_after_marker(MARKER, "rest") + f'rest: "[" {call}{more} "]"\n'
