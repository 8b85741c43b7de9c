"""Streaming detokenization: token ids in one at a time, complete text out.

Each token is rendered to its raw bytes (`Tokenizer.token_bytes`) and fed to an incremental UTF-8
decoder, so a character split across tokens (byte-level BPE, SentencePiece byte fallback) appears
once its last byte arrives, never as a fragment. This is O(1) per token, needs no re-decoding
window, and keeps SentencePiece word-boundary spaces because spaces are ordinary bytes here; only
the one space the encoder prefixes to the whole text is dropped, exactly as `Tokenizer.decode` does.
"""

from __future__ import annotations

import codecs
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from infer.engine.text.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Turns generated token ids into text deltas.

    Invariant (with no `prompt_ids`): `"".join(add(i) for i in ids) + flush()` equals
    `tokenizer.decode(ids, skip_special=skip_special)`. With `prompt_ids`, the output is the
    continuation of the prompt's text: it equals `decode(prompt_ids + ids)` minus `decode(prompt_ids)`
    (for a prompt that ends on a whole character), so a SentencePiece first token keeps its space.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        skip_special: bool = True,
        shown_special: Collection[int] = (),
        prompt_ids: Sequence[int] = (),
    ) -> None:
        """Start a stream; `prompt_ids` only tells whether the output continues existing text;
        `shown_special` are control tokens rendered as text even with `skip_special`."""
        self._token_bytes = tokenizer.token_bytes
        self._skipped = tokenizer.control_ids - frozenset(shown_special) if skip_special else frozenset()
        # Invalid bytes become U+FFFD exactly as bytes.decode(errors="replace") would in one go.
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        prompt_has_text = any(tokenizer.token_bytes(i) for i in prompt_ids if i not in self._skipped)
        # Until the first character is out, a leading space is the encoder's prefix, not the model's.
        self._strip_next_space = tokenizer.strip_leading_space and not prompt_has_text
        self.token_count = 0
        """Tokens added so far, including ones that rendered to nothing."""

    def add(self, token_id: int) -> str:
        """The new complete text `token_id` makes available; "" while a character is incomplete
        or for a special token that renders to nothing."""
        data = self._token_bytes(token_id)  # validates the id
        self.token_count += 1
        if token_id in self._skipped:
            return ""
        return self._emit(self._utf8.decode(data))

    def flush(self) -> str:
        """Remaining text at the end of generation: incomplete trailing bytes render as U+FFFD."""
        return self._emit(self._utf8.decode(b"", final=True))

    def _emit(self, text: str) -> str:
        if text and self._strip_next_space:
            self._strip_next_space = False
            if text.startswith(" "):
                text = text[1:]
        return text
