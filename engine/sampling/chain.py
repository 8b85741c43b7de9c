"""Sampling parameters (validated eagerly), the sampler chain, and seeded, position-pure draws.

Semantics follow llama.cpp's CPU samplers (``common/sampling.cpp`` and ``src/llama-sampler.cpp``):

* the chain is ``logit_bias -> allowed mask -> samplers... -> dist``; ``samplers`` is applied in
  the given order, a stage may be repeated (it is applied again) or omitted (it is skipped);
* the chain is built once per request (:class:`SequenceSampler`), as llama.cpp's sampler chain and
  mlx-lm's ``make_sampler``: a tuple of :data:`Stage` callables with their parameters bound, so a
  step only calls them in order (a stage that is off at these parameters is left out);
* with ``mirostat`` 1 or 2 the ``samplers`` list is ignored, as in llama.cpp, and the chain is
  ``logit_bias -> mask -> temperature -> mirostat``;
* ``temperature <= 0`` is greedy: the argmax of the logits after logit_bias, the allowed mask and
  the ``penalties`` / ``dry`` stages that appear in ``samplers`` (truncation stages cannot change
  the argmax except XTC and typical-p, which greedy skips); ties go to the lowest token id.

Randomness is a pure function of ``(seed, position)``: see :func:`draw_uniforms`. The same seed
therefore gives the same tokens alone or batched, with or without speculation, and in any call
order. The final draw is an inverse-CDF draw over the surviving candidates in token-id order.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

import numpy as np

from infer.engine.sampling import stages as st
from infer.engine.sampling.draws import PositionRng, draw_uniforms
from infer.engine.sampling.history import TokenHistory
from infer.engine.sampling.links import NO_DRAWS, build_chain, no_token_left
from infer.engine.sampling.params import (
    _SEED_LIMIT,
    DEFAULT_SAMPLERS,
    SAMPLER_STAGES,
    FrozenLogitBias,
    NoFiniteLogitsError,
    SamplingParams,
    SamplingParamsError,
    resolve_seed,
)

__all__ = [
    "DEFAULT_SAMPLERS",
    "SAMPLER_STAGES",
    "FrozenLogitBias",
    "NoFiniteLogitsError",
    "SampledToken",
    "SamplingParams",
    "SamplingParamsError",
    "SequenceSampler",
    "draw_uniforms",
    "resolve_seed",
]


@dataclass(frozen=True)
class SampledToken:
    """One drawn token with its log-probability and the top alternatives.

    ``logprob`` and ``top_logprobs`` are under the model's RAW distribution, ``log_softmax(logits)``
    taken BEFORE logit_bias, the mask and the chain (float64 normaliser). ``logprob`` is typed to
    allow ``-inf`` (a raw ``-inf`` logit), but the chain never draws such a token, so it is finite;
    it is None unless the params ask for logprobs.
    """

    token_id: int
    logprob: float | None
    top_logprobs: tuple[tuple[int, float], ...]


class SequenceSampler:
    """One request's sampler: owns its history (penalties, DRY), mirostat state, and its seeded draws.

    ``prompt_ids`` start the history (llama.cpp's server feeds the prompt to the sampler too).
    ``token_texts[i]`` is token i's text, used only to find DRY sequence-breaker tokens (a token is
    a breaker if its text contains a breaker string; llama.cpp's multi-token breakers are not
    supported); ids beyond its length (padded vocabularies) are not breakers, and without it DRY
    has no breakers. It is scanned once, on the first DRY step. ``eos_ids`` is recorded for callers
    (:attr:`eos_ids`) and does not change sampling, as in llama.cpp's chain.

    :meth:`sample` and :meth:`final_distribution` do not change the history; :meth:`accept` and
    :meth:`rollback` do. Mirostat's ``mu`` is updated by :meth:`accept` from the distribution the
    last :meth:`sample`/:meth:`final_distribution` call at that position produced (if the accepted
    token had no mass there, or no such call was made, ``mu`` is left unchanged).
    """

    def __init__(
        self,
        params: SamplingParams,
        *,
        seed: int,
        vocab_size: int,
        prompt_ids: Sequence[int] = (),
        token_texts: Sequence[str] | None = None,
        eos_ids: Collection[int] = (),
    ) -> None:
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be > 0, got {vocab_size}.")
        if not 0 <= int(seed) < _SEED_LIMIT:
            raise SamplingParamsError("seed", seed, f"seed must be in [0, 2**64), got {seed!r}.")
        params.check_vocab(vocab_size)
        self.params = params
        self.seed = int(seed)
        self._rng = PositionRng(self.seed)
        self.vocab_size = int(vocab_size)
        self.eos_ids = frozenset(int(t) for t in eos_ids)
        self._arange = np.arange(self.vocab_size, dtype=np.int64)
        bias = params.logit_bias
        assert isinstance(bias, FrozenLogitBias)  # SamplingParams normalises it
        self._bias_ids = bias.ids
        self._bias_vals = bias.biases.astype(np.float32)
        self._history = TokenHistory(prompt_ids, self.vocab_size, token_texts, params.dry_sequence_breakers)
        self.mu = 2.0 * params.mirostat_tau
        self._mu_stack: list[float] = []
        self._pending: tuple[int, np.ndarray, np.ndarray] | None = None
        self._n_xtc = params.samplers.count("xtc") if params.mirostat == 0 else 0
        self.chain = build_chain(params, self._history, self._arange)
        """This request's chain, built once (its links hold the history, not this sampler)."""
        self.plain_greedy = params.is_plain_greedy
        """Cached :attr:`SamplingParams.is_plain_greedy`: whether a batch-wide argmax is this
        sampler's whole draw (see :meth:`sample`)."""

    # ----------------------------------------------------------------- history

    @property
    def generated(self) -> tuple[int, ...]:
        """The accepted (generated) tokens, oldest first."""
        return self._history.generated

    def accept(self, token_id: int) -> None:
        """Record a generated token into the history (penalties, DRY) and update mirostat's mu."""
        tok = int(token_id)
        if not 0 <= tok < self.vocab_size:
            raise ValueError(f"token id {tok} is outside the vocabulary (size {self.vocab_size}).")
        position = self._history.n_generated
        self._mu_stack.append(self.mu)
        if self.params.mirostat and self._pending is not None and self._pending[0] == position:
            _, ids, probs = self._pending
            hit = np.flatnonzero(ids == tok)
            if hit.size and probs[hit[0]] > 0.0:
                surprise = -math.log2(float(probs[hit[0]]))
                self.mu -= self.params.mirostat_eta * (surprise - self.params.mirostat_tau)
        self._pending = None
        self._history.append(tok)

    def rollback(self, n: int) -> None:
        """Forget the last ``n`` accepted tokens (and their mirostat updates)."""
        n_gen = self._history.n_generated
        if not 0 <= n <= n_gen:
            raise ValueError(f"cannot roll back {n} tokens, only {n_gen} were accepted.")
        if n == 0:
            return
        self._history.drop(n)
        self.mu = self._mu_stack[-n]
        del self._mu_stack[-n:]
        self._pending = None

    # ----------------------------------------------------------------- the chain

    def _prepare(self, logits: np.ndarray, allowed: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        """(raw float32 logits, working logits after bias and mask); raises on NaN/+inf/no finite."""
        x = np.asarray(logits, dtype=np.float32)
        if x.shape != (self.vocab_size,):
            raise ValueError(f"logits must have shape ({self.vocab_size},), got {x.shape}.")
        top = x.max()
        if np.isnan(top):
            raise NoFiniteLogitsError(f"the model produced NaN logits ({int(np.isnan(x).sum())} tokens).")
        if top == np.inf:
            raise NoFiniteLogitsError("the model produced +inf logits.")
        if top == -np.inf:
            raise NoFiniteLogitsError("the model produced no finite logit (all -inf).")
        w = x
        if self._bias_ids.size:
            w = x.copy()
            # one vectorised step, whatever the entry count; |bias| <= 1e4 is below float32's
            # spacing near its limit, so the sum cannot overflow
            w[self._bias_ids] += self._bias_vals
        if allowed is not None:
            mask = np.asarray(allowed, dtype=bool)
            if mask.shape != (self.vocab_size,):
                raise ValueError(f"allowed must have shape ({self.vocab_size},), got {mask.shape}.")
            w = np.where(mask, w, np.float32(-np.inf))
        return x, w

    def _greedy(self, w: np.ndarray) -> int:
        c: st.Cands = (self._arange, w)
        with np.errstate(over="ignore", invalid="ignore"):  # checked below: argmax lands on a NaN
            for link in self.chain.greedy:
                c = link(c, NO_DRAWS)
        logits = c[1]
        best = int(np.argmax(logits))
        if not np.isfinite(logits[best]):
            raise self.chain.explain((self._arange, w), NO_DRAWS, greedy=True)
        return best

    def _distribution(self, w: np.ndarray, position: int, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(token ids ascending, probs) of the final distribution for non-greedy sampling."""
        if w.min() == -np.inf:
            ids = np.flatnonzero(w > -np.inf)
            if ids.size == 0:
                raise no_token_left()
            c: st.Cands = (ids, w[ids])
        else:
            c = (self._arange, w)
        return self._distribution_of(c, position, u)

    def _distribution_of(self, c: st.Cands, position: int, u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The final distribution from finite candidates `c` (ids ascending) through the chain."""
        start = c
        chain = self.chain
        with np.errstate(over="ignore", invalid="ignore"):  # an overflow is caught by the check below
            for link in chain.links:
                c = link(c, u)
            if chain.mirostat is not None:
                c = chain.mirostat(c, self.mu)
        ids, logits = c
        if not np.isfinite(logits.max()):  # NaN or +inf would empty the distribution below
            raise chain.explain(start, u)
        probs = st.softmax(logits)
        nz = probs > 0.0
        if not nz.all():
            ids, probs = ids[nz], probs[nz]
        probs = probs.astype(np.float64)
        probs /= probs.sum()
        if self.params.mirostat:
            self._pending = (position, ids, probs)
        return ids, probs

    def _check_position(self, position: int) -> int:
        pos = int(position)
        if pos < 0:
            raise ValueError(f"position must be >= 0, got {position}.")
        return pos

    def final_distribution(
        self, logits: np.ndarray, position: int, allowed: np.ndarray | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """(token_ids ascending, probs summing to 1) the chain would draw from at this step."""
        pos = self._check_position(position)
        _, w = self._prepare(logits, allowed)
        if self.params.is_greedy:
            best = self._greedy(w)
            ids, probs = np.array([best], dtype=np.int64), np.array([1.0])
            if self.params.mirostat:
                self._pending = (pos, ids, probs)
            return ids, probs
        return self._distribution(w, pos, self._rng.uniforms(pos, 1 + self._n_xtc))

    def sample(
        self,
        logits: np.ndarray,
        position: int,
        allowed: np.ndarray | None = None,
        argmax: int | None = None,
    ) -> SampledToken:
        """Draw this step's token. ``logits`` (float32 [vocab]) is not mutated.

        ``position`` is the 0-based index of the generated token within the request; the draw's
        randomness depends only on (seed, position). ``allowed`` is an optional bool mask [vocab].
        ``argmax`` is ``logits.argmax()`` when the caller took it for a whole batch at once; plain
        greedy params (:attr:`SamplingParams.is_plain_greedy`) then only check that its logit is
        finite (argmax lands on a NaN if there is one). Raises :class:`NoFiniteLogitsError` if no
        token can be drawn.
        """
        pos = self._check_position(position)
        if argmax is not None and allowed is None and self.plain_greedy and np.isfinite(logits[argmax]):
            return SampledToken(int(argmax), None, ())
        x, w = self._prepare(logits, allowed)
        if self.params.is_greedy:
            token = self._greedy(w)
            if self.params.mirostat:
                self._pending = (pos, np.array([token]), np.array([1.0]))
        else:
            u = self._rng.uniforms(pos, 1 + self._n_xtc)
            token = _draw(*self._distribution(w, pos, u), u)
        if not self.params.logprobs:
            return SampledToken(token, None, ())
        top = float(x.max())
        lse = top + math.log(float(np.exp(x - top).sum(dtype=np.float64)))
        logprob = float(x[token]) - lse
        alts: tuple[tuple[int, float], ...] = ()
        if self.params.n_probs > 0:
            k = min(self.params.n_probs, self.vocab_size)
            sel = st.top_indices(self._arange, x, k)
            sel = sel[st.order_desc(sel, x[sel])]
            alts = tuple((int(t), float(x[t]) - lse) for t in sel)
        return SampledToken(token, logprob, alts)

    def sample_candidates(self, ids: np.ndarray, logits: np.ndarray, position: int) -> SampledToken:
        """Draw this step's token from candidates a device picked (envelope sampling, see
        `infer.engine.sampling.envelope`): `ids` ascending with their finite, biased float32 `logits`,
        the set the chain's first truncating stage keeps. The rest of the chain, the uniform of
        (seed, position) and the draw are :meth:`sample`'s own, so the token is the one it draws
        from the full row. Only for params inside the envelope (no logprobs, not greedy)."""
        pos = self._check_position(position)
        u = self._rng.uniforms(pos, 1 + self._n_xtc)
        c: st.Cands = (np.asarray(ids, dtype=np.int64), np.asarray(logits, dtype=np.float32))
        return SampledToken(_draw(*self._distribution_of(c, pos, u), u), None, ())


def _draw(ids: np.ndarray, probs: np.ndarray, u: np.ndarray) -> int:
    """The inverse-CDF draw of uniform u[0] over `probs` of `ids` (in id order)."""
    cdf = np.cumsum(probs)
    j = int(np.searchsorted(cdf, u[0] * cdf[-1], side="right"))
    return int(ids[min(j, ids.shape[0] - 1)])
