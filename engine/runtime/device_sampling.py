"""Envelope sampling for a batch of logits rows that live on a device: the device returns each row's
best candidates (`backends.candidates`), the host finishes the draws (`sampling.envelope`).

Written over an array module (numpy, mlx.core, cupy): the same code runs on the cpu in tests and on
the device in a GPU backend. Rows outside the envelope, or that their candidates cannot decide, come
back as None: the caller copies those rows to the host and runs the ordinary sampler on them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from infer.engine.backends.arrays import Array
from infer.engine.backends.candidates import RowBias, top_candidates
from infer.engine.sampling import SampledToken, SequenceSampler
from infer.engine.sampling.envelope import candidate_width, in_envelope, kept_candidates


def envelope_rows(samplers: Sequence[SequenceSampler], vocab: int) -> list[bool]:
    """Whether each row's request is inside the envelope (a pure function of its params)."""
    return [in_envelope(s.params, vocab) for s in samplers]


def sample_on_device(
    xp: Any,
    logits: Array,
    samplers: Sequence[SequenceSampler],
    positions: Sequence[int],
    to_host: Callable[[Any], np.ndarray] = np.asarray,
) -> list[SampledToken | None]:
    """Row i of `logits` (an `xp` array [rows, vocab]) drawn for `samplers[i]` at `positions[i]`: the
    token the host sampler would draw, or None where the host must sample the full row."""
    rows, vocab = int(logits.shape[0]), int(logits.shape[1])
    inside = envelope_rows(samplers, vocab)
    results: list[SampledToken | None] = [None] * rows
    if not any(inside):
        return results
    bias_rows, bias_tokens, bias_values = [], [], []
    for row, sampler in enumerate(samplers):
        bias = sampler.params.logit_bias
        if inside[row] and bias:
            bias_rows.extend([row] * len(bias))
            bias_tokens.extend(bias.keys())
            bias_values.extend(bias.values())
    bias = RowBias(
        np.asarray(bias_rows, dtype=np.int64),
        np.asarray(bias_tokens, dtype=np.int64),
        np.asarray(bias_values, dtype=np.float32),
    )
    width = max(candidate_width(s.params, vocab) for s, ok in zip(samplers, inside, strict=True) if ok)
    found = top_candidates(xp, logits, bias, width, to_host)
    for row, sampler in enumerate(samplers):
        if not inside[row] or found.unsafe[row]:
            continue
        kept = kept_candidates(sampler.params, vocab, found.values[row], found.ids[row])
        if kept is not None:
            results[row] = sampler.sample_candidates(kept[0], kept[1], positions[row])
    return results
