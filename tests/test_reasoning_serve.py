"""Reasoning through `infer serve` (issue 32), in-process on tiny synthetic models, with the official
`openai` client: chat `reasoning_content` (whole and streamed), the Responses `reasoning` item and
its `response.reasoning_text.*` events, calls read only after the block, `--reasoning-parser none`,
and a block the chat template opened in the prompt.

A random tiny model cannot be made to think, so the replies are forced with llama-server's
`grammar` body field (a Lark grammar of exactly one text); with `tool_choice` auto the tool grammar
leaves the output to it. The first model carries Qwen3's real template (the model opens its own
block); the second a ChatML template whose generation prompt ends with `<think>\\n`, as DeepSeek-R1's
and QwQ's do (the reply starts inside the block).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from fastapi.testclient import TestClient
from synthetic import TinyModel
from typer.testing import CliRunner

from infer.cli.main import app
from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.responses_schema import ResponsesRequest
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.profiles.settings import resolve_settings

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

TEMPLATES = Path(__file__).parent / "data" / "templates"
OPENING_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call: {{ tools | tojson }}. "
    "Write a call as <tool_call>{...}</tool_call>.<|im_end|>\n{% endif %}"
    "{% for message in messages %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n<think>\n{% endif %}"
)
TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
ASK = [{"role": "user", "content": "Weather in Oslo?"}]
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "%s"}}\n</tool_call>'
THOUGHT = f"I might call {CALL % 'Rome'} here, but no."
CLOSED_REPLY = f"<think>\n{THOUGHT}\n</think>\n\nChecking.\n{CALL % 'Oslo'}"
OPENED_REPLY = f"{THOUGHT}\n</think>\n\nChecking.\n{CALL % 'Oslo'}"


def _forcing(text: str) -> str:
    """A Lark grammar that allows exactly `text`."""
    return f"start: {json.dumps(text)}\n"


Client = Callable[..., openai.OpenAI]


@pytest.fixture(scope="module")
def serve(tiny_model_factory: Callable[..., TinyModel]) -> Iterator[Client]:
    """`serve(template, **app_options)`: the official client over an in-process app on a tiny model
    with that chat template."""
    clients: list[TestClient] = []

    def make(template: str, **options: Any) -> openai.OpenAI:
        model = tiny_model_factory(context_length=2048, gguf_metadata={"tokenizer.chat_template": template})
        engine = load_engine(model.gguf_path, EngineConfig(ctx_size=2048, max_num_seqs=2))
        app = create_app(
            engine, resolve_settings({"temperature": "0"}, env={}), AppOptions("m", quiet=True, **options)
        )
        http = TestClient(app)
        http.__enter__()  # the lifespan: starts the engine and the template worker
        clients.append(http)
        return openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=http, max_retries=0)

    yield make
    for http in clients:
        http.__exit__(None, None, None)


@pytest.fixture(scope="module")
def qwen3(serve: Client) -> openai.OpenAI:
    return serve((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def opening(serve: Client) -> openai.OpenAI:
    return serve(OPENING_TEMPLATE)


def _chat(client: openai.OpenAI, reply: str, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=400,
        extra_body={"grammar": _forcing(reply)},
        **extra,
    )


def _streamed(client: openai.OpenAI, reply: str, **extra: Any) -> tuple[str, str, list[dict[str, str]], str]:
    """(reasoning, content, calls, finish_reason) reassembled from a chat stream."""
    reasoning, content, calls, finish = [], [], {}, ""
    for chunk in _chat(client, reply, stream=True, **extra):
        for choice in chunk.choices:
            delta = choice.delta
            reasoning.append((delta.model_extra or {}).get("reasoning_content") or "")
            content.append(delta.content or "")
            for call in delta.tool_calls or []:
                entry = calls.setdefault(call.index, {"name": "", "arguments": ""})
                entry["name"] += (call.function and call.function.name) or ""
                entry["arguments"] += (call.function and call.function.arguments) or ""
            finish = choice.finish_reason or finish
    return "".join(reasoning), "".join(content), list(calls.values()), finish


def test_chat_reasoning_is_split_and_calls_come_only_after_it(qwen3: openai.OpenAI) -> None:
    whole = _chat(qwen3, CLOSED_REPLY, tools=TOOLS)
    choice = whole.choices[0]
    assert choice.message.reasoning_content == THOUGHT
    assert choice.message.content == "Checking."
    calls = choice.message.tool_calls
    assert calls is not None and len(calls) == 1  # the call written while thinking is no call
    assert json.loads(calls[0].function.arguments) == {"city": "Oslo"}
    assert choice.finish_reason == "tool_calls"
    reasoning, content, streamed_calls, finish = _streamed(qwen3, CLOSED_REPLY, tools=TOOLS)
    assert (reasoning, content, finish) == (THOUGHT, "Checking.", "tool_calls")
    assert [json.loads(c["arguments"]) for c in streamed_calls] == [{"city": "Oslo"}]


def test_chat_reasoning_without_tools(qwen3: openai.OpenAI) -> None:
    reply = "<think>\nShort.\n</think>\n\nHello!"
    whole = _chat(qwen3, reply).choices[0].message
    assert (whole.reasoning_content, whole.content) == ("Short.", "Hello!")
    assert _streamed(qwen3, reply)[:2] == ("Short.", "Hello!")
    plain = _chat(qwen3, "No thinking today.").choices[0].message
    assert plain.content == "No thinking today." and plain.reasoning_content is None


def test_reasoning_parser_none_keeps_everything_content(serve: Client) -> None:
    client = serve((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"), reasoning_parser="none")
    reply = "<think>\nShort.\n</think>\n\nHello!"
    message = _chat(client, reply).choices[0].message
    assert message.content == reply and "reasoning_content" not in (message.model_extra or {})
    assert _streamed(client, reply)[:2] == ("", reply)


def test_prompt_opened_block(opening: openai.OpenAI) -> None:
    message = _chat(opening, OPENED_REPLY, tools=TOOLS).choices[0].message
    assert message.reasoning_content == THOUGHT
    assert message.content == "Checking."
    assert message.tool_calls is not None and len(message.tool_calls) == 1
    reasoning, content, calls, finish = _streamed(opening, OPENED_REPLY, tools=TOOLS)
    assert (reasoning, content, len(calls), finish) == (THOUGHT, "Checking.", 1, "tool_calls")
    # A constraint that never writes `</think>` cannot close the block: its reply is content.
    json_reply = opening.chat.completions.create(
        model="m",
        messages=ASK,
        max_tokens=24,
        response_format={"type": "json_object"},
    ).choices[0]
    assert json_reply.message.reasoning_content is None
    assert json_reply.message.content and json_reply.message.content.lstrip().startswith("{")


def test_required_call_with_an_opened_block_thinks_first(opening: openai.OpenAI) -> None:
    """`required` under a prompt that opened the block: the call grammar applies after `</think>`, so
    whatever the model writes before it is reasoning (a random model never closes it in 12 tokens:
    no call, and nothing is content)."""
    choice = opening.chat.completions.create(
        model="m",
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        max_tokens=12,
        seed=1,
        temperature=1.0,
    ).choices[0]
    assert choice.finish_reason == "length"
    assert choice.message.tool_calls is None and choice.message.content is None
    assert choice.message.reasoning_content


def test_responses_reasoning_item(qwen3: openai.OpenAI) -> None:
    common: dict[str, Any] = dict(
        model="m",
        input="Weather in Oslo?",
        tools=[{"type": "function", **TOOLS[0]["function"]}],
        max_output_tokens=400,
        extra_body={"grammar": _forcing(CLOSED_REPLY)},
    )
    whole = qwen3.responses.create(**common)
    kinds = [item.type for item in whole.output]
    assert kinds == ["reasoning", "message", "function_call"]
    reasoning = whole.output[0]
    assert reasoning.summary == [] and reasoning.content is not None
    assert [(c.type, c.text) for c in reasoning.content] == [("reasoning_text", THOUGHT)]
    assert whole.output_text == "Checking."
    assert json.loads(whole.output[2].arguments) == {"city": "Oslo"}

    events = list(qwen3.responses.create(**common, stream=True))
    names = [type(e).__name__ for e in events]
    assert "ResponseReasoningTextDeltaEvent" in names and "ResponseReasoningTextDoneEvent" in names
    deltas = "".join(e.delta for e in events if e.type == "response.reasoning_text.delta")
    done = next(e for e in events if e.type == "response.reasoning_text.done")
    assert deltas == done.text == THOUGHT
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == ["reasoning", "message", "function_call"]
    final = events[-1].response
    assert [item.type for item in final.output] == kinds
    # The client's own accumulating stream helper takes the events too.
    with qwen3.responses.stream(**common) as stream:
        assert [item.type for item in stream.get_final_response().output] == kinds


def test_responses_reasoning_input_item_reaches_the_template(qwen3: openai.OpenAI) -> None:
    """A second turn that sends the reasoning item back (as openai-agents does) is accepted."""
    first = qwen3.responses.create(
        model="m", input="Hi", max_output_tokens=100, extra_body={"grammar": _forcing("<think>x</think>Hey")}
    )
    follow_up = [
        {"role": "user", "content": "Hi"},
        *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": "And now?"},
    ]
    second = qwen3.responses.create(
        model="m",
        input=follow_up,
        max_output_tokens=100,
        extra_body={"grammar": _forcing("Fine.")},
    )
    assert second.output_text == "Fine."


def test_unknown_reasoning_parser_exits_2() -> None:
    result = CliRunner().invoke(app, ["serve", "-m", "/nonexistent.gguf", "--reasoning-parser", "nope"])
    assert result.exit_code == 2
    assert "--reasoning-parser must be one of" in result.output and "think" in result.output


def test_reasoning_input_items_become_the_turns_reasoning_content() -> None:
    body = ResponsesRequest.model_validate(
        {
            "input": [
                {"role": "user", "content": "Hi"},
                {
                    "type": "reasoning",
                    "id": "rs_1",
                    "summary": [],
                    "content": [{"type": "reasoning_text", "text": "a"}],
                },
                {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Hey"}]},
                {"role": "user", "content": "Weather?"},
                {"type": "reasoning", "id": "rs_2", "summary": [{"type": "summary_text", "text": "b"}]},
                {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{}"},
                {"type": "reasoning", "id": "rs_3", "summary": [], "encrypted_content": "opaque"},
            ]
        }
    )
    messages = body.chat_messages()
    assert messages[1] == {"role": "assistant", "content": "Hey", "reasoning_content": "a"}
    assert messages[3]["reasoning_content"] == "b" and messages[3]["tool_calls"][0]["id"] == "c1"
    assert len(messages) == 4  # a reasoning item with only encrypted content hands nothing over
