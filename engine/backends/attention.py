"""How one batch's rows split into batched single-token rows and per-sequence prefill runs.

Built on the host from plain arrays (no engine types), once per forward, and handed to
`Backend.attention` for every layer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np


@dataclass(frozen=True)
class PrefillRun:
    """Several consecutive rows of one sequence."""

    row: int
    """First batch row of the run."""
    slot: int
    """KV-cache slot of the sequence."""
    start: int
    """Position of the first row (= positions already in the cache)."""
    length: int
    """Number of rows."""


@dataclass(frozen=True)
class RowSelection:
    """Some rows of a batch with what attention needs of each (int64 arrays of the same length)."""

    rows: np.ndarray
    """Batch rows."""
    slots: np.ndarray
    """KV-cache slot of each."""
    first: np.ndarray
    """First position each attends to."""
    visible: np.ndarray
    """Positions each sees (its own position + 1)."""


@dataclass(frozen=True)
class AttentionPlan:
    """Decode rows (one token of a sequence) attend in one batched matmul over the dense run of slots
    [slot_lo, slot_hi); prefill runs attend one by one."""

    decode_rows: np.ndarray
    decode_slots: np.ndarray
    slot_lo: int
    slot_hi: int
    decode_width: int
    decode_mask: np.ndarray | None
    """[slots, 1, 1, width] additive host mask; None when every row sees all `decode_width` positions."""
    prefill: tuple[PrefillRun, ...]
    aligned: bool = False
    """Decode rows are the batch's first rows and hold consecutive slots in order."""
    row_slots: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Every batch row's KV-cache slot (int64 [rows])."""
    row_visible: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """How many positions every batch row attends to (its own position + 1), int64 [rows]."""
    row_run_length: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """Rows its sequence brings to this batch, for every batch row (1 for a decode row)."""
    window: int | None = None
    """Sliding-window attention: a row at position p sees positions (p - window, p] only; None: all <= p."""
    row_first: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    """First position every batch row attends to (0 without a window), int64 [rows]."""
    softcap: float | None = None
    """Attention-score soft-capping (Gemma 2): scores become cap * tanh(scores / cap) before the
    mask and the softmax; None: none. A backend that cannot apply it refuses the plan."""
    decode_offset: int = 0
    """First cache position the batched decode rows read (the smallest of their first positions);
    `decode_mask`, when set, covers positions [decode_offset, decode_width)."""
    _short_rows: dict[int, RowSelection] = field(default_factory=dict, init=False, repr=False, compare=False)

    def short_rows(self, limit: int) -> RowSelection:
        """The rows whose sequence brings at most `limit` rows to this batch (decode rows, verify
        runs), with their slots, first and visible positions: worked out once per plan, since every
        layer attends with the same plan."""
        selection = self._short_rows.get(limit)
        if selection is None:
            rows = np.flatnonzero(self.row_run_length <= limit)
            selection = RowSelection(rows, self.row_slots[rows], self.row_first[rows], self.row_visible[rows])
            self._short_rows[limit] = selection
        return selection

    @classmethod
    def build(cls, slots: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> AttentionPlan:
        """The plan for a batch whose sequences (in row order) hold `slots`, start at `starts` and
        bring `lengths` rows each."""
        plan = cls._build(slots, starts, lengths)
        return replace(
            plan,
            row_slots=np.repeat(slots, lengths).astype(np.int64),
            row_visible=np.concatenate(
                [np.arange(s + 1, s + n + 1) for s, n in zip(starts.tolist(), lengths.tolist(), strict=True)]
            ).astype(np.int64),
            row_run_length=np.repeat(lengths, lengths).astype(np.int64),
            row_first=np.zeros(int(lengths.sum()), dtype=np.int64),
        )

    def with_softcap(self, cap: float) -> AttentionPlan:
        """The same batch with attention scores soft-capped at `cap` (> 0)."""
        if not cap > 0:
            raise ValueError(f"attention soft-capping must be positive, got {cap}")
        return replace(self, softcap=float(cap))

    def with_window(self, window: int) -> AttentionPlan:
        """The same batch with sliding-window attention: each row sees its last `window` positions.

        A row's visible positions stay a function of its own position, so batch invariance holds.
        """
        if window < 1:
            raise ValueError(f"attention window must be at least 1, got {window}")
        row_first = np.maximum(self.row_visible - window, 0)
        plan = replace(self, window=window, row_first=row_first)
        if not self.decode_rows.size or not row_first[self.decode_rows].any():
            return plan
        # Batched decode (BLAS mode): read from the smallest first position on, mask what each row
        # may not see on either side.
        first = np.zeros(self.slot_hi - self.slot_lo, dtype=np.int64)
        visible = np.full(self.slot_hi - self.slot_lo, self.decode_width, dtype=np.int64)
        first[self.decode_slots - self.slot_lo] = row_first[self.decode_rows]
        visible[self.decode_slots - self.slot_lo] = self.row_visible[self.decode_rows]
        offset = int(first[self.decode_slots - self.slot_lo].min())
        cols = np.arange(offset, self.decode_width)[None, :]
        seen = (cols >= first[:, None]) & (cols < visible[:, None])
        mask = np.where(seen, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)[:, None, None, :]
        return replace(plan, decode_offset=offset, decode_mask=mask)

    @classmethod
    def _build(cls, slots: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> AttentionPlan:
        decode_rows, decode_slots, decode_lengths, prefill = [], [], [], []
        row = 0
        for slot, start, length in zip(slots.tolist(), starts.tolist(), lengths.tolist(), strict=True):
            if length == 1:
                decode_rows.append(row)
                decode_slots.append(slot)
                decode_lengths.append(start + 1)
            else:
                prefill.append(PrefillRun(row, slot, start, length))
            row += length
        if not decode_rows:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, 0, 0, 0, np.zeros((0, 1, 1, 0), np.float32), tuple(prefill))
        slot_array = np.asarray(decode_slots, dtype=np.int64)
        lo, hi = int(slot_array.min()), int(slot_array.max()) + 1
        width = max(decode_lengths)
        # Slots in [lo, hi) that hold no decode row keep a fully open mask over zeros; their
        # output is discarded, so only valid positions of real rows matter.
        visible_lengths = np.full(hi - lo, width, dtype=np.int64)
        visible_lengths[slot_array - lo] = decode_lengths
        mask = None
        if (visible_lengths < width).any():
            visible = np.arange(width)[None, :] < visible_lengths[:, None]
            mask = np.where(visible, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
            mask = mask[:, None, None, :]
        rows = np.asarray(decode_rows, dtype=np.int64)
        count = rows.size
        aligned = bool(
            hi - lo == count
            and np.array_equal(rows, np.arange(count))
            and np.array_equal(slot_array - lo, rows)
        )
        return cls(rows, slot_array, lo, hi, width, mask, tuple(prefill), aligned)


def causal_mask(start: int, length: int, window: int | None = None, first: int = 0) -> np.ndarray:
    """Additive host mask [length, start + length - first] over positions first..start+length-1: row t
    sees positions <= start + t (and, with a `window`, > start + t - window)."""
    cols = np.arange(first, start + length)
    rows = np.arange(start, start + length)[:, None]
    seen = cols <= rows
    if window is not None:
        seen &= cols > rows - window
    return np.where(seen, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
