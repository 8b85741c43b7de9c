"""The sampler chain is built once per request: stage links with their parameters bound."""

from __future__ import annotations

import math

import numpy as np
import pytest

from infer.engine.sampling import (
    NoFiniteLogitsError,
    SamplingParams,
    SequenceSampler,
    make_stage,
)
from infer.engine.sampling import links as lk
from infer.engine.sampling import stages as st

RNG = np.random.default_rng(3)
LOGITS = (RNG.standard_normal(200) * 2.0).astype(np.float32)
CANDS = (np.arange(200, dtype=np.int64), LOGITS)
OFF = {"top_k": 0, "top_p": 1.0, "min_p": 0.0, "temperature": 1.0, "samplers": "penalties"}


def make(params: SamplingParams, vocab: int = 200, **kw) -> SequenceSampler:
    return SequenceSampler(params, seed=5, vocab_size=vocab, **kw)


@pytest.mark.parametrize(
    ("name", "params", "direct"),
    [
        ("top_k", SamplingParams(top_k=7), lambda c: st.top_k(c, 7)),
        ("top_p", SamplingParams(top_p=0.6, min_keep=2), lambda c: st.top_p(c, 0.6, 2)),
        ("min_p", SamplingParams(min_p=0.2), lambda c: st.min_p(c, 0.2, 0)),
        ("typ_p", SamplingParams(typical_p=0.7), lambda c: st.typical(c, 0.7, 0)),
        ("top_n_sigma", SamplingParams(top_n_sigma=1.0), lambda c: st.top_n_sigma(c, 1.0)),
        (
            "temperature",
            SamplingParams(temperature=0.7, dynatemp_range=0.3),
            lambda c: st.temperature(c, 0.7, 0.3, 1.0),
        ),
    ],
)
def test_a_link_is_its_stage_with_the_params_bound(name, params, direct):
    link = make_stage(name, params)
    assert link is not None
    got, want = link(CANDS, lk.NO_DRAWS), direct(CANDS)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


def test_xtc_link_reads_its_own_coin():
    params = SamplingParams(xtc_probability=0.5, xtc_threshold=0.01)
    second = make_stage("xtc", params, coin=2)
    assert second is not None
    fires, skips = np.array([0.9, 0.9, 0.1]), np.array([0.1, 0.1, 0.9])
    assert second(CANDS, fires)[0].shape[0] < 200  # coin u[2] = 0.1 <= 0.5: top choices removed
    assert second(CANDS, skips) is CANDS  # coin u[2] = 0.9 > 0.5: unchanged


@pytest.mark.parametrize(
    ("name", "params"),
    [
        ("top_k", SamplingParams(top_k=0)),
        ("top_p", SamplingParams(top_p=1.0)),
        ("min_p", SamplingParams(min_p=0.0)),
        ("typ_p", SamplingParams(typical_p=1.0)),
        ("top_n_sigma", SamplingParams(top_n_sigma=-1)),
        ("xtc", SamplingParams(xtc_probability=0.0)),
        ("xtc", SamplingParams(xtc_probability=1.0, xtc_threshold=0.6)),
        ("temperature", SamplingParams(temperature=1.0)),
    ],
)
def test_a_stage_that_is_off_is_left_out(name, params):
    assert make_stage(name, params) is None


def test_the_chain_is_built_once_not_per_token(monkeypatch):
    built: list[str] = []

    def counting(name, maker):
        def make(params, coin):
            built.append(name)
            return maker(params, coin)

        return make

    for name, maker in list(lk.STAGE_MAKERS.items()):
        monkeypatch.setitem(lk.STAGE_MAKERS, name, counting(name, maker))
    params = SamplingParams(top_k=20, xtc_probability=0.3, samplers="kxpmxt", repeat_penalty=1.2)
    sampler = make(params, prompt_ids=[1, 2, 3])
    assert built == ["top_k", "xtc", "top_p", "min_p", "xtc", "temperature"]
    for pos in range(12):
        sampler.accept(sampler.sample(LOGITS, pos).token_id)
    assert len(built) == 6, "stages were made again while sampling"


def test_an_off_modifier_after_an_overflowing_temperature_still_finds_no_token():
    # the smallest temperature (1e-5) sends logits near float32's limit to -inf; the (off) penalties
    # stage after it keeps the check that some candidate is left, and the error names temperature
    logits = -np.abs(LOGITS) * 1e35 - 1e36
    sampler = make(SamplingParams(temperature=1e-5, samplers="temperature;penalties"))
    with pytest.raises(NoFiniteLogitsError) as info:
        sampler.sample(logits.astype(np.float32), 0)
    assert info.value.parameter == "temperature"


def test_an_active_modifier_that_leaves_nothing_is_an_error():
    # the largest repeat penalty sends every (very negative) logit of the history's tokens to -inf
    logits = np.full(4, -1e36, dtype=np.float32)
    sampler = make(SamplingParams(repeat_penalty=1e6, **OFF), vocab=4, prompt_ids=[0, 1, 2, 3])
    with pytest.raises(NoFiniteLogitsError) as info:
        sampler.sample(logits, 0)
    assert info.value.parameter == "repeat_penalty"


def test_greedy_chain_applies_only_the_active_modifiers_in_order():
    logits = np.array([3.0, 2.9, 1.0, 0.5], dtype=np.float32)
    plain = make(SamplingParams(temperature=0), vocab=4, prompt_ids=[0])
    penalised = make(SamplingParams(temperature=0, repeat_penalty=2.0), vocab=4, prompt_ids=[0])
    assert plain.sample(logits, 0).token_id == 0
    assert penalised.sample(logits, 0).token_id == 1  # 3.0 / 2 = 1.5 < 2.9
    assert math.isclose(float(logits[0]), 3.0)  # logits are not mutated


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(repeat_penalty=1.1, dry_multiplier=0.5, xtc_probability=0.5),
        SamplingParams(mirostat=2),
        SamplingParams(temperature=0, repeat_penalty=1.3),
    ],
)
def test_a_finished_sampler_is_freed_at_once(params):
    # the chain's links hold the history, not the sampler: no reference cycle keeps a finished
    # request's vocabulary-sized arrays alive until the cyclic garbage collector runs
    import weakref

    sampler = make(params, prompt_ids=[1, 2, 3])
    sampler.accept(sampler.sample(LOGITS, 0).token_id)
    ref = weakref.ref(sampler)
    del sampler
    assert ref() is None
