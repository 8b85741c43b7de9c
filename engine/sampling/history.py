"""A request's token history (prompt, then accepted tokens): what the penalty and DRY stages read.

It is its own object so that the chain's history-reading links hold the history, not the sampler:
a sampler whose links pointed back at it would be a reference cycle, keeping every finished request's
vocabulary-sized arrays alive until the cyclic garbage collector ran.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

__all__ = ["TokenHistory"]


class TokenHistory:
    """Prompt ids followed by the accepted tokens, in one growing int64 array.

    ``token_texts[i]`` is token i's text and ``breakers`` DRY's sequence-breaker strings: a token is a
    breaker if its text contains one (ids beyond ``token_texts`` are not). The breaker mask is built
    here, once (when the request is made, not in the step loop), in time linear in the vocabulary's
    text per breaker.
    """

    def __init__(
        self,
        prompt_ids: Sequence[int],
        vocab_size: int,
        token_texts: Sequence[str] | None = None,
        breakers: Sequence[str] = (),
    ) -> None:
        prompt = np.asarray(list(prompt_ids), dtype=np.int64)
        if prompt.size and (prompt.min() < 0 or prompt.max() >= vocab_size):
            raise ValueError("prompt_ids contains a token id outside the vocabulary.")
        self._tokens = np.empty(max(64, 2 * prompt.size), dtype=np.int64)
        self._tokens[: prompt.size] = prompt
        self._n = int(prompt.size)
        self.n_prompt = self._n
        """How many of the tokens are the prompt."""
        self._vocab_size = vocab_size
        self._breaker: np.ndarray | None = None
        if token_texts is not None and breakers:
            self._breaker = breaker_tokens(token_texts, breakers, vocab_size)

    @property
    def n_generated(self) -> int:
        """Tokens accepted after the prompt."""
        return self._n - self.n_prompt

    @property
    def generated(self) -> tuple[int, ...]:
        """The accepted (generated) tokens, oldest first."""
        return tuple(int(t) for t in self._tokens[self.n_prompt : self._n])

    def append(self, token_id: int) -> None:
        """Add one accepted token."""
        if self._n == self._tokens.shape[0]:
            self._tokens = np.concatenate((self._tokens, np.empty_like(self._tokens)))
        self._tokens[self._n] = token_id
        self._n += 1

    def drop(self, n: int) -> None:
        """Forget the last ``n`` accepted tokens (the caller checks ``n <= n_generated``)."""
        self._n -= n

    def window(self, last_n: int) -> np.ndarray:
        """The last ``last_n`` tokens, prompt included; ``-1`` = all of them. A view: do not keep it."""
        start = 0 if last_n < 0 else max(0, self._n - last_n)
        return self._tokens[start : self._n]

    def breaker_mask(self) -> np.ndarray | None:
        """A bool mask over the vocabulary of DRY's breaker tokens, or None when there are none."""
        return self._breaker


_SEPARATOR = "\x00"


def breaker_tokens(token_texts: Sequence[str], breakers: Sequence[str], vocab_size: int) -> np.ndarray:
    """Bool [vocab_size]: the tokens whose text contains one of `breakers`. The texts are searched
    joined (a regex scan per breaker in C, ~0.5 ms for a 49k vocabulary) rather than token by token."""
    n = min(len(token_texts), vocab_size)
    mask = np.zeros(vocab_size, dtype=bool)
    texts = list(token_texts[:n])
    joined = _SEPARATOR.join(texts)
    starts = np.cumsum([0, *(len(t) + 1 for t in texts[:-1])]) if texts else np.zeros(0, np.int64)
    for breaker in breakers:
        if _SEPARATOR in breaker:  # could match across two texts: look token by token
            mask[:n] |= np.fromiter((breaker in t for t in texts), dtype=bool, count=n)
            continue
        found = [m.start() for m in re.finditer(re.escape(breaker), joined)]
        if found:
            mask[np.searchsorted(starts, found, side="right") - 1] = True
    return mask
