"""What every tool-call syntax shares: the parsed call, the events a streamed parse emits, and the
incremental parser that turns model text into content and calls.

A syntax (one module per call format: `hermes.py`, `llama3.py`, ...) says only how a call opens and
what its body is; :class:`CallStreamParser` does the rest the same way for all of them: text outside
calls is content, released as soon as it cannot be the start of an opening marker; a call is held
until it is complete, then released as a :class:`ToolCall`, or, when its body is not a valid call
(bad JSON, no name, arguments that are not an object, cut off by the token limit), released as the
text it was. So a parse fed the text in any pieces gives exactly the parse of the whole text.
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Union

_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class ToolCall:
    """One function call the model made: its name and its arguments as JSON text (an object)."""

    name: str
    arguments: str
    id: str | None = None
    """The id the model wrote itself (Mistral's 9-character ids), or None: the server makes one."""


@dataclass(frozen=True)
class TextPiece:
    """Content text (outside any call)."""

    text: str


ParseEvent = Union[TextPiece, ToolCall]


@dataclass(frozen=True)
class ParsedOutput:
    """A whole generation split into its content and its calls."""

    content: str
    tool_calls: tuple[ToolCall, ...]


def call_from_json(
    value: Any, arguments_keys: tuple[str, ...] = ("arguments", "parameters")
) -> ToolCall | None:
    """A `ToolCall` from a decoded `{"name": str, "arguments": {...}}` (or the first of
    `arguments_keys` present; arguments given as JSON text of an object are accepted too), or None
    when `value` is not a call."""
    if not isinstance(value, dict) or not isinstance(value.get("name"), str) or not value["name"]:
        return None
    key = next((k for k in arguments_keys if k in value), None)
    arguments: Any = {} if key is None else value[key]
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    call_id = value.get("id") if isinstance(value.get("id"), str) else None
    return ToolCall(value["name"], json.dumps(arguments, ensure_ascii=False), call_id)


def calls_from_json(value: Any) -> tuple[ToolCall, ...] | None:
    """The calls of a decoded call object or JSON list of them (`call_from_json` each), or None when
    the list is empty or one of its items is not a call (then the whole value is text)."""
    items = value if isinstance(value, list) else [value]
    calls = [call_from_json(item) for item in items]
    if not calls or any(c is None for c in calls):
        return None
    return tuple(c for c in calls if c is not None)


def decode_json_prefix(text: str, start: int) -> tuple[Any, int] | None:
    """The JSON value that starts at `start` (after whitespace) and where it ends, or None when the
    text there is not (yet) a whole JSON value."""
    index = start
    while index < len(text) and text[index] in " \t\r\n":
        index += 1
    try:
        return _DECODER.raw_decode(text, index)
    except ValueError:
        return None


@dataclass(frozen=True)
class BodyResult:
    """What a syntax made of the text after an opening marker: the calls and how much text they
    took (`end`), or `calls` None when that text is not a valid call body."""

    calls: tuple[ToolCall, ...] | None
    end: int


class CallSyntax(ABC):
    """One tool-call format: its opening markers and how a call body after one is read."""

    name: str = ""
    """The parser's name (`--tool-call-parser NAME`)."""
    markers: tuple[str, ...] = ()
    """Texts that open a call anywhere in the output."""
    json_at_start: bool = False
    """A bare JSON call (`{"name": ...}`) as the very first text of the output opens a call too."""
    marker_texts: tuple[str, ...] = ()
    """Every marker the syntax writes (opening, closing, inner): a vocabulary that holds one as a
    control token must render it as text for the parser to see it."""
    arguments_key: str = "arguments"
    """The key the arguments go under in the constrained call this syntax's grammar writes."""

    @abstractmethod
    def read_body(self, text: str, start: int, marker: str, final: bool) -> BodyResult | None:
        """Read the call(s) in `text` from `start` (just after `marker`, "" for a bare JSON start).
        None: not decidable yet (more text may complete it; never returned when `final`)."""

    def lark(self, call: str, parallel: bool) -> str:
        """The Lark rules of a constrained output that is only calls: `start` over the rule `call`
        (one call's JSON object, defined by the caller); `parallel` allows more than one."""
        raise NotImplementedError(f"the {self.name} syntax has no constrained form")

    def lark_auto(self, call: str, parallel: bool) -> str | None:
        """Lark rules for `tool_choice` auto: free text, or text then calls, every call constrained
        from its opening marker on; None when this syntax has no such form."""
        return None


def regex_literal(text: str) -> str:
    """`text` as a literal inside a Lark /regex/ (Rust regex syntax, `/` escaped)."""
    return "".join("\\" + ch if ch in _REGEX_SPECIAL else ch for ch in text)


_REGEX_SPECIAL = frozenset("\\.+*?()|[]{}^$#&-~/")


def lazy_after_marker(marker: str, rest: str) -> str:
    """Lark rules for `auto` in a marker syntax: free text that never contains `marker`, or text up
    to the first `marker` followed by the rule `rest` (the constrained calls). The marker ends the
    free text inside one lexeme (PREFIX): llguidance's lexer is greedy, so free text and a separate
    marker literal could never be split apart."""
    literal = regex_literal(marker)
    return (
        f"start: TEXT | PREFIX {rest}\n"
        f"TEXT: /(.|\\n)*/ & ~/(.|\\n)*{literal}(.|\\n)*/\n"
        f"PREFIX: /(.|\\n)*{literal}/ & ~/(.|\\n)*{literal}(.|\\n)+/\n"
    )


def lazy_at_start(call_rules: str) -> str:
    """Lark rules for `auto` in a bare-JSON syntax: text that does not start with `{` (after
    spaces) or `[`, or the constrained calls of `call_rules` (whose start rule is `calls`)."""
    return f"start: TEXT | calls\nTEXT: /[ \\t\\n]*([^{{\\[ \\t\\n](.|\\n)*)?/\n{call_rules}"


@dataclass
class CallStreamParser:
    """Splits model text into content and calls as it arrives (see the module docstring).

    `feed(text)` returns the events the new text settles; `finish()` those of whatever was held.
    """

    syntax: CallSyntax
    _buffer: str = ""
    _at_start: bool = True
    _done: bool = field(default=False, repr=False)

    def feed(self, text: str) -> list[ParseEvent]:
        """Events settled by `text` appended to what came before."""
        self._buffer += text
        return self._drain(final=False)

    def finish(self) -> list[ParseEvent]:
        """Events for the rest (an unfinished call becomes text)."""
        events = self._drain(final=True)
        self._done = True
        return events

    def _drain(self, final: bool) -> list[ParseEvent]:
        events: list[ParseEvent] = []
        while self._buffer:
            step = self._step(final)
            if step is None:
                break
            emitted, consumed = step
            events.extend(emitted)
            self._buffer = self._buffer[consumed:]
        return _merged(events)

    def _step(self, final: bool) -> tuple[list[ParseEvent], int] | None:
        """One settled piece of the buffer: (events, characters consumed), None to wait for more."""
        text = self._buffer
        if self._at_start and self.syntax.json_at_start:
            stripped = text.lstrip()
            if not stripped:
                return ([TextPiece(text)], len(text)) if final else None
            if stripped[0] in "{[":
                body = self.syntax.read_body(text, 0, "", final)
                if body is None:
                    return None
                self._at_start = False
                return self._settle(text, 0, body)
        position, marker = _first_marker(text, self.syntax.markers)
        if marker is None:
            self._at_start = self._at_start and not text.strip()
            keep = 0 if final else _held_suffix(text, self.syntax.markers)
            if keep == len(text):
                return None
            return [TextPiece(text[: len(text) - keep])], len(text) - keep
        if position > 0:
            self._at_start = self._at_start and not text[:position].strip()
            return [TextPiece(text[:position])], position
        self._at_start = False
        body = self.syntax.read_body(text, len(marker), marker, final)
        if body is None:
            return None
        return self._settle(text, 0, body, len(marker))

    def _settle(
        self, text: str, start: int, body: BodyResult, marker_length: int = 0
    ) -> tuple[list[ParseEvent], int]:
        if body.calls is None:
            # Not a call: the marker is content; what follows it is read again as ordinary text.
            consumed = marker_length if marker_length else max(body.end, 1)
            return [TextPiece(text[start : start + consumed])], consumed
        return list(body.calls), body.end


def _merged(events: list[ParseEvent]) -> list[ParseEvent]:
    """Adjacent text pieces joined, empty ones dropped."""
    out: list[ParseEvent] = []
    for event in events:
        if isinstance(event, TextPiece):
            if not event.text:
                continue
            if out and isinstance(out[-1], TextPiece):
                out[-1] = TextPiece(out[-1].text + event.text)
                continue
        out.append(event)
    return out


def _first_marker(text: str, markers: tuple[str, ...]) -> tuple[int, str | None]:
    best, found = len(text), None
    for marker in markers:
        index = text.find(marker)
        if index != -1 and (index < best or (index == best and found and len(marker) > len(found))):
            best, found = index, marker
    return best, found


def _held_suffix(text: str, markers: tuple[str, ...]) -> int:
    """The length of the longest end of `text` that could be the start of a marker."""
    longest = 0
    for marker in markers:
        for size in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[-size:]):
                longest = size
                break
    return longest


def parse_output(syntax: CallSyntax, text: str) -> ParsedOutput:
    """A whole generation's content and calls."""
    parser = CallStreamParser(syntax)
    events = parser.feed(text) + parser.finish()
    events = _merged(events)
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    calls = tuple(e for e in events if isinstance(e, ToolCall))
    return ParsedOutput(content, calls)
