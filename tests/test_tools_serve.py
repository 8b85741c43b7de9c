"""Tool calling through `infer serve` on the default model, with the official `openai` client
(issue 32, acceptance 2 and 4).

SmolLM2's template cannot render tools, so the server writes the generic tool prompt and reads
replies with the hermes parser. `tool_choice: "required"` and a named function generate under the
call grammar: 20 seeded choices (one request with n = 20: choice i draws with seed + i; 4 in the
fast suite, 20 with `-m slow`), whole and streamed, each a call valid against its function's schema
(checked with `jsonschema`). A full loop (call, `role: tool` result, final answer) completes on
chat completions and on the Responses API (`function_call` items, `function_call_output` input, the
arguments events). Hostile schemas are a 400 in bounded time while the server keeps answering.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import openai
import pytest

from infer.cli.serve.launch import ServerProcess, start_server

pytestmark = pytest.mark.real_model

WEATHER_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}, "unit": {"enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TIME_SCHEMA = {
    "type": "object",
    "properties": {"timezone": {"type": "string", "maxLength": 20}},
    "required": ["timezone"],
    "additionalProperties": False,
}
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": WEATHER_SCHEMA,
        },
    },
    {
        "type": "function",
        "function": {"name": "get_time", "description": "The time in a timezone.", "parameters": TIME_SCHEMA},
    },
]
SCHEMAS = {"get_weather": WEATHER_SCHEMA, "get_time": TIME_SCHEMA}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
RUNS = 20


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    process = start_server(
        ["-m", str(default_model_path), "-c", "1024", "--max-num-seqs", "20", "--alias", "any"]
    )
    yield process
    assert process.stop() == 0, process.stderr


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=600)


def _valid(name: str, arguments: str, allowed: set[str]) -> None:
    assert name in allowed
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


@pytest.mark.parametrize(
    "tool_choice",
    ["required", {"type": "function", "function": {"name": "get_time"}}],
    ids=["required", "named"],
)
@pytest.mark.parametrize("runs", [4, pytest.param(RUNS, marks=pytest.mark.slow)], ids=["4", "20"])
def test_forced_calls_are_valid_in_every_seeded_run(
    client: openai.OpenAI, tool_choice: Any, runs: int
) -> None:
    allowed = {"get_time"} if isinstance(tool_choice, dict) else set(SCHEMAS)
    common: dict[str, Any] = dict(
        model="any", messages=ASK, tools=TOOLS, tool_choice=tool_choice, n=runs, seed=7, max_tokens=64
    )
    whole = client.chat.completions.create(**common, parallel_tool_calls=False)
    assert len(whole.choices) == runs
    for choice in whole.choices:
        assert choice.finish_reason == "tool_calls", choice
        calls = choice.message.tool_calls
        assert calls is not None and len(calls) == 1  # parallel_tool_calls false: exactly one
        assert calls[0].id.startswith("call_") and calls[0].type == "function"
        _valid(calls[0].function.name, calls[0].function.arguments, allowed)
        assert choice.message.content is None

    # Streamed, parallel calls allowed: the same seeds, the calls reassembled from the deltas.
    calls_by_choice: dict[int, dict[int, dict[str, str]]] = {}
    finish: dict[int, str] = {}
    for chunk in client.chat.completions.create(**common, stream=True):
        for choice in chunk.choices:
            for call in choice.delta.tool_calls or []:
                entry = calls_by_choice.setdefault(choice.index, {}).setdefault(
                    call.index, {"id": "", "name": "", "arguments": ""}
                )
                if call.id:
                    assert not entry["id"]  # the id comes once, with the name
                    entry["id"] = call.id
                if call.function and call.function.name:
                    entry["name"] += call.function.name
                if call.function and call.function.arguments:
                    entry["arguments"] += call.function.arguments
            if choice.finish_reason:
                finish[choice.index] = choice.finish_reason
    assert sorted(calls_by_choice) == list(range(runs))
    for index, calls in calls_by_choice.items():
        assert calls, index
        first = calls[0]
        assert first["id"].startswith("call_")
        _valid(first["name"], first["arguments"], allowed)
        # Later calls are complete too unless the token limit cut the reply.
        assert finish[index] in ("tool_calls", "length")
        if finish[index] == "tool_calls":
            for call in calls.values():
                _valid(call["name"], call["arguments"], allowed)


def test_full_loop_on_chat_completions(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(
        model="any",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        seed=3,
        max_tokens=96,
        parallel_tool_calls=False,
    )
    message = first.choices[0].message
    assert message.tool_calls
    call = message.tool_calls[0]
    conversation: list[Any] = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump(exclude_none=True)]},
        {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature": 21})},
    ]
    final = client.chat.completions.create(
        model="any", messages=conversation, tools=TOOLS, tool_choice="none", seed=3, max_tokens=48
    )
    answer = final.choices[0]
    assert answer.message.tool_calls is None
    assert answer.message.content
    assert answer.finish_reason in ("stop", "length")


def test_auto_gives_text_or_valid_calls(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, n=4, seed=11, max_tokens=48
    )
    for choice in reply.choices:
        if choice.finish_reason == "tool_calls":
            for call in choice.message.tool_calls or []:
                _valid(call.function.name, call.function.arguments, set(SCHEMAS))
        else:
            assert choice.message.content is not None


def test_tool_choice_none_parses_nothing(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any", messages=ASK, tools=TOOLS, tool_choice="none", seed=1, max_tokens=24
    )
    assert reply.choices[0].message.tool_calls is None
    assert reply.choices[0].finish_reason in ("stop", "length")


FLAT_TOOLS = [{"type": "function", **tool["function"]} for tool in TOOLS]


def test_responses_function_call_and_loop(client: openai.OpenAI) -> None:
    first = client.responses.create(
        model="any",
        input=ASK[0]["content"],
        tools=FLAT_TOOLS,
        tool_choice="required",
        max_output_tokens=96,
        parallel_tool_calls=False,
    )
    assert first.status == "completed"
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1
    call = calls[0]
    _valid(call.name, call.arguments, set(SCHEMAS))
    assert call.call_id.startswith("call_") and call.status == "completed"
    assert first.tool_choice == "required" and first.parallel_tool_calls is False
    follow = [
        {"role": "user", "content": ASK[0]["content"]},
        {"type": "function_call", "call_id": call.call_id, "name": call.name, "arguments": call.arguments},
        {"type": "function_call_output", "call_id": call.call_id, "output": json.dumps({"temperature": 21})},
    ]
    final = client.responses.create(
        model="any", input=follow, tools=FLAT_TOOLS, tool_choice="none", max_output_tokens=48
    )
    assert final.output_text
    assert not [item for item in final.output if item.type == "function_call"]


def test_responses_stream_sends_the_arguments_events(client: openai.OpenAI) -> None:
    kinds: list[str] = []
    deltas: list[str] = []
    done_arguments: list[str] = []
    with client.responses.stream(
        model="any",
        input=ASK[0]["content"],
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=96,
        parallel_tool_calls=False,
    ) as stream:
        for event in stream:
            kinds.append(event.type)
            if event.type == "response.function_call_arguments.delta":
                deltas.append(event.delta)
            if event.type == "response.function_call_arguments.done":
                done_arguments.append(event.arguments)
        final = stream.get_final_response()
    assert kinds[0] == "response.created" and kinds[-1] == "response.completed"
    assert "response.output_text.delta" not in kinds  # only a call: no message item
    assert done_arguments == ["".join(deltas)]
    (call,) = [item for item in final.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.arguments == done_arguments[0]
    _valid(call.name, call.arguments, {"get_weather"})


# -- refusals ------------------------------------------------------------------------------------
def _deep_schema(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "string"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"a": schema}}
    return schema


HOSTILE = {
    "deep nesting": _deep_schema(400),
    "huge enum": {"type": "object", "properties": {"x": {"enum": [f"value-{i:06d}" for i in range(30_000)]}}},
    "$ref loop": {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_schemas_are_a_400_in_bounded_time(server: ServerProcess, name: str) -> None:
    tools = [{"type": "function", "function": {"name": "f", "parameters": HOSTILE[name]}}]
    body = {"messages": ASK, "tools": tools, "tool_choice": "required", "max_tokens": 8}
    health: list[float] = []
    stop = threading.Event()

    def probe() -> None:  # the server keeps answering while it refuses (at least once: a fast 400
        # can come back before the first probe would start)
        with httpx.Client(timeout=10) as probe_client:
            while True:
                started = time.monotonic()
                assert probe_client.get(f"{server.url}/health").status_code == 200
                health.append(time.monotonic() - started)
                if stop.wait(0.05):
                    break

    prober = threading.Thread(target=probe)
    prober.start()
    try:
        started = time.monotonic()
        reply = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
        elapsed = time.monotonic() - started
    finally:
        stop.set()
        prober.join()
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "tools"
    # Refused by the grammar bounds, or (the huge enum, on this 1,024-token context) as more text
    # than the context could hold.
    assert error["code"] in ("invalid_grammar", "context_length_exceeded")
    assert elapsed < 20
    assert health and max(health) < 5


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
        ({"tool_choice": "required"}, "tool_choice"),
        ({"tools": [{"type": "web_search"}]}, "tools.0.type"),
        ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools.0.function.name"),
        ({"tools": TOOLS, "tool_choice": "sometimes"}, "tool_choice"),
        ({"tools": TOOLS + TOOLS[:1]}, "tools"),
    ],
)
def test_bad_tool_requests_are_a_400(server: ServerProcess, body: dict[str, Any], param: str) -> None:
    reply = httpx.post(
        f"{server.url}/v1/chat/completions", json={"messages": ASK, "max_tokens": 4, **body}, timeout=60
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


def test_a_forced_call_beside_a_text_format_is_served(client: openai.OpenAI, server: ServerProcess) -> None:
    """A forced call writes no text, so the route's text format has nothing to shape: the call is served,
    as OpenAI serves the two together (instructor's RESPONSES_TOOLS sends both). llama-server's
    `json_schema` field beside a forced call is still a clash (400)."""
    city = {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]}
    text_format: Any = {"format": {"type": "json_schema", "name": "City", "schema": city, "strict": True}}
    reply = client.responses.create(
        model="any",
        input=ASK[0]["content"],
        tools=FLAT_TOOLS,
        tool_choice={"type": "function", "name": "get_time"},
        text=text_format,
        max_output_tokens=96,
        parallel_tool_calls=False,  # one call: several ran past the token limit once
        temperature=0,
    )
    calls = [item for item in reply.output if item.type == "function_call"]
    assert reply.status == "completed" and len(calls) == 1, reply.output
    _valid(calls[0].name, calls[0].arguments, {"get_time"})
    chat = client.chat.completions.create(
        model="any",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        response_format={"type": "json_schema", "json_schema": {"name": "City", "schema": city}},
        max_tokens=96,
        parallel_tool_calls=False,
        temperature=0,
    )
    assert chat.choices[0].finish_reason == "tool_calls"
    body = {"messages": ASK, "max_tokens": 4, "tools": TOOLS, "tool_choice": "required", "json_schema": city}
    clash = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=60)
    assert clash.status_code == 400 and "only one output constraint" in clash.json()["error"]["message"]
