"""Statistical tests of the sampler chain: seeded draws match analytically computed distributions.

Each configuration draws >= 20,000 tokens (varying position, and for the default chain the seed),
compares the counts with an independently computed target distribution by a chi-square test at
p = 0.001, and checks that the set of tokens ever drawn is exactly the set the stage keeps.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from infer.engine.sampling import SamplingParams, SequenceSampler

N_DRAWS = 20_000
ALPHA = 0.001
VOCAB = 32

# A designed distribution over 32 tokens: distinct logits in [-2, 2], assigned to token ids in a
# fixed shuffled order so that probability order and id order differ.
_PERM = np.random.default_rng(1234).permutation(VOCAB)
LOGITS = np.empty(VOCAB, dtype=np.float32)
LOGITS[_PERM] = np.linspace(2.0, -2.0, VOCAB, dtype=np.float32)


# ----------------------------------------------------------------- chi-square survival function


def _gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x) (series below a + 1, continued fraction above)."""
    if x <= 0.0:
        return 1.0
    log_pre = a * math.log(x) - x - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1.0
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return max(0.0, 1.0 - math.exp(log_pre) * total)
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-15:
            break
    return math.exp(log_pre) * h


def chi2_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square(df)."""
    return _gammaincc(df / 2.0, stat / 2.0)


def test_chi2_sf_matches_closed_forms():
    # df = 2: sf(x) = exp(-x / 2); df = 1: sf(x) = erfc(sqrt(x / 2))
    for x in (0.1, 1.0, 5.0, 13.8, 40.0):
        assert chi2_sf(x, 2) == pytest.approx(math.exp(-x / 2), rel=1e-9)
        assert chi2_sf(x, 1) == pytest.approx(math.erfc(math.sqrt(x / 2)), rel=1e-7)
    # the p = 0.001 critical values from tables
    assert chi2_sf(16.266, 3) == pytest.approx(0.001, rel=2e-3)
    assert chi2_sf(29.588, 10) == pytest.approx(0.001, rel=2e-3)
    assert chi2_sf(61.098, 31) == pytest.approx(0.001, rel=2e-3)


def test_chi2_sf_matches_scipy_when_installed():
    stats = pytest.importorskip("scipy.stats")
    for df in (1, 3, 7, 20, 31):
        for x in (0.5, df * 0.7, float(df), df * 1.8, df + 30.0):
            assert chi2_sf(x, df) == pytest.approx(stats.chi2.sf(x, df), rel=1e-7, abs=1e-14)


# ----------------------------------------------------------------- independent reference chain


def _softmax(d: dict[int, float]) -> dict[int, float]:
    m = max(d.values())
    e = {t: math.exp(v - m) for t, v in d.items()}
    z = sum(e.values())
    return {t: v / z for t, v in e.items()}


def _ranked(d: dict[int, float]) -> list[int]:
    return sorted(d, key=lambda t: (-d[t], t))


def ref_top_k(d, k):
    return {t: d[t] for t in _ranked(d)[:k]} if 0 < k < len(d) else d


def ref_top_p(d, p):
    probs, out, cum = _softmax(d), {}, 0.0
    for t in _ranked(d):
        out[t] = d[t]
        cum += probs[t]
        if cum >= p:
            break
    return out


def ref_min_p(d, p):
    probs = _softmax(d)
    pmax = max(probs.values())
    return {t: v for t, v in d.items() if probs[t] >= p * pmax * (1 - 1e-12)}


def ref_typical(d, p):
    probs = _softmax(d)
    h = -sum(q * math.log(q) for q in probs.values())
    ranked = sorted(d, key=lambda t: (abs(-math.log(probs[t]) - h), t))
    out, cum = {}, 0.0
    for t in ranked:
        out[t] = d[t]
        cum += probs[t]
        if cum > p:
            break
    return out


def ref_top_n_sigma(d, n):
    vals = list(d.values())
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    return {t: v for t, v in d.items() if v >= max(vals) - n * std}


def ref_temp(d, temp):
    return {t: v / temp for t, v in d.items()}


def ref_xtc_cut(d, threshold):
    probs = _softmax(d)
    above = [t for t in _ranked(d) if probs[t] >= threshold]
    if len(above) < 2:
        return d
    return {t: v for t, v in d.items() if t not in above[:-1]}


def _base() -> dict[int, float]:
    return {t: float(v) for t, v in enumerate(LOGITS)}


def _vec(dist: dict[int, float]) -> np.ndarray:
    out = np.zeros(VOCAB)
    for t, q in dist.items():
        out[t] = q
    return out


ALL_OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0}

CASES = {
    "top_k": ({"top_k": 7, "samplers": "top_k"}, lambda d: _softmax(ref_top_k(d, 7))),
    "top_p": ({"top_p": 0.6, "samplers": "top_p"}, lambda d: _softmax(ref_top_p(d, 0.6))),
    "min_p": ({"min_p": 0.2, "samplers": "min_p"}, lambda d: _softmax(ref_min_p(d, 0.2))),
    "typ_p": ({"typical_p": 0.5, "samplers": "typ_p"}, lambda d: _softmax(ref_typical(d, 0.5))),
    "top_n_sigma": (
        {"top_n_sigma": 1.0, "samplers": "top_n_sigma"},
        lambda d: _softmax(ref_top_n_sigma(d, 1.0)),
    ),
    "temperature": ({"temperature": 0.7, "samplers": "temperature"}, lambda d: _softmax(ref_temp(d, 0.7))),
    "xtc": (
        {"xtc_probability": 0.4, "xtc_threshold": 0.05, "samplers": "top_k;xtc", "top_k": 12},
        lambda d: {
            t: 0.6 * q + 0.4 * _softmax(ref_xtc_cut(ref_top_k(d, 12), 0.05)).get(t, 0.0)
            for t, q in _softmax(ref_top_k(d, 12)).items()
        },
    ),
    "default_chain": (
        {"top_k": 10, "top_p": 0.8, "min_p": 0.1, "temperature": 0.8, "samplers": SamplingParams().samplers},
        lambda d: _softmax(ref_temp(ref_min_p(ref_top_p(ref_top_k(d, 10), 0.8), 0.1), 0.8)),
    ),
}


def _draw(sampler_for_seed, n: int, vary_seed: bool) -> np.ndarray:
    counts = np.zeros(VOCAB, dtype=np.int64)
    if vary_seed:
        for seed in range(n):
            counts[sampler_for_seed(seed).sample(LOGITS, 3).token_id] += 1
    else:
        sampler = sampler_for_seed(7)
        for pos in range(n):
            counts[sampler.sample(LOGITS, pos).token_id] += 1
    return counts


def _check(counts: np.ndarray, target: np.ndarray, support: set[int]) -> None:
    drawn = {int(t) for t in np.flatnonzero(counts)}
    assert drawn == support, f"drawn {sorted(drawn)} != kept {sorted(support)}"
    idx = np.flatnonzero(target)
    expected = target[idx] * counts.sum()
    stat = float(np.sum((counts[idx] - expected) ** 2 / expected))
    p_value = chi2_sf(stat, idx.size - 1) if idx.size > 1 else 1.0
    assert p_value > ALPHA, f"chi2={stat:.1f} df={idx.size - 1} p={p_value:.2e}"


@pytest.mark.parametrize("name", list(CASES))
def test_stage_distribution(name):
    overrides, reference = CASES[name]
    params = SamplingParams(**{**ALL_OFF, **overrides})
    target = _vec(reference(_base()))
    fresh = lambda seed: SequenceSampler(params, seed=seed, vocab_size=VOCAB)  # noqa: E731
    ids, probs = fresh(0).final_distribution(LOGITS, 3)
    if name != "xtc":  # XTC's final distribution depends on the step's coin
        np.testing.assert_allclose(
            _vec(dict(zip(ids.tolist(), probs.tolist(), strict=True))), target, atol=1e-6
        )
    support = {int(t) for t in np.flatnonzero(target)}
    counts = _draw(fresh, N_DRAWS, vary_seed=(name == "default_chain"))
    _check(counts, target, support)


def test_xtc_final_distribution_is_one_of_two_branches():
    params = SamplingParams(**{**ALL_OFF, **CASES["xtc"][0]})
    s = SequenceSampler(params, seed=11, vocab_size=VOCAB)
    kept = ref_top_k(_base(), 12)
    branches = {frozenset(kept), frozenset(ref_xtc_cut(kept, 0.05))}
    seen = {frozenset(s.final_distribution(LOGITS, pos)[0].tolist()) for pos in range(200)}
    assert seen == branches


def test_penalties_and_dry_distribution():
    # history: token 3 twice and token 5 once in the window; "1 2 4 1 2" makes 4 extend a repeat
    prompt = [9, 3, 3, 5, 1, 2, 4, 1, 2]
    params = SamplingParams(
        **{**ALL_OFF, "samplers": "penalties;dry"},
        repeat_penalty=1.5,
        frequency_penalty=0.3,
        presence_penalty=0.2,
        repeat_last_n=8,
        dry_multiplier=1.2,
        dry_base=2.0,
        dry_allowed_length=2,
    )
    d = _base()
    counts = {3: 2, 5: 1, 1: 2, 2: 2, 4: 1}  # token 9 is outside the last 8
    for t, n in counts.items():
        v = d[t] * 1.5 if d[t] <= 0 else d[t] / 1.5
        d[t] = v - n * 0.3 - 0.2
    d[4] -= 1.2 * 2.0 ** (2 - 2)
    target = _vec(_softmax(d))
    fresh = lambda seed: SequenceSampler(params, seed=seed, vocab_size=VOCAB, prompt_ids=prompt)  # noqa: E731
    ids, probs = fresh(0).final_distribution(LOGITS, 0)
    np.testing.assert_allclose(_vec(dict(zip(ids.tolist(), probs.tolist(), strict=True))), target, atol=1e-6)
    _check(_draw(fresh, N_DRAWS, vary_seed=False), target, set(range(VOCAB)))


# ----------------------------------------------------------------- envelope sampling on a device

DEVICE_CASES = ("top_k", "top_p", "min_p", "temperature", "default_chain")
"""The cases inside the device-sampling envelope (with the default stage order, equivalent here)."""


@pytest.mark.parametrize("xp_name", ["numpy", "mlx"])
@pytest.mark.parametrize("name", DEVICE_CASES)
def test_device_envelope_distribution(name: str, xp_name: str) -> None:
    """The device path (candidates on the array module, draw finished on the host) has the stage's
    distribution: the same chi-square check on N_DRAWS draws, batch rows at distinct positions."""
    from infer.engine.runtime.device_sampling import sample_on_device
    from infer.engine.sampling.envelope import in_envelope

    if xp_name == "mlx":
        mx = pytest.importorskip("mlx.core", reason="mlx is not installed")
        xp, to_host = mx, np.array
    else:
        xp, to_host = np, np.asarray
    overrides, reference = CASES[name]
    params = SamplingParams(**{**ALL_OFF, **overrides, "samplers": SamplingParams().samplers})
    assert in_envelope(params, VOCAB)
    target = _vec(reference(_base()))
    sampler = SequenceSampler(params, seed=21, vocab_size=VOCAB)
    rows = 2000
    logits = xp.array(np.broadcast_to(LOGITS, (rows, VOCAB)).copy())
    counts = np.zeros(VOCAB, dtype=np.int64)
    for start in range(0, N_DRAWS, rows):
        drawn = sample_on_device(xp, logits, [sampler] * rows, list(range(start, start + rows)), to_host)
        assert all(token is not None for token in drawn)
        np.add.at(counts, [token.token_id for token in drawn if token is not None], 1)
    _check(counts, target, {int(t) for t in np.flatnonzero(target)})
