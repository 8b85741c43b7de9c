"""Reasoning ("thinking") blocks in model text: `<think>` ... `</think>` (Qwen3, QwQ, DeepSeek-R1 and
the models trained like them) split from the reply's content, piece by piece.

Two ways a reply can start, told apart by the rendered prompt (`thinking_start`):
- `closed`: the prompt left thinking to the model; a block counts only at the very start of the
  reply (after whitespace): `<think>` opens it, `</think>` closes it, and everything after it is
  content. A reply that does not start with `<think>` is all content, as it was.
- `open`: the template's generation prompt already opened the block (DeepSeek-R1's and QwQ's end
  with `<think>\\n`), so the reply starts inside thinking and only `</think>` appears; a `<think>` the
  model repeats at the start is dropped. Without `</think>` the whole reply is reasoning.

The reasoning is trimmed of the whitespace around it and the content of the whitespace it starts with
(templates write `<think>\\n...\\n</think>\\n\\n`); whitespace at a piece's end is held until text
follows, so a reply fed in any pieces splits exactly as the whole text does.

`after_thinking(rules, start)` is the same rule for a Lark grammar: a tool-call grammar wrapped so
that it applies only after the block, and the text inside the block is free (never a call).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal, Union

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
THINK_MARKERS: tuple[str, ...] = (THINK_OPEN, THINK_CLOSE)
"""The block's markers: a vocabulary that holds one as a control token must render it as text."""

ThinkingStart = Literal["closed", "open"]
"""Where a reply starts: outside a block (`closed`) or inside one the prompt opened (`open`)."""

REASONING_PARSERS: tuple[str, ...] = ("auto", "deepseek_r1", "none", "qwen3", "think")
"""Every name `--reasoning-parser` takes: auto (from the chat template), think (always split
`<think>` blocks; vLLM's `qwen3` and `deepseek_r1` are its aliases) and none (all text is content)."""

_WHITESPACE = " \t\r\n"


def template_thinks(template: str) -> bool:
    """Whether a chat template writes or reads thinking blocks (it mentions `<think>` or `</think>`)."""
    return THINK_OPEN in template or THINK_CLOSE in template


def thinking_start(prompt_tail: str) -> ThinkingStart:
    """`open` when the rendered prompt (its last few tokens' text are enough) ends inside a block
    it opened, `closed` otherwise."""
    return "open" if prompt_tail.rstrip(_WHITESPACE).endswith(THINK_OPEN) else "closed"


def splits_reasoning(parser: str, template: str | None) -> bool:
    """Whether replies are split for `--reasoning-parser parser` and the model's template (None: it
    has none). ValueError for a name not in REASONING_PARSERS."""
    if parser not in REASONING_PARSERS:
        raise ValueError(
            f"unknown reasoning parser {parser!r}; expected one of {', '.join(REASONING_PARSERS)}"
        )
    if parser == "none":
        return False
    if parser == "auto":
        return template is not None and template_thinks(template)
    return True


@dataclass(frozen=True)
class ReasoningPiece:
    """Text inside the thinking block."""

    text: str


@dataclass(frozen=True)
class ContentPiece:
    """Text of the reply proper (after the block, or all of it when there is none)."""

    text: str


ReasoningEvent = Union[ReasoningPiece, ContentPiece]

_State = Literal["start", "reasoning", "after", "content"]


@dataclass
class ReasoningSplitter:
    """Splits a reply into reasoning and content as it arrives (see the module docstring).

    `feed(text)` returns the pieces the new text settles; `finish()` those of whatever was held.
    """

    start: ThinkingStart = "closed"
    _state: _State = field(default="start", init=False)
    _buffer: str = field(default="", init=False)
    _held_space: str = field(default="", init=False)
    _reasoned: bool = field(default=False, init=False)
    """Whether reasoning text was released (its leading whitespace is dropped until then)."""

    def feed(self, text: str) -> list[ReasoningEvent]:
        """Pieces settled by `text` appended to what came before."""
        self._buffer += text
        return _merged(self._drain(final=False))

    def finish(self) -> list[ReasoningEvent]:
        """Pieces for the rest (a marker cut off at the end is the text it is)."""
        events = self._drain(final=True)
        self._held_space = ""  # reasoning's trailing whitespace: trimmed
        return _merged(events)

    def _drain(self, final: bool) -> list[ReasoningEvent]:
        events: list[ReasoningEvent] = []
        while True:
            before = (self._state, len(self._buffer))
            events += self._step(final)
            if (self._state, len(self._buffer)) == before:
                return events

    def _step(self, final: bool) -> list[ReasoningEvent]:
        text = self._buffer
        if self._state == "start":
            stripped = text.lstrip(_WHITESPACE)
            if THINK_OPEN.startswith(stripped) and not final:
                return []  # whitespace, or the start of `<think>`: not decided yet
            if stripped.startswith(THINK_OPEN):
                self._state, self._buffer = "reasoning", stripped[len(THINK_OPEN) :]
                return []
            if self.start == "open":
                self._state = "reasoning"
                return []
            self._state, self._buffer = "content", ""
            return [ContentPiece(text)]
        if self._state == "reasoning":
            close = text.find(THINK_CLOSE)
            if close != -1:
                self._state, self._buffer = "after", text[close + len(THINK_CLOSE) :]
                events = self._reasoning(text[:close])
                self._held_space = ""  # the whitespace before `</think>` is trimmed
                return events
            keep = 0 if final else _held_suffix(text, THINK_CLOSE)
            self._buffer = text[len(text) - keep :]
            return self._reasoning(text[: len(text) - keep])
        if self._state == "after":
            stripped = text.lstrip(_WHITESPACE)
            self._buffer = stripped
            if stripped:
                self._state = "content"
            return []
        self._buffer = ""
        return [ContentPiece(text)] if text else []

    def _reasoning(self, text: str) -> list[ReasoningEvent]:
        """Reasoning text, its leading whitespace dropped and its trailing whitespace held."""
        text = self._held_space + text
        if not self._reasoned:
            text = text.lstrip(_WHITESPACE)
        kept = text.rstrip(_WHITESPACE)
        self._held_space = text[len(kept) :]
        if not kept:
            return []
        self._reasoned = True
        return [ReasoningPiece(kept)]


def _held_suffix(text: str, marker: str) -> int:
    """The length of the longest end of `text` that could be the start of `marker`."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-size:]):
            return size
    return 0


def _merged(events: list[ReasoningEvent]) -> list[ReasoningEvent]:
    """Adjacent pieces of one kind joined, empty ones dropped."""
    out: list[ReasoningEvent] = []
    for event in events:
        if not event.text:
            continue
        if out and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)
            continue
        out.append(event)
    return out


@dataclass(frozen=True)
class SplitReply:
    """A whole reply's reasoning (None when it had none) and content."""

    reasoning: str | None
    content: str


def split_reasoning(text: str, start: ThinkingStart = "closed") -> SplitReply:
    """A whole reply split as `ReasoningSplitter` splits it."""
    splitter = ReasoningSplitter(start)
    events = splitter.feed(text) + splitter.finish()
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningPiece))
    content = "".join(e.text for e in events if isinstance(e, ContentPiece))
    return SplitReply(reasoning or None, content)


# -- the grammar form ------------------------------------------------------------------------------
_SPACE = "[ \\t\\r\\n]*"
_ANY = "(.|\\n)*"
_CLOSE = "<\\/think>"
_ONLY_SPACE_AFTER_CLOSE = f"~/{_ANY}{_CLOSE}{_ANY}[^ \\t\\r\\n]{_ANY}/"
"""Nothing but whitespace after the first `</think>` (so the lexeme ends at the block's end)."""

_FREE_TEXT = re.compile(r"^(TEXT|PREFIX): (.*)$", re.MULTILINE)
"""The free-text lexemes of the lazy (`auto`) call grammars (tool_calls/base.py's
`lazy_after_marker` and `lazy_at_start` name them so)."""


def after_thinking(rules: str, start: ThinkingStart) -> str:
    """Lark rules (`start` over a call grammar) that allow a thinking block first and apply `rules`
    only after it, so text inside the block is never read as a call's opening.

    `closed`: an optional `<think>...</think>` at the start (whitespace around it allowed), and the
    free text of a lazy grammar may not start with `<think>` (so a block is always the block).
    `open`: the reply starts inside the block; a grammar that must produce calls (`rules` without
    free text: `required`, a named function) must first close it with `</think>`, a lazy one may also
    end inside it, and its free text never holds `</think>`.
    """
    body = rules.replace("start:", "after_think:", 1)
    lazy = bool(_FREE_TEXT.search(body))
    if start == "closed":
        block = f"/{_SPACE}<think>{_ANY}{_CLOSE}{_SPACE}/ & {_ONLY_SPACE_AFTER_CLOSE}"
        exclusion = f"~/{_SPACE}<think>{_ANY}/"
        head = "start: THINK after_think | after_think\n"
    else:
        block = f"/{_ANY}{_CLOSE}{_SPACE}/ & {_ONLY_SPACE_AFTER_CLOSE}"
        exclusion = f"~/{_ANY}{_CLOSE}{_ANY}/"
        head = "start: THINK after_think | after_think\n" if lazy else "start: THINK after_think\n"
    body = _FREE_TEXT.sub(lambda m: f"{m[1]}: {m[2]} & {exclusion}", body)
    return f"{head}THINK: {block}\n{body}"
