"""The unit of work a model runs: one ragged batch of every scheduled sequence's new tokens."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Segment:
    """A run of consecutive batch rows that belong to one sequence."""

    slot: int
    """KV-cache slot of the sequence."""
    start: int
    """Position of the segment's first token (= tokens already in the cache)."""
    length: int
    """Number of tokens (rows) in the segment."""


@dataclass(frozen=True)
class ForwardBatch:
    """One ragged step: every sequence's new tokens, concatenated in segment order."""

    token_ids: np.ndarray
    """int64 [rows]."""
    segments: tuple[Segment, ...]
    logit_rows: np.ndarray
    """Rows whose logits the caller needs (int64); the vocabulary projection runs only for these."""
