"""Draft orchestration: before each step, the drafts of every speculating sequence.

Each method's drafter is asked once for all its sequences (`k` from the sequence's
`AdaptiveLength`, capped by max_tokens and the context), its answers are cut by the sequence's
`draft_filter` (the grammar seam: any prefix) and the request's `draft_min`, and what is left goes in
`seq.draft_ids` for the scheduler to feed as verify rows. A drafter that fails ends only the
sequences it fails for.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from infer.engine.models.base import Model
from infer.engine.runtime.sequence import Sequence
from infer.engine.speculative import DraftAsk, Drafter, DraftModelDrafter, PromptLookupDrafter

Fail = Callable[[Sequence, str, BaseException], None]
"""Ends a sequence with an error naming the step (`SequenceUpdater.fail`)."""

HookAllows = Callable[[Sequence, str, int, str], bool]
"""Runs the fault hook for a phase of a sequence (`SequenceUpdater.hook_allows`)."""


class DraftProposer:
    """The drafters of the speculative methods this engine can run, and the per-step asking."""

    def __init__(
        self,
        ctx_size: int,
        *,
        draft_model: Model | None = None,
        slots: int = 1,
        chunk_size: int = 512,
        max_rows: int = 2048,
        vocab_limit: int = 0,
        kv_cache_dtype: str = "f32",
    ) -> None:
        self.ctx_size = ctx_size
        self.drafters: dict[str, Drafter] = {"prompt_lookup": PromptLookupDrafter()}
        """The drafter of each speculative method (draft_model only with a draft model, which then
        has its own KV cache beside the target's)."""
        if draft_model is not None:
            self.drafters["draft_model"] = DraftModelDrafter(
                draft_model,
                slots=slots,
                capacity=ctx_size,
                chunk_size=chunk_size,
                max_rows=max_rows,
                vocab_limit=vocab_limit,
                kv_cache_dtype=kv_cache_dtype,
            )

    def release(self, seq: Sequence) -> None:
        """Free what the sequence's drafter keeps for it (a finished request)."""
        spec = seq.request.spec
        if spec is not None and spec.method in self.drafters:
            self.drafters[spec.method].release(id(seq))

    def propose(self, running: Iterable[Sequence], fail: Fail, hook_allows: HookAllows) -> None:
        """Give every speculating sequence that is generating its drafts for this step: one
        `propose` call per method for all of them, then the sequence's draft filter and the
        request's draft_min."""
        groups: dict[str, list[tuple[Sequence, DraftAsk]]] = {}
        for seq in running:
            spec, length = seq.request.spec, seq.draft_length
            if spec is None or length is None or seq.in_prefill or seq.is_finished:
                continue
            seq.draft_ids = []  # drafts left from a step that did not schedule the sequence: ask again
            k = min(length.next_length(), self._draft_room(seq))
            if k <= 0 or not hook_allows(seq, "draft", len(seq.generated), draft_label(seq)):
                continue
            groups.setdefault(spec.method, []).append((seq, DraftAsk(id(seq), seq.token_ids, k, spec)))
        for method, group in groups.items():
            for seq, drafts in self._ask_drafter(self.drafters[method], group, fail):
                if seq.draft_filter is not None and drafts:
                    kept = list(seq.draft_filter(drafts))
                    if kept != drafts[: len(kept)]:
                        problem = ValueError("the draft filter returned no prefix of its drafts")
                        fail(seq, draft_label(seq), problem)
                        continue
                    drafts = kept
                assert seq.request.spec is not None
                seq.draft_ids = drafts if len(drafts) >= seq.request.spec.draft_min else []

    @staticmethod
    def _ask_drafter(
        drafter: Drafter, group: list[tuple[Sequence, DraftAsk]], fail: Fail
    ) -> list[tuple[Sequence, list[int]]]:
        """The drafts of every sequence of `group`, asked all at once; if that fails, each alone, so
        only a sequence whose own drafting fails is ended."""
        try:
            return list(zip([s for s, _ in group], drafter.propose([a for _, a in group]), strict=True))
        except Exception as exc:
            if len(group) == 1:
                fail(group[0][0], draft_label(group[0][0]), exc)
                return []
        answers: list[tuple[Sequence, list[int]]] = []
        for seq, ask in group:
            try:
                answers.append((seq, drafter.propose([ask])[0]))
            except Exception as exc:
                fail(seq, draft_label(seq), exc)
        return answers

    def _draft_room(self, seq: Sequence) -> int:
        """Drafts that can still matter: a verify emits up to k + 1 tokens, within max_tokens and
        the context."""
        room = self.ctx_size - seq.num_tokens - 1
        limit = seq.request.max_tokens
        if limit is not None:
            room = min(room, limit - len(seq.generated) - 1)
        return room


def draft_label(seq: Sequence) -> str:
    """How errors name a sequence's drafting."""
    return f"drafting for decode step {len(seq.generated)}"
