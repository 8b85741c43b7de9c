"""Turns a request's sampled tokens into text deltas: detokenizing, stop tokens and stop strings."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from infer.engine.runtime.events import FinishReason
from infer.engine.text.detokenizer import IncrementalDetokenizer
from infer.engine.text.tokenizer import Tokenizer


@dataclass(frozen=True)
class OutputStep:
    """What one token adds: the text that may be shown now, and whether the request is finished."""

    text: str
    finish_reason: FinishReason | None


class OutputProcessor:
    """Per-request text assembly.

    Text that could be the start of a stop string is held back until it is known not to be one,
    so stop text never reaches a sink, even when the match spans several tokens.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        stop: Sequence[str] = (),
        stop_ids: Collection[int] = (),
        skip_special: bool = True,
        shown_special: Collection[int] = (),
        prompt_ids: Sequence[int] = (),
    ) -> None:
        self._detokenizer = IncrementalDetokenizer(
            tokenizer, skip_special=skip_special, shown_special=shown_special, prompt_ids=prompt_ids
        )
        self._stop = tuple(stop)
        self._stop_ids = frozenset(stop_ids)
        self._pending = ""
        self._emitted: list[str] = []

    @property
    def text(self) -> str:
        """All text emitted so far."""
        return "".join(self._emitted)

    def _emit(self, text: str) -> str:
        if text:
            self._emitted.append(text)
        return text

    def add(self, token_id: int) -> OutputStep:
        """Feed one generated token."""
        if token_id in self._stop_ids:
            return OutputStep(self._emit(self.flush_text()), "stop")
        self._pending += self._detokenizer.add(token_id)
        if not self._stop:
            text, self._pending = self._pending, ""
            return OutputStep(self._emit(text), None)
        cut = min((i for i in (self._pending.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            text, self._pending = self._pending[:cut], ""
            return OutputStep(self._emit(text), "stop")
        hold = self._held_suffix(self._pending)
        text = self._pending[: len(self._pending) - hold]
        self._pending = self._pending[len(self._pending) - hold :]
        return OutputStep(self._emit(text), None)

    def _held_suffix(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for stop in self._stop:
            for size in range(min(len(stop) - 1, len(text)), best, -1):
                if text.endswith(stop[:size]):
                    best = size
                    break
        return best

    def flush_text(self) -> str:
        """Text still held back when generation ends for another reason (it matched no stop string)."""
        tail = self._detokenizer.flush()
        combined = self._pending + tail
        self._pending = ""
        if self._stop:
            cut = min((i for i in (combined.find(s) for s in self._stop) if i >= 0), default=-1)
            if cut >= 0:
                combined = combined[:cut]
        return combined

    def finish(self) -> str:
        """Flush at the end of generation (length, cancel, error) and return the last text to show."""
        return self._emit(self.flush_text())
