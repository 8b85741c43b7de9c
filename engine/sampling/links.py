"""A request's sampler chain, built once: each stage with its parameters bound, in ``samplers`` order.

As llama.cpp's sampler chain and mlx-lm's ``make_sampler`` compose small ``apply_top_k``/``apply_min_p``
functions, :func:`build_chain` turns the params into a tuple of :data:`Stage` callables when the
request's sampler is made; a step then calls them in order, with no per-token dispatch on stage names.
A stage that is off at the params (it would return every candidate unchanged) is left out.

A new stage is a pure function in :mod:`~infer.engine.sampling.stages`, a maker in
:data:`STAGE_MAKERS`, and its name in :data:`~infer.engine.sampling.params.SAMPLER_STAGES`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from infer.engine.sampling import stages as st
from infer.engine.sampling.history import TokenHistory
from infer.engine.sampling.params import NoFiniteLogitsError, SamplingParams

__all__ = [
    "NO_DRAWS",
    "STAGE_MAKERS",
    "Chain",
    "Stage",
    "StageMaker",
    "build_chain",
    "finite_check",
    "make_stage",
    "no_token_left",
]

Stage = Callable[[st.Cands, np.ndarray], st.Cands]
"""One link of a request's chain: (candidates, this step's uniforms) -> candidates. Its parameters
are bound when the chain is built; only ``xtc`` reads a uniform (its coin)."""

StageMaker = Callable[[SamplingParams, int], "Stage | None"]
"""Builds a stage from the params and its coin index (``xtc`` only); None when the stage is off at
these params (it would return every candidate unchanged), so the chain leaves it out."""

NO_DRAWS = np.zeros(0)
NO_DRAWS.flags.writeable = False  # the greedy chain's "uniforms": its stages read none


def _top_n_sigma(p: SamplingParams, coin: int) -> Stage | None:
    n_sigma = p.top_n_sigma
    return None if n_sigma <= 0.0 else lambda c, u: st.top_n_sigma(c, n_sigma)


def _top_k(p: SamplingParams, coin: int) -> Stage | None:
    k = p.top_k
    return None if k <= 0 else lambda c, u: st.top_k(c, k)


def _typical(p: SamplingParams, coin: int) -> Stage | None:
    mass, min_keep = p.typical_p, p.min_keep
    return None if mass >= 1.0 else lambda c, u: st.typical(c, mass, min_keep)


def _top_p(p: SamplingParams, coin: int) -> Stage | None:
    mass, min_keep = p.top_p, p.min_keep
    return None if mass >= 1.0 else lambda c, u: st.top_p(c, mass, min_keep)


def _min_p(p: SamplingParams, coin: int) -> Stage | None:
    ratio, min_keep = p.min_p, p.min_keep
    return None if ratio <= 0.0 else lambda c, u: st.min_p(c, ratio, min_keep)


def _xtc(p: SamplingParams, coin: int) -> Stage | None:
    chance, threshold, min_keep = p.xtc_probability, p.xtc_threshold, p.min_keep
    if chance <= 0.0 or threshold > 0.5:
        return None
    return lambda c, u: st.xtc(c, chance, threshold, min_keep, float(u[coin]))


def _temperature(p: SamplingParams, coin: int) -> Stage | None:
    temp, dyn_range, dyn_exponent = p.temperature, p.dynatemp_range, p.dynatemp_exponent
    if dyn_range <= 0.0 and temp == 1.0:
        return None
    return lambda c, u: st.temperature(c, temp, dyn_range, dyn_exponent)


STAGE_MAKERS: dict[str, StageMaker] = {
    "top_n_sigma": _top_n_sigma,
    "top_k": _top_k,
    "typ_p": _typical,
    "top_p": _top_p,
    "min_p": _min_p,
    "xtc": _xtc,
    "temperature": _temperature,
}
"""The history-free stages by name. ``penalties`` and ``dry`` read the request's history: see
:func:`build_chain`."""


def make_stage(name: str, params: SamplingParams, coin: int = 1) -> Stage | None:
    """The history-free stage ``name`` with ``params`` bound (None when it is off at these params);
    ``coin`` is the index of its uniform (``xtc`` only: 1 for the first xtc of the chain)."""
    return STAGE_MAKERS[name](params, coin)


STAGE_PARAMETERS: dict[str, str] = {
    "logit_bias": "logit_bias",
    "penalties": "repeat_penalty",
    "dry": "dry_multiplier",
    "temperature": "temperature",
    "mirostat": "mirostat",
    "top_n_sigma": "top_n_sigma",
    "top_k": "top_k",
    "typ_p": "typical_p",
    "top_p": "top_p",
    "min_p": "min_p",
    "xtc": "xtc_probability",
}
"""The setting a stage's failure is reported under (the stage that can push logits out of range)."""


def no_token_left(stage: str = "logit_bias") -> NoFiniteLogitsError:
    """The error of a chain that leaves no candidate with a finite logit after ``stage``."""
    parameter = STAGE_PARAMETERS.get(stage, stage)
    where = "logit_bias and the allowed mask" if stage == "logit_bias" else f"the {stage} stage"
    return NoFiniteLogitsError(
        f"no token can be sampled: every token is at -inf after {where} (parameter {parameter}).",
        parameter,
    )


def out_of_range(stage: str) -> NoFiniteLogitsError:
    """The error of a stage whose arithmetic left a NaN or +inf logit."""
    parameter = STAGE_PARAMETERS.get(stage, stage)
    return NoFiniteLogitsError(
        f"no token can be sampled: the {stage} stage pushed a logit to NaN or +inf (parameter {parameter}).",
        parameter,
    )


def finite_check(logits: np.ndarray, stage: str) -> None:
    """Raise the error naming ``stage`` unless the best logit is finite (NaN propagates to the max)."""
    top = logits.max()
    if not np.isfinite(top):
        raise no_token_left(stage) if top == -np.inf else out_of_range(stage)


def _check_left(stage: str) -> Stage:
    """A link that passes ``c`` through; it raises, naming ``stage`` (the link before it), when no
    candidate has a finite logit."""

    def check_left(c: st.Cands, u: np.ndarray) -> st.Cands:
        if c[1].max() == -np.inf:
            raise no_token_left(stage)
        return c

    return check_left


def _checked(modifier: Stage, stage: str) -> Stage:
    """``modifier`` followed by a check that a candidate is left: a logit modifier may push every
    logit to -inf (or, from extreme logits, one to +inf)."""

    def checked(c: st.Cands, u: np.ndarray) -> st.Cands:
        c = modifier(c, u)
        finite_check(c[1], stage)
        return c

    return checked


def _penalties(p: SamplingParams, history: TokenHistory, full: np.ndarray) -> Stage | None:
    """Repetition, frequency and presence penalties over the last ``repeat_last_n`` tokens."""
    if not p.penalties_active:
        return None
    repeat, freq, present, last_n = p.repeat_penalty, p.frequency_penalty, p.presence_penalty, p.repeat_last_n

    def penalties(c: st.Cands, u: np.ndarray) -> st.Cands:
        window = history.window(last_n)
        if not window.size:
            return c
        toks, counts = np.unique(window, return_counts=True)
        return st.penalties(c, toks, counts.astype(np.float64), repeat, freq, present, c[0] is full)

    return penalties


def _dry(p: SamplingParams, history: TokenHistory, full: np.ndarray) -> Stage | None:
    """DRY penalties over the last ``dry_penalty_last_n`` tokens."""
    if not p.dry_active:
        return None
    multiplier, base, allowed, last_n = (
        p.dry_multiplier,
        p.dry_base,
        p.dry_allowed_length,
        p.dry_penalty_last_n,
    )

    def dry(c: st.Cands, u: np.ndarray) -> st.Cands:
        window = history.window(last_n)
        toks, amounts = st.dry_penalties(window, history.breaker_mask(), multiplier, base, allowed)
        return st.subtract(c, toks, amounts, c[0] is full)

    return dry


@dataclass(frozen=True)
class Chain:
    """A request's sampler chain (:func:`build_chain`)."""

    links: tuple[Stage, ...]
    """Sampling: applied in order to the finite candidates."""
    greedy: tuple[Stage, ...]
    """Greedy: the logit modifiers that are on, in order (then the argmax)."""
    mirostat: Callable[[st.Cands, float], st.Cands] | None = None
    """Mirostat's truncation, applied after ``links`` with the request's running ``mu``."""
    names: tuple[str, ...] = ()
    """The stage name of each of ``links`` (a check after an off modifier is named by the stage
    before it), so a failure found after the chain can be traced to the stage and setting."""
    greedy_names: tuple[str, ...] = ()
    """The stage name of each of ``greedy``."""

    def explain(self, c: st.Cands, u: np.ndarray, greedy: bool = False) -> NoFiniteLogitsError:
        """Replay the chain from ``c`` and return the error naming the first stage after which no
        finite candidate is left (the slow path, taken only after a step already failed)."""
        links, names = (self.greedy, self.greedy_names) if greedy else (self.links, self.names)
        try:
            with np.errstate(all="ignore"):
                finite_check(c[1], "logit_bias")
                for link, name in zip(links, names, strict=True):
                    c = link(c, u)
                    finite_check(c[1], name)
        except NoFiniteLogitsError as exc:
            return exc
        last = "mirostat" if self.mirostat is not None and not greedy else (names or ("logit_bias",))[-1]
        return out_of_range(last)


def build_chain(params: SamplingParams, history: TokenHistory, full: np.ndarray) -> Chain:
    """The chain of ``params``, built once per request.

    ``history`` is what penalties and DRY read; ``full`` is the ``arange`` the whole-vocabulary
    candidate set starts from (a modifier indexes it directly). With mirostat the chain is
    temperature then mirostat (``samplers`` ignored, as llama.cpp). Otherwise it is ``samplers`` in
    order, each stage that is on. The greedy chain holds only the logit modifiers (penalties, dry)
    that are on: truncation cannot move the argmax, and greedy skips XTC and typical-p. A modifier is
    followed by a check that a candidate is left; a modifier that is off keeps that check only where
    an earlier link (a temperature overflowing to -inf, a modifier) could have left none: before that
    the candidates are a subset of the finite starting set, so the check could not fire.
    """
    p = params
    if p.mirostat:
        temp = p.temperature
        truncate = (
            functools.partial(st.mirostat_v1, n_vocab=full.shape[0]) if p.mirostat == 1 else st.mirostat_v2
        )
        return Chain((lambda c, u: st.temperature(c, temp),), (), truncate, ("temperature",))
    links: list[Stage] = []
    names: list[str] = []
    greedy: list[Stage] = []
    greedy_names: list[str] = []
    may_empty = False
    coin = 0
    for name in p.samplers:
        if name in ("penalties", "dry"):
            modifier = (_penalties if name == "penalties" else _dry)(p, history, full)
            if modifier is not None:
                greedy.append(modifier)
                greedy_names.append(name)
                links.append(_checked(modifier, name))
                names.append(name)
                may_empty = True
            elif may_empty:
                links.append(_check_left(names[-1]))
                names.append(names[-1])
            continue
        coin += name == "xtc"
        stage = make_stage(name, p, coin)
        if stage is not None:
            links.append(stage)
            names.append(name)
            may_empty = may_empty or name == "temperature"
    return Chain(tuple(links), tuple(greedy), names=tuple(names), greedy_names=tuple(greedy_names))
