"""Two agent frameworks from the registry run a one-tool agent against `infer serve` on the default
model with the tool forced (issue 32, acceptance 3): the OpenAI Agents SDK (`openai-agents`, over
chat completions and over the Responses API) and LangChain's `ChatOpenAI.bind_tools` /
`with_structured_output(method="function_calling")` (`langchain-openai`). Both are dev extras; a
checkout without them skips this file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer.cli.serve.launch import ServerProcess, start_server

agents = pytest.importorskip("agents")
langchain_openai = pytest.importorskip("langchain_openai")

pytestmark = pytest.mark.real_model

QUESTION = "What is the weather in Paris?"


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    process = start_server(["-m", str(default_model_path), "-c", "1024", "--accept-any-model"])
    yield process
    assert process.stop() == 0, process.stderr


def _weather_tool(calls: list[dict[str, Any]]) -> Any:
    @agents.function_tool
    def get_weather(city: str) -> str:
        """The current weather in a city.

        Args:
            city: The city's name.
        """
        calls.append({"city": city})
        return f"Sunny, 21 C in {city}"

    return get_weather


@pytest.mark.parametrize("api", ["chat_completions", "responses"])
def test_openai_agents_sdk_runs_a_forced_tool(server: ServerProcess, api: str) -> None:
    from openai import AsyncOpenAI

    agents.set_tracing_disabled(True)  # no trace upload to api.openai.com
    client = AsyncOpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)
    model_class = (
        agents.OpenAIChatCompletionsModel if api == "chat_completions" else agents.OpenAIResponsesModel
    )
    calls: list[dict[str, Any]] = []
    agent = agents.Agent(
        name="weather",
        instructions="Answer with the weather tool.",
        tools=[_weather_tool(calls)],
        model=model_class(model="any", openai_client=client),
        model_settings=agents.ModelSettings(tool_choice="required", max_tokens=64, parallel_tool_calls=False),
        tool_use_behavior="stop_on_first_tool",  # the tool's result is the final output
    )
    result = asyncio.run(agents.Runner.run(agent, QUESTION, max_turns=2))
    assert len(calls) == 1 and isinstance(calls[0]["city"], str) and calls[0]["city"]
    assert result.final_output == f"Sunny, 21 C in {calls[0]['city']}"


def test_langchain_bind_tools_and_structured_output(server: ServerProcess) -> None:
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from pydantic import BaseModel, Field

    @tool
    def get_weather(city: str) -> str:
        """The current weather in a city."""
        return f"Sunny, 21 C in {city}"

    llm = langchain_openai.ChatOpenAI(
        base_url=f"{server.url}/v1", api_key="unused", model="any", max_tokens=64, seed=5, max_retries=0
    )
    bound = llm.bind_tools([get_weather], tool_choice="get_weather", parallel_tool_calls=False)
    question = HumanMessage(QUESTION)
    reply = bound.invoke([question])
    assert [call["name"] for call in reply.tool_calls] == ["get_weather"]
    call = reply.tool_calls[0]
    assert isinstance(call["args"]["city"], str)
    # The loop: run the tool, send its result back, get an answer in text.
    result = ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"])
    answer = llm.bind_tools([get_weather], tool_choice="none").invoke([question, reply, result])
    assert answer.content and not answer.tool_calls

    class Weather(BaseModel):
        """A weather report."""

        city: str = Field(max_length=20)
        celsius: int = Field(ge=-50, le=60)

    report = llm.with_structured_output(Weather, method="function_calling").invoke(QUESTION)
    assert isinstance(report, Weather)
