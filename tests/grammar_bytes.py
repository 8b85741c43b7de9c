"""Matching text against a compiled grammar with no model: llguidance over a byte-level vocabulary."""

from __future__ import annotations

from typing import ClassVar

import llguidance


class _Bytes:
    """A byte-level vocabulary for llguidance: token i is byte i, token 256 ends."""

    eos_token_id = 256
    bos_token_id = None
    special_token_ids: ClassVar[list[int]] = [256]
    tokens: ClassVar[list[bytes]] = [bytes([i]) for i in range(256)] + [b"\xff<end>"]

    def __call__(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


_TOKENIZER = llguidance.LLTokenizer(llguidance.TokenizerWrapper(_Bytes()), n_vocab=257, eos_token=[256])


def matches(grammar: str, text: str) -> bool:
    """Whether the compiled grammar (a GrammarSpec's `.grammar`) accepts exactly `text`."""
    matcher = llguidance.LLMatcher(_TOKENIZER, grammar, log_level=0)
    return all(matcher.consume_token(byte) for byte in text.encode("utf-8")) and matcher.is_accepting()
