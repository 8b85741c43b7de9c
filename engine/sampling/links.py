"""The links of a request's sampler chain: each history-free stage with its parameters bound.

A chain is built once per request (:class:`~infer.engine.sampling.chain.SequenceSampler`), as
llama.cpp's sampler chain and mlx-lm's ``make_sampler`` compose small ``apply_top_k``/``apply_min_p``
functions: a step then calls its links in order, with no per-token dispatch on stage names. A new
stage is a pure function in :mod:`~infer.engine.sampling.stages`, a maker here, and its name in
:data:`~infer.engine.sampling.params.SAMPLER_STAGES`.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from infer.engine.sampling import stages as st
from infer.engine.sampling.params import SamplingParams

__all__ = ["NO_DRAWS", "STAGE_MAKERS", "Stage", "StageMaker", "make_stage"]

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
"""The history-free stages by name. ``penalties`` and ``dry`` read the request's history, so
:class:`SequenceSampler` builds them itself."""


def make_stage(name: str, params: SamplingParams, coin: int = 1) -> Stage | None:
    """The history-free stage ``name`` with ``params`` bound (None when it is off at these params);
    ``coin`` is the index of its uniform (``xtc`` only: 1 for the first xtc of the chain)."""
    return STAGE_MAKERS[name](params, coin)
