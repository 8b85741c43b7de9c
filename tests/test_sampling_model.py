"""The classic sampling bug on the real model: requests decoded greedily whatever their temperature."""

from __future__ import annotations

import pytest

from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

pytestmark = pytest.mark.real_model

PROMPT = "The best thing about the weekend is"


@pytest.fixture(scope="module")
def engine(default_model_path) -> Engine:
    """The default model with room for 8 concurrent sequences, on the default (batch-invariant) exact
    kernels: with `blas` a row's bits follow the batch's shape (BLAS picks its blocking by it), and at
    temperature 5 almost every draw is near a tie, so a seed alone and batched may part (seen on an
    AVX-512 Xeon and on Zen 4: issue 28)."""
    return load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=8), cpu_kernels="exact")


def _ids(engine: Engine) -> tuple[int, ...]:
    return tuple(engine.tokenizer.encode(PROMPT))


def test_temperature_5_is_not_greedy_and_seeds_reproduce(engine: Engine) -> None:
    prompt = _ids(engine)
    greedy = engine.generate(Request(prompt, SamplingParams(temperature=0.0), max_tokens=8, ignore_eos=True))
    hot = [SamplingParams(temperature=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=seed) for seed in range(32)]
    streams = [engine.submit(Request(prompt, params, max_tokens=8, ignore_eos=True)) for params in hot]
    sampled = [s.result().token_ids for s in streams]
    assert sum(ids != greedy.token_ids for ids in sampled) >= 30
    assert len(set(sampled)) >= 30  # different seeds really draw differently
    # The same seed twice, alone, gives the same tokens as it did inside the batch of 32.
    for seed in (0, 17):
        alone = engine.generate(Request(prompt, hot[seed], max_tokens=8, ignore_eos=True)).token_ids
        assert alone == sampled[seed]
        assert engine.generate(Request(prompt, hot[seed], max_tokens=8, ignore_eos=True)).token_ids == alone


def test_seed_alone_and_in_a_batch_of_four(engine: Engine) -> None:
    prompt = _ids(engine)
    params = SamplingParams(temperature=0.9, seed=1234)
    alone = engine.generate(Request(prompt, params, max_tokens=12, ignore_eos=True)).token_ids
    others = [
        tuple(engine.tokenizer.encode(t)) for t in ("Once upon a time", "def main():", "Water boils at")
    ]
    streams = [engine.submit(Request(prompt, params, max_tokens=12, ignore_eos=True))] + [
        engine.submit(Request(ids, SamplingParams(temperature=0.9), max_tokens=12, ignore_eos=True))
        for ids in others
    ]
    assert streams[0].result().token_ids == alone
    assert all(s.result().done.finish_reason == "length" for s in streams[1:])
