"""`infer serve` as a real process on the default model, driven by the official `openai` client.

One server for the module (loading takes seconds): the OpenAI routes whole and streamed, then a list
of bad bodies that must each get the right status and an OpenAI error body, after which the server
must still answer correctly.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from infer.cli.serve.launch import ServerProcess, start_server

pytestmark = [pytest.mark.real_model, pytest.mark.slow]  # a server process on the real model

CTX = 2048
HELLO = [{"role": "user", "content": "Write one sentence about the sea."}]


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    process = start_server(
        [
            "-m",
            str(default_model_path),
            "-c",
            str(CTX),
            "--max-num-seqs",
            "8",
            "--max-body-mb",
            "8",
            "--alias",
            "any",
        ]
    )
    yield process
    assert process.stop() == 0, process.stderr


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    # max_retries=0: a retried request would hide a server error from the test.
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=180)


@pytest.fixture(scope="module")
def http(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=server.url, timeout=60) as raw:
        yield raw


@pytest.fixture(scope="module")
def greedy_text(client: openai.OpenAI) -> str:
    """The non-streamed greedy chat answer every later comparison uses."""
    reply = client.chat.completions.create(model="any", messages=HELLO, max_tokens=12, temperature=0, seed=11)
    return reply.choices[0].message.content or ""


def _stream_chat(client: openai.OpenAI, **body: Any) -> tuple[list[Any], str]:
    chunks = list(client.chat.completions.create(model="any", stream=True, **body))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    return chunks, text


# -- the routes ------------------------------------------------------------------------------------
def test_models_list(client: openai.OpenAI, default_model_path: Path) -> None:
    models = client.models.list().data
    assert [m.id for m in models] == [default_model_path.stem, "any"]  # the served name, then --alias
    assert client.models.retrieve(models[0].id).id == models[0].id
    assert client.models.retrieve("any").id == "any"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_a_model_it_does_not_serve_is_404_model_not_found(client: openai.OpenAI) -> None:
    """As OpenAI and vLLM answer: the request is not run by another model."""
    for create in (
        lambda: client.chat.completions.create(model="gpt-4", messages=HELLO, max_tokens=2),
        lambda: client.completions.create(model="gpt-4", prompt="Hi", max_tokens=2),
        lambda: client.responses.create(model="gpt-4", input="Hi", max_output_tokens=2),
    ):
        with pytest.raises(openai.NotFoundError) as info:
            create()
        assert info.value.code == "model_not_found" and "gpt-4" in info.value.message


def test_chat_completion(client: openai.OpenAI, greedy_text: str) -> None:
    reply = client.chat.completions.create(model="any", messages=HELLO, max_tokens=12, temperature=0, seed=11)
    choice = reply.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content == greedy_text and greedy_text.strip()
    assert choice.finish_reason in ("stop", "length")
    assert reply.object == "chat.completion"
    assert 0 < reply.usage.completion_tokens <= 12
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert reply.model_extra["seed"] == 11  # the seed that replays the answer


def test_streamed_chat_equals_whole_greedy_text(client: openai.OpenAI, greedy_text: str) -> None:
    chunks, text = _stream_chat(
        client, messages=HELLO, max_tokens=12, temperature=0, seed=11, stream_options={"include_usage": True}
    )
    assert text == greedy_text
    with_choices = [c for c in chunks if c.choices]
    assert with_choices[0].choices[0].delta.role == "assistant"
    content = [c.choices[0].delta.content for c in with_choices if c.choices[0].delta.content is not None]
    assert len(content) >= 3 and all(content)  # several chunks, never an empty delta
    finishes = [c.choices[0].finish_reason for c in with_choices]
    assert finishes[-1] in ("stop", "length") and not any(finishes[:-1])
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens <= 12
    assert all(c.object == "chat.completion.chunk" for c in chunks)


def test_seeded_sampling_replays_streamed_or_not(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"messages": HELLO, "max_tokens": 10, "temperature": 0.9, "seed": 1234}
    whole = client.chat.completions.create(model="any", **body)
    _, streamed = _stream_chat(client, **body)
    assert streamed == whole.choices[0].message.content


def test_unseeded_request_reports_a_seed_that_replays_it(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"messages": HELLO, "max_tokens": 8, "temperature": 1.0}
    first = client.chat.completions.create(model="any", **body)
    seed = first.model_extra["seed"]
    again = client.chat.completions.create(model="any", seed=seed, **body)
    assert again.choices[0].message.content == first.choices[0].message.content


def test_n_choices_use_seed_plus_index(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"messages": HELLO, "max_tokens": 6, "temperature": 1.0}
    both = client.chat.completions.create(model="any", n=2, seed=5, **body)
    assert [c.index for c in both.choices] == [0, 1]
    second = client.chat.completions.create(model="any", seed=6, **body)
    assert both.choices[1].message.content == second.choices[0].message.content


def test_chat_logprobs(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any", messages=HELLO, max_tokens=5, temperature=0, logprobs=True, top_logprobs=2
    )
    entries = reply.choices[0].logprobs.content
    assert len(entries) == reply.usage.completion_tokens
    for entry in entries:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        # greedy: the chosen token is the most likely one
        assert entry.top_logprobs[0].token == entry.token
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token


def test_logit_bias_forces_a_token(client: openai.OpenAI) -> None:
    token_id = 314  # any ordinary token: a +100 bias makes greedy decoding pick it every time
    reply = client.chat.completions.create(
        model="any",
        messages=HELLO,
        max_tokens=3,
        temperature=0,
        logit_bias={str(token_id): 100},
        logprobs=True,
    )
    tokens = [entry.token for entry in reply.choices[0].logprobs.content]
    assert len(tokens) == 3 and len(set(tokens)) == 1
    assert reply.choices[0].message.content == tokens[0] * 3


def test_stop_string(client: openai.OpenAI, greedy_text: str) -> None:
    words = greedy_text.split()
    assert len(words) >= 3
    stop = " " + words[2]
    reply = client.chat.completions.create(
        model="any", messages=HELLO, max_tokens=12, temperature=0, seed=11, stop=[stop]
    )
    assert reply.choices[0].finish_reason == "stop"
    assert reply.choices[0].message.content == greedy_text[: greedy_text.index(stop)]


def test_completions(client: openai.OpenAI) -> None:
    body: dict[str, Any] = {"prompt": "The capital of France is", "max_tokens": 6, "temperature": 0}
    whole = client.completions.create(model="any", **body)
    assert whole.object == "text_completion" and whole.choices[0].text.strip()
    chunks = list(client.completions.create(model="any", stream=True, **body))
    texts = [c.choices[0].text for c in chunks]
    assert "".join(texts) == whole.choices[0].text
    assert all(texts[:-1]) and chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    echoed = client.completions.create(model="any", echo=True, logprobs=1, **body)
    assert echoed.choices[0].text == body["prompt"] + whole.choices[0].text
    assert len(echoed.choices[0].logprobs.tokens) == echoed.usage.completion_tokens


def test_responses_whole_and_streamed(client: openai.OpenAI, greedy_text: str) -> None:
    body: dict[str, Any] = {"input": HELLO[0]["content"], "max_output_tokens": 12, "temperature": 0}
    whole = client.responses.create(model="any", **body)
    assert whole.output_text == greedy_text
    assert whole.status in ("completed", "incomplete")
    assert whole.usage.output_tokens <= 12

    events = list(client.responses.create(model="any", stream=True, **body))
    kinds = [e.type for e in events]
    assert kinds[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert kinds[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        f"response.{whole.status}",
    ]
    deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
    assert len(deltas) >= 3 and all(deltas)
    assert "".join(deltas) == greedy_text == events[-1].response.output_text
    assert [e.sequence_number for e in events] == list(range(len(events)))


def test_responses_with_message_list_and_instructions(client: openai.OpenAI) -> None:
    reply = client.responses.create(
        model="any",
        instructions="You answer briefly.",
        input=[{"role": "user", "content": [{"type": "input_text", "text": "Name a colour."}]}],
        max_output_tokens=4,
        temperature=0,
    )
    assert reply.output_text.strip()


def test_openapi_describes_request_bodies(http: httpx.Client) -> None:
    schemas = http.get("/openapi.json").json()["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]["properties"]
    for field in (
        "messages",
        "max_completion_tokens",
        "temperature",
        "top_k",
        "min_p",
        "samplers",
        "logit_bias",
    ):
        assert field in chat, field
    assert "prompt" in schemas["CompletionRequest"]["properties"]
    assert "max_output_tokens" in schemas["ResponsesRequest"]["properties"]
    assert chat["top_k"]["anyOf"][0]["type"] == "integer"


# -- bad input -------------------------------------------------------------------------------------
CHAT = "/v1/chat/completions"
MSG = '"messages": [{"role": "user", "content": "hi"}]'
FIVE_MB = "word " * (1024 * 1024)


def _chat(extra: str) -> str:
    # A small token limit unless the case is about the limit: a body wrongly accepted stays cheap.
    if "max_tokens" not in extra and "max_completion_tokens" not in extra:
        extra = '"max_tokens": 2' + (", " + extra if extra else "")
    return "{" + MSG + ", " + extra + "}"


# (route, raw JSON body or a dict, expected status, expected `param` or None to skip the check)
BAD_BODIES: list[tuple[str, str | bytes | dict[str, Any], int, str | None]] = [
    (CHAT, _chat('"temperature": NaN'), 400, "temperature"),
    (CHAT, _chat('"temperature": "0.5"'), 400, "temperature"),
    (CHAT, _chat('"presence_penalty": Infinity'), 400, "presence_penalty"),
    (CHAT, _chat('"top_p": 0'), 400, "top_p"),
    (CHAT, _chat('"top_p": 1.5'), 400, "top_p"),
    (CHAT, _chat('"min_p": 2'), 400, "min_p"),
    (CHAT, _chat('"typical_p": 0'), 400, "typical_p"),
    (CHAT, _chat('"repeat_penalty": 0'), 400, "repeat_penalty"),
    (CHAT, _chat('"frequency_penalty": -3'), 400, "frequency_penalty"),
    (CHAT, _chat('"mirostat": 3'), 400, "mirostat"),
    (CHAT, _chat('"samplers": "top_k;bogus"'), 400, "samplers"),
    (CHAT, _chat('"dry_sequence_breakers": [""]'), 400, "dry_sequence_breakers"),
    (CHAT, _chat('"seed": -5'), 400, "seed"),
    (CHAT, _chat(f'"seed": {2**64}'), 400, "seed"),
    (CHAT, _chat('"logit_bias": {"abc": 1}'), 400, "logit_bias"),
    (CHAT, _chat('"logit_bias": {"99999999": 5}'), 400, "logit_bias"),
    (CHAT, _chat('"logit_bias": {"1": "x"}'), 400, "logit_bias.1"),
    (CHAT, _chat('"max_tokens": -1'), 400, "max_tokens"),
    (CHAT, _chat('"max_tokens": 0'), 400, "max_tokens"),
    (CHAT, _chat('"max_tokens": 1.5'), 400, "max_tokens"),
    (CHAT, _chat('"max_tokens": "10"'), 400, "max_tokens"),
    (CHAT, _chat('"max_tokens": 100000'), 400, "max_tokens"),
    (CHAT, _chat('"max_completion_tokens": 5000'), 400, "max_completion_tokens"),
    (CHAT, _chat('"n": 0'), 400, "n"),
    (CHAT, _chat('"n": "two"'), 400, "n"),
    (CHAT, _chat('"stop": [""]'), 400, "stop"),
    (CHAT, _chat('"stream": "yes"'), 400, "stream"),
    (CHAT, _chat('"top_logprobs": 21, "logprobs": true'), 400, "top_logprobs"),
    (CHAT, _chat('"top_logprobs": 2'), 400, "top_logprobs"),
    (CHAT, _chat('"response_format": {"type": "yaml"}'), 400, "response_format.type"),
    (CHAT, _chat('"response_format": {"type": "json_schema"}'), 400, "response_format.schema"),
    (
        CHAT,
        _chat('"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "t"}}}'),
        400,
        "response_format.json_schema.schema",
    ),
    (
        CHAT,
        _chat('"response_format": {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": true}}}'),
        400,
        "response_format.json_schema.schema",
    ),
    (CHAT, _chat('"response_format": {"type": "json_object"}, "grammar": "root ::= \\"a\\""'), 400, None),
    ("/v1/completions", {"prompt": "hi", "json_schema": {"type": "strin"}}, 400, "json_schema"),
    ("/v1/completions", {"prompt": "hi", "grammar": "root ::= ("}, 400, "grammar"),
    ("/v1/completions", {"prompt": "hi", "grammar": "start: nothing"}, 400, "grammar"),
    (
        CHAT,
        _chat('"tools": [{"type": "function", "function": {"name": "f"}}], "tool_choice": "x"'),
        400,
        "tool_choice",
    ),
    (
        CHAT,
        _chat('"tools": [{"type": "function", "function": "f"}], "tool_choice": "auto"'),
        400,
        "tools.0.function",
    ),
    (CHAT, _chat('"tools": [], "tool_choice": {"type": "function", "function": "f"}'), 400, "tool_choice"),
    (CHAT, '{"messages": [{"role": "wizard", "content": "hi"}]}', 400, "messages.0.role"),
    (CHAT, '{"messages": []}', 400, "messages"),
    (CHAT, '{"messages": "hi"}', 400, "messages"),
    (CHAT, '{"max_tokens": 5}', 400, "messages"),
    (CHAT, '{"messages": [{"role": "user", "content": 42}]}', 400, None),
    (CHAT, '{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', 400, "messages"),
    (CHAT, {"messages": [{"role": "user", "content": FIVE_MB}]}, 400, "messages"),
    (CHAT, '{"messages": [{"role": "user", "content": "hi"}', 400, None),  # invalid JSON
    (CHAT, '{"messages": [{"role": "user", "content": "\\ud800"}]}', 400, "messages"),  # lone surrogate
    (CHAT, b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),  # not UTF-8
    (CHAT, "[" * 100_000 + "]" * 100_000, 400, None),  # nesting deeper than the JSON parser goes
    (CHAT, "[1, 2]", 400, None),
    (CHAT, "", 400, "messages"),  # an empty body names the field to send
    ("/v1/completions", "", 400, "prompt"),
    (CHAT, _chat('"stop": ["\\ud800"]'), 400, "stop"),  # a lone surrogate, as in messages
    (CHAT, _chat('"logit_bias": {"5": 1e308}'), 400, "logit_bias"),  # beyond the documented 1e4
    (CHAT, _chat('"repeat_penalty": 1e-40'), 400, "repeat_penalty"),
    ("/v1/completions", {"prompt": FIVE_MB}, 400, "prompt"),
    ("/v1/completions", {"prompt": [1, 2, 99999999]}, 400, "prompt"),
    ("/v1/completions", '{"prompt": "a\\udfff"}', 400, "prompt"),
    ("/v1/completions", {"max_tokens": 3}, 400, "prompt"),
    ("/v1/completions", {"prompt": "hi", "logprobs": 6}, 400, "logprobs"),
    ("/v1/completions", {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ("/v1/responses", {"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input.0"),
    ("/v1/responses", {"input": "hi", "max_output_tokens": -1}, 400, "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
    (
        "/v1/responses",
        {"input": "hi", "text": {"format": {"type": "json_schema"}}},
        400,
        "text.format.schema",
    ),
    ("/v1/responses", {"input": "hi", "text": {"format": {"type": "xml"}}}, 400, "text.format.type"),
    # Speculation per request: a key the method ignores, a model the server did not load, a range.
    (CHAT, _chat('"spec_method": "draft_model"'), 400, "spec_method"),
    (CHAT, _chat('"spec_num_tokens": 4'), 400, "spec_num_tokens"),
    (CHAT, _chat('"spec_method": "prompt_lookup", "spec_p_min": 0.5'), 400, "spec_p_min"),
    (CHAT, _chat('"spec_method": "prompt_lookup", "spec_num_tokens": 0'), 400, "spec_num_tokens"),
    (CHAT, _chat('"spec_method": "medusa"'), 400, "spec_method"),
    ("/v1/completions", {"prompt": "hi", "spec_draft_model": "d.gguf"}, 400, "spec_draft_model"),
    ("/v1/responses", {"input": "hi", "spec_ngram_max": 3}, 400, "spec_ngram_max"),
    ("/v1/nowhere", {}, 404, None),
    # Defined as valid: top_k past the vocabulary means "no top-k", a negative temperature is greedy,
    # unknown fields are ignored as OpenAI ignores them.
    (CHAT, _chat(f'"top_k": {10**9}, "max_tokens": 1'), 200, None),
    (CHAT, _chat('"spec_method": "none", "max_tokens": 1'), 200, None),
    (CHAT, _chat('"spec_method": "prompt_lookup", "spec_num_tokens": 3, "max_tokens": 2'), 200, None),
    (CHAT, _chat('"temperature": -1, "max_tokens": 1'), 200, None),
    (CHAT, _chat('"temperature": 1e-45, "max_tokens": 1'), 200, None),  # below 1e-5: greedy
    (CHAT, _chat('"some_future_field": {"x": 1}, "max_tokens": 1'), 200, None),
]


def test_bad_bodies_count() -> None:
    assert sum(1 for case in BAD_BODIES if case[2] >= 400) >= 25


def test_bad_bodies_get_openai_errors(http: httpx.Client, greedy_text: str) -> None:
    failures = []
    for route, body, status, param in BAD_BODIES:
        if isinstance(body, dict):
            response = http.post(route, json=body)
        else:
            raw = body if isinstance(body, bytes) else body.encode()
            response = http.post(route, content=raw, headers={"content-type": "application/json"})
        label = f"{route} {str(body)[:80]!r}"
        if response.status_code != status:
            failures.append(f"{label}: status {response.status_code}, want {status}: {response.text[:200]}")
            continue
        if status < 400:
            continue
        error = response.json().get("error")
        if not (isinstance(error, dict) and isinstance(error.get("message"), str) and error["message"]):
            failures.append(f"{label}: no OpenAI error body: {response.text[:200]}")
        elif set(error) != {"message", "type", "param", "code"} or error["type"] != "invalid_request_error":
            failures.append(f"{label}: error body shape {error}")
        elif param is not None and error["param"] != param:
            failures.append(f"{label}: param {error['param']!r}, want {param!r}")
    assert not failures, "\n".join(failures)


def test_wrong_content_type_and_oversized_body(http: httpx.Client) -> None:
    plain = http.post(CHAT, content=_chat("").encode(), headers={"content-type": "text/plain"})
    assert plain.status_code == 400 and plain.json()["error"]["type"] == "invalid_request_error"
    big = http.post(CHAT, content=b"x" * (9 * 2**20), headers={"content-type": "application/json"})
    assert big.status_code == 413 and "limit" in big.json()["error"]["message"]


def test_server_still_answers_after_bad_input(
    client: openai.OpenAI, http: httpx.Client, greedy_text: str
) -> None:
    reply = client.chat.completions.create(model="any", messages=HELLO, max_tokens=12, temperature=0, seed=11)
    assert reply.choices[0].message.content == greedy_text
    health = http.get("/health").json()
    assert health["status"] == "ok" and health["active_sequences"] == 0 and health["in_flight"] == 0


def test_error_bodies_are_strict_json(http: httpx.Client) -> None:
    response = http.post(
        CHAT, content=_chat('"temperature": NaN').encode(), headers={"content-type": "application/json"}
    )
    json.loads(response.text, parse_constant=lambda name: pytest.fail(f"non-JSON constant {name}"))
