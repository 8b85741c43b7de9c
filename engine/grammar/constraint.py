"""The per-request half of a constraint: an llguidance matcher that follows the sequence's tokens.

The step loop asks `mask()` for the tokens allowed at the next position (a bool row over the
model's vocabulary), samples from the masked logits, then `consume(token)`s the draw. With drafts,
`valid_prefix(drafts)` cuts them to what the grammar allows before they are scheduled, and
`row_masks(drafts)` gives each verify row the mask of the state after the drafts before it (the
bonus row included), leaving the matcher where it was; `rollback(n)` forgets the last n consumed
tokens, in step with the KV cache's position counter.

No special token (BOS, role markers) can ever be allowed inside constrained text: they match no
terminal in llguidance. The stop tokens (EOS, EOT) are allowed exactly where the grammar accepts.

The start state's mask is computed when the constraint is made (before the request joins the step
loop: it is the costly one, where llguidance builds its lexer) and kept; a mask that takes longer than
`limits.MASK_TIME_LIMIT_S`, there or later, fails the request instead of stalling every other one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np

from infer.engine.grammar import limits
from infer.engine.grammar.compile_worker import one_line
from infer.engine.grammar.spec import GrammarError, GrammarSpec
from infer.engine.grammar.vocabulary import GrammarVocabulary


class GrammarViolationError(RuntimeError):
    """A token the grammar does not allow was consumed, the grammar allows no token at all, or
    matching it went past a limit; `parameter` names the field the grammar came from."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class Constraint:
    """One request's matcher over the model's vocabulary (not thread-safe: the engine thread owns it)."""

    def __init__(self, spec: GrammarSpec, vocabulary: GrammarVocabulary) -> None:
        self.spec = spec
        self.vocab_size = vocabulary.vocab_size
        self._matcher = vocabulary.matcher(spec)
        words = (self.vocab_size + 31) // 32
        self._bits = np.zeros(words, dtype=np.int32)
        self._failure: str | None = None
        self.consumed = 0
        """Tokens consumed and not rolled back (the request's generated tokens, once a step ends)."""
        try:
            start = self._compute_mask()
        except GrammarViolationError as exc:
            raise GrammarError(str(exc), spec.parameter) from None
        start.flags.writeable = False
        self._start_mask = start
        """The mask at the start state (every state with nothing consumed is that one)."""

    # ---- state --------------------------------------------------------------------------------
    @property
    def is_accepting(self) -> bool:
        """The text so far is a complete match (a stop token is allowed now)."""
        return bool(self._matcher.is_accepting())

    @property
    def is_stopped(self) -> bool:
        """Nothing can follow: the grammar is complete and admits no more text, or a stop token was
        consumed. The request ends here with finish_reason stop."""
        return bool(self._matcher.is_stopped()) and not self._matcher.is_error()

    @property
    def error(self) -> str | None:
        """Why matching failed (llguidance's error, or a mask past its time), once it has."""
        if self._failure is not None:
            return self._failure
        return one_line(self._matcher.get_error()) if self._matcher.is_error() else None

    # ---- masks --------------------------------------------------------------------------------
    def mask(self) -> np.ndarray:
        """The allowed tokens at the next position: bool [vocab_size] (read-only at the start
        state). Raises GrammarViolationError if matching has failed (it then allows nothing) or this
        mask took longer than `limits.MASK_TIME_LIMIT_S`."""
        if self.consumed == 0 and self._failure is None and not self._matcher.is_error():
            return self._start_mask
        return self._compute_mask()

    def _compute_mask(self) -> np.ndarray:
        self._check()
        started = time.perf_counter()
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        took = time.perf_counter() - started
        if took > limits.MASK_TIME_LIMIT_S:
            self._failure = (
                f"the {self.spec.describe()} constraint is too complex to match: one token mask took "
                f"{took:.2f} s (the limit is {limits.MASK_TIME_LIMIT_S:g} s)"
            )
        self._check()
        bits = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=self.vocab_size)
        return bits.view(np.bool_)

    def row_masks(self, drafts: Sequence[int]) -> list[np.ndarray]:
        """The masks of the k+1 verify rows for `drafts` (already cut by `valid_prefix`): row j gets
        the state after drafts[:j]; the matcher is left where it was."""
        masks = [self.mask()]
        taken = 0
        try:
            for token in drafts:
                self.consume(token)
                taken += 1
                masks.append(self.mask())
        finally:
            self.rollback(taken)
        return masks

    # ---- moving -------------------------------------------------------------------------------
    def valid_prefix(self, drafts: Sequence[int]) -> int:
        """How many of `drafts`, from the first, the grammar allows from the current state (a stop
        token counts where the grammar accepts; nothing counts after it)."""
        if not drafts:
            return 0
        self._check()
        return int(self._matcher.validate_tokens(list(drafts)))

    def allowed_drafts(self, drafts: Sequence[int]) -> list[int]:
        """`drafts` cut to the prefix the grammar allows, never raising (no drafts once the matcher
        has failed: the next draw ends the request): a sequence's draft filter."""
        if self._failure is not None or self._matcher.is_error():
            return []
        return list(drafts[: self.valid_prefix(drafts)])

    def consume(self, token_id: int) -> None:
        """Advance by one token; GrammarViolationError if the grammar does not allow it (the
        matcher then stays in error: the request must end)."""
        self._check()
        if not self._matcher.consume_token(int(token_id)):
            raise GrammarViolationError(
                f"token {token_id} is not allowed by the {self.spec.describe()} constraint "
                f"after {self.consumed} tokens: {one_line(self._matcher.get_error())}",
                self.spec.parameter,
            )
        self.consumed += 1

    def rollback(self, n: int) -> None:
        """Forget the last `n` consumed tokens (drafts rejected, tokens dropped after a stop)."""
        if not 0 <= n <= self.consumed:
            raise ValueError(f"cannot roll back {n} tokens, only {self.consumed} were consumed")
        if n and not self._matcher.rollback(n):
            # the engine's bookkeeping, not the grammar, is at fault: no parameter to blame
            raise GrammarViolationError(
                f"rollback of {n} tokens failed: {one_line(self._matcher.get_error())}"
            )
        self.consumed -= n

    def _check(self) -> None:
        if self._failure is not None:
            raise GrammarViolationError(self._failure, self.spec.parameter)
        if self._matcher.is_error():
            raise GrammarViolationError(
                f"the {self.spec.describe()} matcher failed: {one_line(self._matcher.get_error())}",
                self.spec.parameter,
            )


def audit_tokens(spec: GrammarSpec, vocabulary: GrammarVocabulary, token_ids: Sequence[int]) -> str | None:
    """Replay `token_ids` through a fresh matcher: None if the grammar allowed every one, else a
    message naming the first token it did not allow (`infer gate --audit`)."""
    constraint = Constraint(spec, vocabulary)
    for index, token in enumerate(token_ids):
        if constraint.is_stopped:
            return f"token {index} (id {token}) follows the end of the {spec.describe()} match"
        allowed = constraint.mask()
        if not 0 <= token < len(allowed) or not allowed[token]:
            return f"token {index} (id {token}) is not allowed by the {spec.describe()} constraint"
        constraint.consume(token)
    return None


__all__ = ["Constraint", "GrammarViolationError", "audit_tokens"]
