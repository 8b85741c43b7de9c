"""The server's OpenAI mapping of tools (cli/serve/tools.py), without a model: reading `tools` and
`tool_choice`, the conversation handed to the template, the plan for templates with and without
tool rendering, and the reply split into content and calls the same way whole and streamed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from infer.cli.serve.errors import APIError
from infer.cli.serve.responses_schema import ResponsesRequest
from infer.cli.serve.tools import (
    CallDelta,
    ContentDelta,
    ReplySplitter,
    finish_reason,
    plan_tools,
    read_tool_choice,
    template_messages,
)
from infer.engine import syntax_named

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def test_tool_choice_modes() -> None:
    assert read_tool_choice(None, None, None, flat=False) is None
    assert read_tool_choice([], "auto", None, flat=False) is None
    auto = read_tool_choice([TOOL], None, None, flat=False)
    assert auto is not None and auto.mode == "auto" and auto.parallel
    named = read_tool_choice(
        [TOOL], {"type": "function", "function": {"name": "get_weather"}}, False, flat=False
    )
    assert named is not None and named.mode == "required" and named.forced == "get_weather"
    assert not named.parallel and named.echo() == {"type": "function", "name": "get_weather"}
    flat = {"type": "function", "name": "get_weather", "parameters": {"type": "object"}}
    responses = read_tool_choice([flat], {"type": "function", "name": "get_weather"}, None, flat=True)
    assert responses is not None and responses.tools[0].template_form() == {
        "type": "function",
        "function": {"name": "get_weather", "parameters": {"type": "object"}},
    }


@pytest.mark.parametrize(
    ("tools", "choice", "param"),
    [
        ([TOOL], "always", "tool_choice"),
        ([], "required", "tool_choice"),
        ([TOOL], {"type": "function", "function": {"name": "other"}}, "tool_choice"),
        (
            [{"type": "function", "function": {"name": "x", "parameters": []}}],
            None,
            "tools.0.function.parameters",
        ),
        ([{"type": "code_interpreter"}], None, "tools.0.type"),
        ([{"type": "function"}], None, "tools.0.function"),
    ],
)
def test_bad_tools_name_the_field(tools: list[Any], choice: Any, param: str) -> None:
    with pytest.raises(APIError) as caught:
        read_tool_choice(tools, choice, None, flat=False)
    assert caught.value.param == param and caught.value.status == 400


def test_past_call_arguments_reach_the_template_as_objects() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}
    bad = {"id": "c2", "function": {"name": "g", "arguments": "not json"}}
    (message,) = template_messages([{"role": "assistant", "content": None, "tool_calls": [call, bad]}])
    assert message["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    assert message["tool_calls"][1]["function"]["arguments"] == "not json"
    assert message["tool_calls"][1]["type"] == "function"
    with pytest.raises(APIError) as caught:
        template_messages([{"role": "assistant", "tool_calls": [{"function": {}}]}])
    assert caught.value.param == "messages.0.tool_calls.0.function"


def test_plan_follows_the_template_or_the_generic_prompt() -> None:
    choice = read_tool_choice([TOOL], "required", None, flat=False)
    llama = syntax_named("llama3_json")
    rendered = plan_tools(choice, parser=None, template_syntax=llama, renders_tools=True)
    assert rendered is not None and rendered.syntax.name == "llama3_json" and not rendered.generic_prompt
    assert rendered.template_tools() == [TOOL]
    override = plan_tools(choice, parser="hermes", template_syntax=llama, renders_tools=True)
    assert override is not None and override.syntax.name == "hermes"
    generic = plan_tools(choice, parser=None, template_syntax=llama, renders_tools=False)
    assert generic is not None and generic.syntax.name == "hermes" and generic.template_tools() is None
    messages = generic.messages([{"role": "user", "content": "hi"}])
    assert messages[0]["role"] == "system" and json.dumps(TOOL) in messages[0]["content"]
    assert generic.grammar(exclusive=True) is not None
    none = read_tool_choice([TOOL], "none", None, flat=False)
    quiet = plan_tools(none, parser=None, template_syntax=llama, renders_tools=False)
    assert quiet is not None and not quiet.parses and quiet.grammar(exclusive=True) is None
    assert quiet.messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]
    # auto leaves the output to another constraint; a forced call cannot share it.
    auto = plan_tools(
        read_tool_choice([TOOL], "auto", None, flat=False),
        parser=None,
        template_syntax=llama,
        renders_tools=True,
    )
    assert (
        auto is not None
        and auto.grammar(exclusive=False) is None
        and auto.grammar(exclusive=True) is not None
    )


REPLY = 'Sure.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>\n'


def _split(pieces: list[str]) -> tuple[list[Any], ReplySplitter]:
    splitter = ReplySplitter(syntax_named("hermes"), make_id=lambda _: "call_x")
    deltas = [d for piece in pieces for d in splitter.feed(piece)] + splitter.finish()
    return deltas, splitter


def test_reply_splits_the_same_whole_and_streamed() -> None:
    whole, splitter = _split([REPLY])
    assert whole[0] == ContentDelta("Sure.")  # the newlines around calls are not content
    assert isinstance(whole[1], CallDelta) and whole[1].openai() == {
        "id": "call_x",
        "type": "function",
        "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
    }
    assert len(whole) == 2 and splitter.text == "Sure."
    assert finish_reason("stop", splitter) == "tool_calls" and finish_reason("length", splitter) == "length"
    for cut in range(len(REPLY) + 1):
        deltas, streamed = _split([REPLY[:cut], REPLY[cut:]])
        assert streamed.text == "Sure." and [d for d in deltas if isinstance(d, CallDelta)] == whole[1:], cut
    only_space, quiet = _split(["  \n"])
    assert only_space == [ContentDelta("  \n")] and finish_reason("stop", quiet) == "stop"


def test_mistral_ids_are_nine_alphanumerics() -> None:
    splitter = ReplySplitter(syntax_named("mistral"))
    (delta,) = splitter.feed('[TOOL_CALLS][{"name": "f", "arguments": {}}]') + splitter.finish()
    assert isinstance(delta, CallDelta) and len(delta.id) == 9 and delta.id.isalnum()


def test_responses_input_items_become_a_tool_conversation() -> None:
    body = ResponsesRequest.model_validate(
        {
            "input": [
                {"role": "user", "content": "weather?"},
                {
                    "type": "function_call",
                    "call_id": "c1",
                    "name": "get_weather",
                    "arguments": '{"city": "A"}',
                },
                {
                    "type": "function_call",
                    "call_id": "c2",
                    "name": "get_weather",
                    "arguments": '{"city": "B"}',
                },
                {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
                {
                    "type": "function_call_output",
                    "call_id": "c2",
                    "output": [{"type": "input_text", "text": "rain"}],
                },
            ]
        }
    )
    messages = body.chat_messages()
    assert [m["role"] for m in messages] == ["user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[1]["tool_calls"]] == ["c1", "c2"]
    assert messages[3] == {"role": "tool", "tool_call_id": "c2", "content": "rain"}
    bad = ResponsesRequest.model_validate({"input": [{"type": "function_call", "name": "f"}]})
    with pytest.raises(APIError) as caught:
        bad.chat_messages()
    assert caught.value.param == "input.0"
