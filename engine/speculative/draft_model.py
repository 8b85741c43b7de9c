"""The draft-model drafter: a smaller model with the target's tokenizer, run greedily in the same
engine on the same backend, with its own KV cache (one slot per sequence it drafts for).

Each step it catches its cache up with the sequence (the tokens accepted since last time, from the
first position where its cached tokens and the sequence differ: rejected drafts are simply
overwritten, the position counter being the common prefix), then drafts up to k tokens, one batched
forward per draft position over every sequence still drafting, stopping a sequence early when its
top-1 probability falls below `p_min` (llama.cpp's --draft-p-min).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from infer.engine.backends.base import Backend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.models.base import Model, ModelLoadError
from infer.engine.speculative.base import DraftAsk
from infer.engine.text.tokenizer import Tokenizer


class DraftModelError(ModelLoadError):
    """A draft model that cannot draft for the target (a different tokenizer)."""


def tokenizer_difference(target: Tokenizer, draft: Tokenizer) -> str | None:
    """Why `draft` does not tokenize like `target` (vocabulary bytes and special tokens), or None."""
    if target.vocab_size != draft.vocab_size:
        return f"vocabulary of {draft.vocab_size} tokens, the target has {target.vocab_size}"
    for token_id in range(target.vocab_size):
        if target.token_bytes(token_id) != draft.token_bytes(token_id):
            return (
                f"token {token_id} is {draft.token_bytes(token_id)!r}, "
                f"the target's is {target.token_bytes(token_id)!r}"
            )
    for name in ("bos_id", "eos_id", "eot_id", "special_ids", "stop_ids"):
        mine, theirs = getattr(draft, name), getattr(target, name)
        if mine != theirs:
            shown = sorted(mine) if isinstance(mine, frozenset) else mine
            wanted = sorted(theirs) if isinstance(theirs, frozenset) else theirs
            return f"{name} is {shown}, the target's is {wanted}"
    return None


def load_draft_model(path: Path | str, backend: Backend, target: Tokenizer) -> Model:
    """Load a draft model on `backend`; raise `DraftModelError` (one line) when its tokenizer is not
    the target's, since its drafts would then be other tokens' ids."""
    checkpoint = load_checkpoint(path)
    difference = tokenizer_difference(target, checkpoint.tokenizer)
    if difference is not None:
        raise DraftModelError(
            f"draft model {checkpoint.source}: its tokenizer differs from the target model's "
            f"({difference}); a draft model must share the target's tokenizer"
        )
    return build_model(checkpoint, backend)


@dataclass
class _DraftState:
    """What the draft cache holds for one sequence."""

    slot: int
    cached: list[int] = field(default_factory=list)
    """Tokens whose keys and values are in the slot, from position 0."""


@dataclass
class _Work:
    """One ask's progress through a propose call."""

    ask: DraftAsk
    state: _DraftState
    pending: list[int]
    """Context tokens not yet in the draft cache (the newest one always among them)."""
    k: int
    drafts: list[int] = field(default_factory=list)


def _common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


class DraftModelDrafter:
    """The `draft_model` drafter (see the module docstring)."""

    def __init__(
        self,
        model: Model,
        *,
        slots: int,
        capacity: int,
        chunk_size: int,
        max_rows: int,
        vocab_limit: int,
        kv_cache_dtype: str = "f32",
    ) -> None:
        self.model = model
        self.cache = model.make_cache(slots, capacity, kv_cache_dtype)  # stored as the target's
        self.cache.may_rewind = True  # drafts are rewound to the target's tokens: keep every position
        self.capacity = capacity
        self.chunk_size = chunk_size
        self.max_rows = max(max_rows, 1)
        self.vocab_limit = vocab_limit
        """Drafts at or past this id (the target's vocabulary) are never proposed."""
        self._states: dict[int, _DraftState] = {}

    def release(self, key: int) -> None:
        """Free the sequence's draft slot."""
        state = self._states.pop(key, None)
        if state is not None:
            self.cache.release(state.slot)

    def propose(self, asks: Sequence[DraftAsk]) -> list[list[int]]:
        """Catch each sequence's draft cache up, then draft greedily (see the module docstring)."""
        works: list[_Work] = []
        answers: dict[int, _Work] = {}
        for ask in asks:
            work = self._start(ask)
            if work is not None:
                works.append(work)
                answers[ask.key] = work
        last = self._catch_up(works)
        active = [w for w in works if w.k > 0]
        while active:
            still: list[_Work] = []
            for work in active:
                token, probability = self._top1(last[id(work)])
                if probability < work.ask.config.p_min or token >= self.vocab_limit:
                    continue
                work.drafts.append(token)
                if len(work.drafts) < work.k:
                    work.pending = [token]
                    still.append(work)
            active = still
            if active:
                last = self._forward([(w, w.pending, True) for w in active])
        return [answers[a.key].drafts if a.key in answers else [] for a in asks]

    # -- internals -----------------------------------------------------------------------------
    def _start(self, ask: DraftAsk) -> _Work | None:
        state = self._states.get(ask.key)
        if state is None:
            slot = self.cache.acquire()
            if slot is None:
                return None
            state = self._states[ask.key] = _DraftState(slot)
        context = ask.context_ids
        keep = min(_common_prefix(state.cached, context), len(context) - 1)
        del state.cached[keep:]
        # Positions needed: the context, then all drafts but the last (which is never fed).
        k = min(ask.k, self.capacity - len(context) + 1)
        return _Work(ask, state, list(context[keep:]), k)

    def _catch_up(self, works: list[_Work]) -> dict[int, np.ndarray]:
        """Feed every work's pending tokens (chunks ending at multiples of chunk_size, within the row
        budget); the newest token's logits row of each."""
        last: dict[int, np.ndarray] = {}
        todo = [w for w in works if w.pending]
        while todo:
            round_: list[tuple[_Work, list[int], bool]] = []
            rows = 0
            for work in todo:
                start = len(work.state.cached)
                size = min(len(work.pending), self.chunk_size - start % self.chunk_size)
                if round_ and rows + size > self.max_rows:
                    break
                round_.append((work, work.pending[:size], size == len(work.pending)))
                rows += size
            for work, chunk, _ in round_:
                work.pending = work.pending[len(chunk) :]
            last.update(self._forward(round_))
            todo = [w for w in todo if w.pending]
        return last

    def _forward(self, items: list[tuple[_Work, list[int], bool]]) -> dict[int, np.ndarray]:
        """One ragged forward of the draft model; each item's tokens are appended to its cached
        tokens, and an item marked True gets its last row's logits."""
        rows: list[int] = []
        segments: list[Segment] = []
        logit_rows: list[int] = []
        owners: list[int] = []
        for work, tokens, wants_logits in items:
            segments.append(Segment(work.state.slot, len(work.state.cached), len(tokens)))
            rows.extend(tokens)
            if wants_logits:
                logit_rows.append(len(rows) - 1)
                owners.append(id(work))
        batch = ForwardBatch(
            np.asarray(rows, dtype=np.int64), tuple(segments), np.asarray(logit_rows, dtype=np.int64)
        )
        logits = self.model.forward(batch, self.cache)
        for work, tokens, _ in items:
            work.state.cached.extend(tokens)
        return {owner: logits[i] for i, owner in enumerate(owners)}

    @staticmethod
    def _top1(row: np.ndarray) -> tuple[int, float]:
        """The greedy token and its probability under the draft model."""
        values = np.asarray(row, dtype=np.float64)
        token = int(values.argmax())
        probability = 1.0 / float(np.exp(values - values[token]).sum())
        return token, probability
