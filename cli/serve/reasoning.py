"""Reasoning blocks on the server: whether a request's replies are split into reasoning and content
(`--reasoning-parser`, the chat template, the rendered prompt), and the reader that turns one
choice's text into reasoning, content and calls, as chat completions (`reasoning_content`) and
responses (a `reasoning` output item) carry them.

As llama-server (`--reasoning-format deepseek`) and vLLM (`--reasoning-parser qwen3`) do: the text
of a `<think>` block is the reply's reasoning, never its content, and never read for tool calls;
calls are read only from the content after it (engine/text/reasoning.py splits the text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from infer.cli.serve.tools import CallDelta, ContentDelta, ReplySplitter, new_call_id
from infer.engine import (
    THINK_CLOSE,
    THINK_MARKERS,
    CallSyntax,
    ContentPiece,
    GrammarSpec,
    ReasoningPiece,
    ReasoningSplitter,
    ThinkingStart,
    Tokenizer,
    thinking_start,
)

PROMPT_TAIL_TOKENS = 16
"""How many of the prompt's last tokens are read to tell whether the template opened a block (a
generation prompt writes `<think>\\n` last, a few tokens at most)."""


def thinking_for_prompt(splits: bool, tokenizer: Tokenizer, prompt: Sequence[int]) -> ThinkingStart | None:
    """How a reply to `prompt` starts (`reasoning.thinking_start`), or None when replies are not
    split (`splits`: the server's `--reasoning-parser` and the template say so)."""
    if not splits:
        return None
    return thinking_start(tokenizer.decode(list(prompt[-PROMPT_TAIL_TOKENS:])))


def with_constraint(thinking: ThinkingStart | None, grammar: GrammarSpec | None) -> ThinkingStart | None:
    """The start once the request's constraint is known. An output constraint other than the tool
    grammar (`response_format`, `grammar`, the server's `--json-schema`, ...) decides the whole
    reply; one that never writes `</think>` (a JSON schema, a choice list, most grammars) cannot
    close a block the prompt opened, so its reply is read as content (`closed`: unless it writes a
    block itself); one that does (a grammar written for a thinking model) keeps `open`."""
    if thinking != "open" or grammar is None or grammar.parameter == "tools":
        return thinking
    texts = (grammar.source, *grammar.choices)
    closes = any(THINK_CLOSE in text or THINK_CLOSE.replace("/", "\\/") in text for text in texts)
    return thinking if closes else "closed"


def shown_marker_ids(tokenizer: Tokenizer) -> tuple[int, ...]:
    """The block markers that are control tokens in `tokenizer` (rendered as text for the splitter,
    though control tokens render none by default)."""
    ids = (tokenizer.token_id(text) for text in THINK_MARKERS)
    return tuple(sorted({i for i in ids if i is not None and i in tokenizer.control_ids}))


@dataclass(frozen=True)
class ReasoningDelta:
    """Text for the reply's reasoning."""

    text: str


ReplyPart = ReasoningDelta | ContentDelta | CallDelta


@dataclass
class ReplyReader:
    """One choice's text read as it streams: reasoning (when `thinking` is set), then content, and
    calls in the content (when `syntax` is set). The whole reply is the same reader fed everything
    at once, so streamed and whole replies agree by construction."""

    thinking: ThinkingStart | None
    syntax: CallSyntax | None
    make_id: Callable[[CallSyntax], str] = new_call_id
    tools: ReplySplitter | None = field(init=False, default=None)
    """The calls' splitter (None: calls are not read)."""
    _splitter: ReasoningSplitter | None = field(init=False, default=None)
    _reasoning: list[str] = field(init=False, default_factory=list)
    _content: list[str] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if self.thinking is not None:
            self._splitter = ReasoningSplitter(self.thinking)
        if self.syntax is not None:
            self.tools = ReplySplitter(self.syntax, self.make_id)

    def feed(self, text: str) -> list[ReplyPart]:
        """The parts `text` settles."""
        pieces = self._splitter.feed(text) if self._splitter is not None else [ContentPiece(text)]
        return self._parts(pieces)

    def finish(self) -> list[ReplyPart]:
        """The parts of whatever was held."""
        parts = self._parts(self._splitter.finish() if self._splitter is not None else [])
        if self.tools is not None:
            parts += self.tools.finish()
        return parts

    def _parts(self, pieces: Sequence[ReasoningPiece | ContentPiece]) -> list[ReplyPart]:
        out: list[ReplyPart] = []
        for piece in pieces:
            if isinstance(piece, ReasoningPiece):
                self._reasoning.append(piece.text)
                out.append(ReasoningDelta(piece.text))
            elif self.tools is not None:
                out += self.tools.feed(piece.text)
            else:
                self._content.append(piece.text)
                out.append(ContentDelta(piece.text))
        return out

    @property
    def reasoning(self) -> str | None:
        """The reasoning so far (None when there is none)."""
        return "".join(self._reasoning) or None

    @property
    def content(self) -> str | None:
        """The content so far: with calls read, None when there is none (as before reasoning)."""
        return self.tools.text if self.tools is not None else "".join(self._content)

    @property
    def calls(self) -> list[CallDelta]:
        """The calls so far."""
        return self.tools.calls if self.tools is not None else []
