"""Which requests a GPU backend may sample on the device, and the host's half of that sampling.

The device half (`infer.engine.backends.candidates.top_candidates`) returns each row's `width` best
biased logits with their ids. The host half here picks, from those alone, the exact candidate set
the host chain would reach, then runs the host chain's own stages and draw on it
(`SequenceSampler.sample_candidates`), with the same Philox (seed, position) uniform. So a request
inside the envelope draws the same token on the device path as on the host path, by construction:

* top_k (1 <= k < vocab, k <= POOL_LIMIT / 2): the k best are the row's best with value >= the k-th
  best value (ties included, so the host's lowest-id tie rule decides). top_p, min_p and
  temperature then run on exactly the set the host's top_k would have given them.
* no top_k (0 or >= vocab), top_p off, min_p in (0, 1): min_p keeps the values >= max + log(min_p),
  compared on the host in float32 exactly as the host stage compares; the max is the row's first.
* a vocabulary of at most POOL_LIMIT tokens: the device returns the whole row.

A row is handed back to the host path (the full row is copied) when the candidates cannot decide it:
the kept set may run past the `width` returned (ties at the edge, a flat min_p tail), or the row has
a NaN, a +inf or no finite logit (the host path raises its error for those).
"""

from __future__ import annotations

import math

import numpy as np

from infer.engine.sampling.params import DEFAULT_SAMPLERS, SamplingParams

POOL_LIMIT = 1024
"""Most candidates per row the device returns: 4 KiB of logits instead of the vocabulary."""

OUTSIDE_ENVELOPE_FIELDS: tuple[str, ...] = (
    "temperature",
    "dynatemp_range",
    "mirostat",
    "repeat_penalty",
    "frequency_penalty",
    "presence_penalty",
    "dry_multiplier",
    "xtc_probability",
    "typical_p",
    "top_n_sigma",
    "samplers",
    "logprobs",
    "n_probs",
    "min_keep",
    "min_p",
    "top_p",
)
"""Fields whose values can move a request out of the envelope (tests walk each one)."""


def effective_top_k(params: SamplingParams, vocab: int) -> int:
    """top_k clamped to the vocabulary: 0 when it keeps everything (0, or >= vocab)."""
    k = params.top_k
    return 0 if k <= 0 or k >= vocab else k


def in_envelope(params: SamplingParams, vocab: int) -> bool:
    """True when a request with `params` over a vocabulary of `vocab` tokens may be sampled from
    device candidates (see the module docstring); False sends every row of it to the host chain.

    Inside: temperature > 0 without dynamic temperature or mirostat, no penalties, DRY, XTC,
    typical-p or top-n-sigma, the default stage order, no logprobs, min_keep <= 1, min_p < 1, and a
    candidate set bounded by top_k <= POOL_LIMIT / 2 (the device returns 2k, room for ties at the k-th
    value), by min_p (with top_p off), or by the vocabulary.
    """
    p = params
    if (
        p.temperature <= 0.0
        or p.dynatemp_range > 0.0
        or p.mirostat != 0
        or p.penalties_active
        or p.dry_active
        or (p.xtc_probability > 0.0 and p.xtc_threshold <= 0.5)
        or p.typical_p < 1.0
        or p.top_n_sigma > 0.0
        or p.samplers != DEFAULT_SAMPLERS
        or p.logprobs
        or p.min_keep > 1
        or p.min_p >= 1.0
    ):
        return False
    if vocab <= POOL_LIMIT:
        return True
    k = effective_top_k(p, vocab)
    if k:
        return k <= POOL_LIMIT // 2
    return p.min_p > 0.0 and p.top_p >= 1.0


def candidate_width(params: SamplingParams, vocab: int) -> int:
    """How many best logits per row the device must return for an in-envelope request: the vocabulary
    when it is small, else twice top_k (room for ties at the k-th value), else POOL_LIMIT (min_p)."""
    if vocab <= POOL_LIMIT:
        return vocab
    k = effective_top_k(params, vocab)
    return min(vocab, max(2 * k, 64)) if k else min(POOL_LIMIT, vocab)


def kept_candidates(
    params: SamplingParams, vocab: int, values: np.ndarray, ids: np.ndarray
) -> tuple[np.ndarray, np.ndarray] | None:
    """From one row's device candidates (biased float32 `values` descending, their `ids`), the set the
    host chain's first truncating stage keeps, as (ids ascending, values) with -inf dropped; None when
    the candidates cannot decide it (the row goes to the host)."""
    width = values.shape[0]
    complete = width >= vocab
    if complete:
        keep = np.ones(width, dtype=bool)
    elif k := effective_top_k(params, vocab):
        if k > width:
            return None
        cut = values[k - 1]
        keep = values >= cut  # the k best, and every tie at the k-th value
        if keep[-1] and cut > -np.inf:
            return None  # ties at the k-th value may go on past the returned candidates
    else:
        # The host min_p stage: float(max) + log(p), compared with the float32 logits as it does.
        threshold = float(values[0]) + math.log(params.min_p)
        keep = values >= threshold
        if keep[-1]:
            return None
    keep &= values > -np.inf
    if not keep.any():
        return None
    order = np.argsort(ids[keep], kind="stable")
    return ids[keep][order], values[keep][order]
