"""Caps on every list a request can carry (issue 29, item 3): checked when the request is validated,
naming the field, so no list's length reaches the chain, the step loop or the chat template."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs
from pydantic import ValidationError

from infer.cli.serve import request_caps as limits
from infer.cli.serve.errors import APIError
from infer.cli.serve.responses_schema import ResponsesRequest
from infer.cli.serve.schemas import ChatCompletionRequest, CompletionRequest
from infer.engine.runtime.request import MAX_STOP_CHARS, MAX_STOP_STRINGS, Request, RequestError
from infer.engine.sampling import SamplingParams, SamplingParamsError
from infer.engine.sampling.history import breaker_tokens
from infer.engine.sampling.list_caps import MAX_DRY_BREAKER_CHARS, MAX_DRY_BREAKERS, MAX_SAMPLER_STAGES

USER = [{"role": "user", "content": "hi"}]


def fastest_of_three(attempt: Callable[[], object], error: type[Exception]) -> float:
    """The shortest of three timed runs of `attempt` (each must raise `error`): a bound on the work a refusal
    does, which one pause of a shared CI machine (a GC pass, the other test worker compiling) cannot
    fail the way it failed a single timed run."""
    times = []
    for _ in range(3):
        started = time.monotonic()
        with pytest.raises(error):
            attempt()
        times.append(time.monotonic() - started)
    return min(times)


@pytest.mark.parametrize(
    ("fields", "parameter"),
    [
        ({"samplers": ["top_k"] * 100_000}, "samplers"),
        ({"samplers": ["top_k"] * (MAX_SAMPLER_STAGES + 1)}, "samplers"),
        ({"samplers": "k" * 100_000}, "samplers"),
        ({"samplers": ";".join(["top_k"] * (MAX_SAMPLER_STAGES + 1))}, "samplers"),
        ({"dry_sequence_breakers": ["x"] * 10_000}, "dry_sequence_breakers"),
        ({"dry_sequence_breakers": ["x" * (MAX_DRY_BREAKER_CHARS + 1)]}, "dry_sequence_breakers"),
    ],
)
def test_sampler_lists_past_their_cap_are_refused_fast(fields: dict, parameter: str) -> None:
    assert fastest_of_three(lambda: SamplingParams(**fields), SamplingParamsError) < 0.5
    with pytest.raises(SamplingParamsError) as info:
        SamplingParams(**fields)
    assert info.value.parameter == parameter
    assert "at most" in str(info.value) and len(str(info.value)) < 300


def test_sampler_lists_at_their_cap_are_accepted() -> None:
    assert len(SamplingParams(samplers=["top_k"] * MAX_SAMPLER_STAGES).samplers) == MAX_SAMPLER_STAGES
    breakers = [f"{i:02d}" * (MAX_DRY_BREAKER_CHARS // 2) for i in range(MAX_DRY_BREAKERS)]
    assert SamplingParams(dry_sequence_breakers=breakers).dry_sequence_breakers == tuple(breakers)


def test_stop_strings_past_their_cap_are_refused() -> None:
    with pytest.raises(RequestError, match="at most 16") as info:
        Request((1,), stop=("z",) * (MAX_STOP_STRINGS + 1))
    assert info.value.parameter == "stop"
    with pytest.raises(RequestError, match="at most 256"):
        Request((1,), stop=("z" * (MAX_STOP_CHARS + 1),))
    assert Request((1,), stop=("z" * MAX_STOP_CHARS,) * MAX_STOP_STRINGS).stop


@settings(max_examples=200, deadline=None)
@given(
    texts=hs.lists(hs.text(alphabet='ab:\n\x00"*', max_size=5), max_size=30),
    breakers=hs.lists(hs.text(alphabet="ab:\n\x00", min_size=1, max_size=3), max_size=4),
)
def test_breaker_tokens_are_the_tokens_whose_text_holds_a_breaker(
    texts: list[str], breakers: list[str]
) -> None:
    vocab = len(texts) + 2  # padded ids past the texts are never breakers
    found = breaker_tokens(texts, breakers, vocab).tolist()
    assert found == [any(b in t for b in breakers) for t in texts] + [False, False]


@pytest.mark.parametrize(
    ("model", "body", "parameter"),
    [
        (ChatCompletionRequest, {"messages": USER * (limits.MAX_MESSAGES + 1)}, "messages"),
        (
            ChatCompletionRequest,
            {"messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 65}]},
            "messages.0.content",
        ),
        (ChatCompletionRequest, {"messages": USER, "tools": [{}] * (limits.MAX_TOOLS + 1)}, "tools"),
        (ChatCompletionRequest, {"messages": USER, "stop": ["z"] * 17}, "stop"),
        (ChatCompletionRequest, {"messages": USER, "stop": "z" * 257}, "stop"),
        (ChatCompletionRequest, {"messages": USER, "samplers": ["top_k"] * 33}, "samplers"),
        (
            ChatCompletionRequest,
            {"messages": USER, "dry_sequence_breakers": ["x"] * 65},
            "dry_sequence_breakers",
        ),
        (CompletionRequest, {"prompt": ["a"] * (limits.MAX_PROMPTS + 1)}, "prompt"),
        (CompletionRequest, {"prompt": [[1]] * (limits.MAX_PROMPTS + 1)}, "prompt"),
        (CompletionRequest, {"prompt": [1] * (limits.MAX_PROMPT_TOKEN_IDS + 1)}, "prompt"),
        (
            ResponsesRequest,
            {"input": [{"role": "user", "content": "a"}] * (limits.MAX_MESSAGES + 1)},
            "input",
        ),
        (ResponsesRequest, {"input": "a", "include": ["x"] * 17}, "include"),
        (ResponsesRequest, {"input": "a", "metadata": {str(i): "v" for i in range(17)}}, "metadata"),
    ],
)
def test_api_lists_past_their_cap_fail_validation(model: type, body: dict, parameter: str) -> None:
    assert fastest_of_three(lambda: model.model_validate(body), ValidationError) < 1.0
    with pytest.raises(ValidationError) as info:
        model.model_validate(body)
    too_long = [e for e in info.value.errors() if str(e["type"]).endswith("too_long")]
    assert too_long and str(too_long[0]["loc"][0]) == parameter.split(".")[0], info.value.errors()[:3]


def test_prompts_times_n_is_capped() -> None:
    body = CompletionRequest.model_validate({"prompt": ["a"] * 64, "n": 3})
    with pytest.raises(APIError, match="at most 128") as info:
        body.check_supported()
    assert info.value.param == "n"
