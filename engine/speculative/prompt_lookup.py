"""Prompt lookup: drafts copied from the sequence's own tokens (vLLM's ngram proposer, llama.cpp's
lookup decoding). No second model: the last n tokens are searched for earlier in prompt + output,
and what followed the most recent earlier occurrence is proposed. Strong when the output quotes the
input (editing code, summarising with quotes), free when it does not (no match, no drafts).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from infer.engine.speculative.base import DraftAsk

LOOKBACK = 4096
"""Tokens searched back from the end: bounds the per-step cost on long contexts."""


def lookup(context_ids: Sequence[int], k: int, ngram_min: int, ngram_max: int) -> list[int]:
    """Up to `k` tokens that followed an earlier occurrence of the context's last n tokens, for n from
    `ngram_max` down to `ngram_min` (the longest match wins); [] without a match.

    The most recent occurrence followed by at least `k` tokens is used, else the earliest one (the
    longest continuation): in a repeating run the nearest match is followed only by the suffix."""
    tokens = np.asarray(context_ids[-LOOKBACK:], dtype=np.int64)
    size = len(tokens)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        pattern = tokens[size - n :]
        # Windows starting at 0 .. size - n - 1: every n-gram except the suffix itself.
        windows = sliding_window_view(tokens[: size - 1], n)
        hits = np.flatnonzero((windows == pattern).all(axis=1))
        if hits.size:
            full = hits[hits + n + k <= size]
            follow = int(full[-1] if full.size else hits[0]) + n
            return tokens[follow : follow + k].tolist()
    return []


class PromptLookupDrafter:
    """The `prompt_lookup` drafter: stateless, each ask answered from its own context."""

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]:
        """Drafts for each ask (see `lookup`)."""
        return [lookup(a.context_ids, a.k, a.config.ngram_min, a.config.ngram_max) for a in asks]

    def release(self, key: int) -> None:
        """Nothing is kept per sequence."""
