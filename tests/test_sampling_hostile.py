"""Hostile sampler settings (issue 19, rows 1-4): every float field at extreme values is either refused
up front naming the field, or samples a token; the chain never indexes an empty candidate set, and a
step that cannot sample says which setting is responsible. Property tests run with numpy warnings as
errors: an overflow inside the chain is handled, never printed."""

from __future__ import annotations

import dataclasses
import json
import math
import time
import warnings

import numpy as np
import pytest
from cli_process import infer_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from infer.engine.sampling import NoFiniteLogitsError, SamplingParams, SamplingParamsError, SequenceSampler
from infer.engine.sampling.params import (
    FIELD_RANGES,
    LOGIT_BIAS_LIMIT,
    MAX_LOGIT_BIAS_ENTRIES,
    MIN_TEMPERATURE,
)

pytest_plugins = ["conftest_synthetic"]

VOCAB = 64
FLOAT_FIELDS = [f.name for f in dataclasses.fields(SamplingParams) if f.type == "float"]
EXTREMES = [
    0.0, -0.0, 5e-324, 1e-130, 1e-45, 1e-40, 1e-6, 1e-5, 0.5, 1.0, 2.0, 1e4, 1e6, 1e30, 3e38, 3.5e38,
    1e39, 1e308, -5e-324, -1e-45, -1.0, -1e4, -1e308, math.inf, -math.inf, math.nan,
]  # fmt: skip
PROPERTY = settings(
    max_examples=250, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow]
)


def _sampler(params: SamplingParams, prompt: list[int]) -> SequenceSampler:
    texts = [f"t{i}" if i % 7 else "\n" for i in range(VOCAB)]
    return SequenceSampler(params, seed=11, vocab_size=VOCAB, prompt_ids=prompt, token_texts=texts)


def _params_or_refusal(values: dict[str, object]) -> SamplingParams | None:
    try:
        return SamplingParams(**values)
    except SamplingParamsError as exc:
        assert exc.parameter in values, f"{exc.parameter} blamed for {values}"
        assert exc.parameter in str(exc)
        return None


def _run_steps(sampler: SequenceSampler, logits: np.ndarray, steps: int = 4) -> None:
    for pos in range(steps):
        token = sampler.sample(logits, pos)
        assert 0 <= token.token_id < VOCAB
        if token.logprob is not None:
            assert math.isfinite(token.logprob)
        sampler.accept(token.token_id)


settings_strategy = hs.dictionaries(
    hs.sampled_from(FLOAT_FIELDS),
    hs.one_of(hs.sampled_from(EXTREMES), hs.floats(allow_nan=True, allow_infinity=True)),
    min_size=1,
    max_size=4,
)
base_strategy = hs.fixed_dictionaries(
    {
        "mirostat": hs.sampled_from([0, 0, 1, 2]),
        "repeat_last_n": hs.sampled_from([0, 8, -1]),
        "samplers": hs.sampled_from(["edskypmxt", "temperature;penalties;dry", "tpe", "kt"]),
        "n_probs": hs.sampled_from([0, 3]),
    }
)


@PROPERTY
@given(base=base_strategy, values=settings_strategy, seed=hs.integers(0, 2**32 - 1))
def test_every_float_field_at_extreme_values_is_refused_or_samples(base, values, seed):
    """Model-sized logits (|x| <= 1e3): a validated request always samples, warnings are errors."""
    params = _params_or_refusal({**base, **values})
    if params is None:
        return
    logits = (np.random.default_rng(seed).standard_normal(VOCAB) * 30).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run_steps(_sampler(params, [1, 2, 3, 1, 2]), logits)


@PROPERTY
@given(
    base=base_strategy,
    values=settings_strategy,
    scale=hs.sampled_from([1e4, 1e20, 1e33, 1e36, 3e38]),
    seed=hs.integers(0, 2**32 - 1),
)
def test_extreme_logits_sample_or_fail_naming_a_setting(base, values, scale, seed):
    """Logits near float32's limit: a token, or NoFiniteLogitsError naming the stage's setting."""
    params = _params_or_refusal({**base, **values})
    if params is None:
        return
    rng = np.random.default_rng(seed)
    logits = np.clip(rng.standard_normal(VOCAB) * scale, -3.4e38, 3.4e38).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            _run_steps(_sampler(params, [1, 2, 3, 1, 2]), logits)
        except NoFiniteLogitsError as exc:
            assert exc.parameter is not None and exc.parameter in str(exc)


@PROPERTY
@given(
    bias=hs.dictionaries(
        hs.integers(0, VOCAB - 1),
        hs.one_of(hs.floats(-1e4, 1e4), hs.just(-math.inf), hs.sampled_from(EXTREMES)),
        max_size=VOCAB,
    ),
    temperature=hs.sampled_from([0.0, 1e-45, 1e-5, 0.7, 1e4]),
)
def test_logit_bias_values_are_refused_beyond_the_limit_or_applied(bias, temperature):
    values = {"logit_bias": bias, "temperature": temperature}
    params = _params_or_refusal(values)
    finite = [b for b in bias.values() if b != -math.inf]
    out_of_range = any(math.isnan(b) or abs(b) > LOGIT_BIAS_LIMIT for b in finite)
    assert (params is None) == out_of_range
    if params is None:
        return
    logits = np.linspace(-20, 20, VOCAB, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            _run_steps(_sampler(params, []), logits, steps=2)
        except NoFiniteLogitsError as exc:
            assert sum(b == -math.inf for b in bias.values()) == VOCAB  # only when all are banned
            assert exc.parameter == "logit_bias"


# -- the rows of the issue ---------------------------------------------------------------------------
def test_row1_a_huge_logit_bias_is_refused_naming_logit_bias():
    for huge in (1e308, 1e39, 3e38, 1e4 + 1):
        with pytest.raises(SamplingParamsError) as info:
            SamplingParams(logit_bias={"5": huge})
        assert info.value.parameter == "logit_bias" and "[-10000, 10000]" in str(info.value)
    assert SamplingParams(logit_bias={"5": 1e4}).logit_bias[5] == 1e4


def test_row2_a_temperature_below_the_smallest_meaningful_one_is_greedy():
    for tiny in (1e-45, 5e-324, MIN_TEMPERATURE / 2):
        params = SamplingParams(temperature=tiny)
        assert params.temperature == 0.0 and params.is_greedy
    assert SamplingParams(temperature=MIN_TEMPERATURE).temperature == MIN_TEMPERATURE
    logits = np.linspace(-1, 1, VOCAB, dtype=np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert _sampler(SamplingParams(temperature=1e-45), []).sample(logits, 0).token_id == VOCAB - 1
        # the smallest sampling temperature on large logits: finite arithmetic, the argmax wins
        big = logits * 1e30
        assert _sampler(SamplingParams(temperature=MIN_TEMPERATURE), []).sample(big, 0).token_id == VOCAB - 1
    with pytest.raises(SamplingParamsError, match="temperature must be in"):
        SamplingParams(temperature=1e5)


def test_row3_a_tiny_repeat_penalty_is_refused():
    for tiny in (1e-40, 5.46e-130):
        with pytest.raises(SamplingParamsError) as info:
            SamplingParams(repeat_penalty=tiny)
        assert info.value.parameter == "repeat_penalty"
    params = SamplingParams(repeat_penalty=FIELD_RANGES["repeat_penalty"].lo, temperature=0.8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run_steps(_sampler(params, [3, 4, 5]), np.linspace(-30, 30, VOCAB, dtype=np.float32))


def test_row4_logit_bias_cost_is_linear_and_capped():
    vocab = 50_000
    entries = {str(i): -1.0 for i in range(0, vocab, 1)}
    started = time.perf_counter()
    params = SamplingParams(logit_bias=entries)
    sampler = SequenceSampler(params, seed=1, vocab_size=vocab)
    token = sampler.sample(np.zeros(vocab, dtype=np.float32), 0)
    elapsed = time.perf_counter() - started
    assert 0 <= token.token_id < vocab
    assert elapsed < 5.0, f"{vocab} logit_bias entries took {elapsed:.1f} s"  # was minutes (quadratic)
    assert params.logit_bias[49_999] == -1.0 and 50_000 not in params.logit_bias
    too_many = dict.fromkeys(range(MAX_LOGIT_BIAS_ENTRIES + 1), 1.0)
    started = time.perf_counter()
    with pytest.raises(SamplingParamsError, match="at most 262144") as info:
        SamplingParams(logit_bias=too_many)
    assert info.value.parameter == "logit_bias" and time.perf_counter() - started < 1.0


def test_logit_bias_is_applied_in_one_vectorised_step():
    params = SamplingParams(logit_bias={3: 5.0, 1: -math.inf, 7: 2.5}, temperature=0)
    bias = params.logit_bias
    assert bias.ids.tolist() == [1, 3, 7] and bias.biases.tolist() == [-math.inf, 5.0, 2.5]
    assert not bias.ids.flags.writeable and not bias.biases.flags.writeable
    assert _sampler(params, []).sample(np.zeros(VOCAB, dtype=np.float32), 0).token_id == 3


def test_a_stage_that_overflows_names_its_setting():
    logits = np.full(VOCAB, 3e38, dtype=np.float32)
    logits[5] = 3.3e38
    # a positive logit divided by the smallest repeat penalty overflows to +inf
    sampler = _sampler(
        SamplingParams(repeat_penalty=1e-6, temperature=0.7, samplers="penalties;temperature"), [5]
    )
    with pytest.raises(NoFiniteLogitsError, match="repeat_penalty") as info:
        sampler.sample(logits, 0)
    assert info.value.parameter == "repeat_penalty"
    greedy = _sampler(SamplingParams(repeat_penalty=1e-6, temperature=0), [5])
    with pytest.raises(NoFiniteLogitsError) as info:
        greedy.sample(logits, 0)
    assert info.value.parameter == "repeat_penalty"
    # the largest bias on the largest logit stays finite (1e4 is below float32's spacing there); the
    # temperature after it is what overflows
    biased = _sampler(SamplingParams(logit_bias={5: 1e4}, temperature=0.5), [])
    with pytest.raises(NoFiniteLogitsError) as info:
        biased.sample(np.full(VOCAB, 3.4028235e38, dtype=np.float32), 0)
    assert info.value.parameter == "temperature"


def test_mirostat_with_the_largest_target_never_overflows():
    params = SamplingParams(mirostat=1, mirostat_tau=1e4, mirostat_eta=1e4, temperature=1.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _run_steps(_sampler(params, []), np.linspace(-5, 5, VOCAB, dtype=np.float32), steps=8)


def test_cli_extreme_flags_are_one_line_or_greedy(tiny_gguf) -> None:
    """Rows 2-3 on the CLI: `--temp 1e-45` is greedy (exit 0, no numpy warning), `--repeat-penalty
    1e-40` is one line and exit 2."""
    base = ("generate", "--model", str(tiny_gguf), "-n", "3", "--ignore-eos", "--json", "hi")
    tiny = infer_cli(*base, "--temp", "1e-45", timeout=120)
    greedy = infer_cli(*base, "--temp", "0", timeout=120)
    assert tiny.returncode == 0 and "Warning" not in tiny.stderr, tiny.stderr
    assert json.loads(tiny.stdout)["token_ids"] == json.loads(greedy.stdout)["token_ids"]
    refused = infer_cli(*base, "--repeat-penalty", "1e-40", timeout=120)
    assert refused.returncode == 2, refused.stderr
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "repeat_penalty" in lines[0], refused.stderr
