"""Device-side sampling inside its envelope draws the same tokens as the host sampler.

`sample_on_device` is written over an array module: it runs here with numpy and, where `mlx` imports,
with MLX (and with CuPy on a machine whose cuda probe passes). Every field inside the envelope gets
at least 1,000 seeded draws on synthetic logits (ties and -inf included) compared token for token
with `SequenceSampler.sample` on the full row; every field value outside it is shown to go to the
host; the edge cases of the issue never crash and never give NaN.
"""

from __future__ import annotations

import importlib.util
from typing import Any

import numpy as np
import pytest

from infer.engine.backends.probe import probe_backend
from infer.engine.runtime.device_sampling import sample_on_device
from infer.engine.sampling import NoFiniteLogitsError, SamplingParams, SequenceSampler
from infer.engine.sampling.envelope import POOL_LIMIT, in_envelope

DRAWS = 1000
ROWS = 50
"""Draws run as DRAWS / ROWS batches of ROWS rows (each row its own seed and position)."""


def array_modules() -> list[Any]:
    params = [pytest.param("numpy", id="numpy")]
    params.append(
        pytest.param(
            "mlx",
            id="mlx",
            marks=pytest.mark.skipif(importlib.util.find_spec("mlx") is None, reason="mlx is not installed"),
        )
    )
    params.append(
        pytest.param(
            "cupy",
            id="cupy",
            marks=pytest.mark.skipif(probe_backend("cuda") is not None, reason="no usable CUDA device"),
        )
    )
    return params


def module(name: str) -> tuple[Any, Any]:
    """(array module, device -> numpy copy) for `name`."""
    if name == "numpy":
        return np, np.asarray
    if name == "mlx":
        import mlx.core as mx

        return mx, np.array
    import cupy

    return cupy, cupy.asnumpy


def synthetic_logits(vocab: int, rows: int, seed: int) -> np.ndarray:
    """Model-like rows: a few strong tokens over a long tail; every third row rounded to steps of
    0.25 (ties everywhere, at the top-k edge too), a sprinkle of -inf."""
    rng = np.random.default_rng(seed)
    logits = rng.standard_normal((rows, vocab)).astype(np.float32) * 2.0
    heads = rng.integers(0, vocab, (rows, 8))
    logits[np.arange(rows)[:, None], heads] += rng.uniform(4.0, 9.0, (rows, 8)).astype(np.float32)
    logits[::3] = np.round(logits[::3] * 4) / 4
    logits[rng.random((rows, vocab)) < 0.01] = -np.inf
    return logits


def compare(
    xp_name: str, params: SamplingParams, vocab: int, draws: int = DRAWS, seed: int = 0
) -> tuple[int, int]:
    """(device-decided draws, draws) after asserting every token equals the host sampler's."""
    xp, to_host = module(xp_name)
    decided = total = 0
    for batch in range(draws // ROWS):
        logits = synthetic_logits(vocab, ROWS, seed * 1000 + batch)
        samplers = [SequenceSampler(params, seed=batch * ROWS + r, vocab_size=vocab) for r in range(ROWS)]
        positions = [(batch * 7 + r) % 97 for r in range(ROWS)]
        device = sample_on_device(xp, xp.array(logits), samplers, positions, to_host)
        for row, got in enumerate(device):
            want = samplers[row].sample(logits[row], positions[row])
            total += 1
            if got is not None:
                decided += 1
                assert got.token_id == want.token_id, (params, batch, row)
    return decided, total


BIG_VOCAB = 6000
"""Larger than POOL_LIMIT, so the candidates are a part of the row."""
assert BIG_VOCAB > POOL_LIMIT

IN_ENVELOPE: dict[str, list[dict[str, Any]]] = {
    "temperature": [{"temperature": 0.3}, {"temperature": 1.0}, {"temperature": 2.5}],
    "top_k": [{"top_k": 1}, {"top_k": 40}, {"top_k": 512}, {"top_k": 10**9, "top_p": 1.0, "min_p": 0.05}],
    "top_p": [{"top_p": 0.5}, {"top_p": 0.9}, {"top_p": 1.0}],
    "min_p": [{"min_p": 0.0}, {"min_p": 0.2}, {"min_p": 0.999}, {"top_k": 0, "top_p": 1.0, "min_p": 0.1}],
    "logit_bias": [
        {"logit_bias": {3: 5.0, 17: -2.5, 100: -np.inf}},
        {"logit_bias": {0: 12.0, 1: 12.0}},
    ],
}


@pytest.mark.parametrize("xp_name", array_modules())
@pytest.mark.parametrize("field", sorted(IN_ENVELOPE))
def test_device_draws_equal_host_draws_inside_the_envelope(xp_name: str, field: str) -> None:
    total = 0
    for index, changes in enumerate(IN_ENVELOPE[field]):
        params = SamplingParams(seed=1, **changes)
        assert in_envelope(params, BIG_VOCAB), changes
        decided, draws = compare(xp_name, params, BIG_VOCAB, DRAWS // len(IN_ENVELOPE[field]) + ROWS, index)
        total += draws
        # The device path must really decide (almost) every draw, or the comparison proves nothing.
        assert decided >= 0.9 * draws, (changes, decided, draws)
    assert total >= DRAWS


@pytest.mark.parametrize("xp_name", array_modules())
def test_a_small_vocabulary_is_inside_whatever_the_truncation(xp_name: str) -> None:
    """With vocab <= POOL_LIMIT the device returns the whole row: top_p alone, or nothing at all."""
    for changes in ({"top_k": 0, "top_p": 0.8, "min_p": 0.0}, {"top_k": 0, "top_p": 1.0, "min_p": 0.0}):
        params = SamplingParams(seed=3, **changes)
        assert in_envelope(params, 300) and not in_envelope(params, BIG_VOCAB)
        decided, draws = compare(xp_name, params, 300, 500)
        assert decided == draws


OUTSIDE: dict[str, dict[str, Any]] = {
    "temperature": {"temperature": 0.0},
    "dynatemp_range": {"dynatemp_range": 0.5},
    "mirostat": {"mirostat": 2},
    "repeat_penalty": {"repeat_penalty": 1.1},
    "frequency_penalty": {"frequency_penalty": 0.5},
    "presence_penalty": {"presence_penalty": 0.5},
    "dry_multiplier": {"dry_multiplier": 0.8},
    "xtc_probability": {"xtc_probability": 0.5, "xtc_threshold": 0.1},
    "typical_p": {"typical_p": 0.9},
    "top_n_sigma": {"top_n_sigma": 1.5},
    "samplers": {"samplers": "kpmt"},
    "logprobs": {"logprobs": True},
    "n_probs": {"n_probs": 3},
    "min_keep": {"min_keep": 5},
    "min_p": {"min_p": 1.0},
    "top_k": {"top_k": 513},
    "top_p": {"top_k": 0, "top_p": 0.9},
}


@pytest.mark.parametrize("field", sorted(OUTSIDE))
def test_each_field_outside_the_envelope_is_sampled_on_the_host(field: str) -> None:
    params = SamplingParams(seed=5, **OUTSIDE[field])
    assert not in_envelope(params, BIG_VOCAB)
    logits = synthetic_logits(BIG_VOCAB, 4, 9)
    samplers = [SequenceSampler(params, seed=s, vocab_size=BIG_VOCAB) for s in range(4)]
    assert sample_on_device(np, logits, samplers, [0, 1, 2, 3]) == [None] * 4
    # and the same params with that one field at its default are inside (the field is what decides)
    defaults = SamplingParams(seed=5, top_k=40 if field != "top_p" else 0, min_p=0.05)
    if field == "top_p":
        defaults = defaults.replace(top_p=1.0)
    assert in_envelope(defaults, BIG_VOCAB)


def test_out_of_envelope_rows_beside_inside_rows_are_left_to_the_host() -> None:
    vocab = BIG_VOCAB
    inside, outside = SamplingParams(seed=1), SamplingParams(seed=1, repeat_penalty=1.3)
    samplers = [SequenceSampler(p, seed=1, vocab_size=vocab) for p in (inside, outside, inside)]
    got = sample_on_device(np, synthetic_logits(vocab, 3, 4), samplers, [0, 0, 0])
    assert got[0] is not None and got[1] is None and got[2] is not None


@pytest.mark.parametrize("xp_name", array_modules())
def test_edge_values_never_crash_and_never_give_nan(xp_name: str) -> None:
    """top_k = 10**9, min_p 0.999 and 1.0, NaN rows, all -inf rows, +inf rows: each row is either drawn
    on the device (a real token id) or left to the host, whose sampler draws or raises its own error."""
    xp, to_host = module(xp_name)
    vocab = BIG_VOCAB
    logits = synthetic_logits(vocab, 6, 11)
    logits[1, 5] = np.nan
    logits[2, :] = -np.inf
    logits[3, 9] = np.inf
    logits[4, :] = np.nan
    cases = [
        SamplingParams(seed=2, top_k=10**9),
        SamplingParams(seed=2, top_k=10**9, top_p=1.0),
        SamplingParams(seed=2, min_p=0.999),
        SamplingParams(seed=2, min_p=1.0),
        SamplingParams(seed=2, top_k=10**9, top_p=1.0, min_p=0.999),
    ]
    for params in cases:
        samplers = [SequenceSampler(params, seed=r, vocab_size=vocab) for r in range(6)]
        got = sample_on_device(xp, xp.array(logits), samplers, list(range(6)), to_host)
        for row, token in enumerate(got):
            if token is not None:
                assert row in (0, 5) and 0 <= token.token_id < vocab
                assert np.isfinite(logits[row, token.token_id])
                assert token.token_id == samplers[row].sample(logits[row], row).token_id
                continue
            try:
                host = samplers[row].sample(logits[row], row)
            except NoFiniteLogitsError:
                assert row in (1, 2, 3, 4)
            else:
                assert np.isfinite(logits[row, host.token_id])


def test_top_k_ties_at_the_edge_past_the_candidates_go_to_the_host() -> None:
    """Every logit equal: the k-th value's ties run past the candidates, so the host decides."""
    vocab = BIG_VOCAB
    params = SamplingParams(seed=1, top_k=40)
    sampler = SequenceSampler(params, seed=1, vocab_size=vocab)
    flat = np.zeros((1, vocab), dtype=np.float32)
    assert sample_on_device(np, flat, [sampler], [0]) == [None]
