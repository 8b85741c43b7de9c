"""One client's calls against a running `infer serve`, run inside clients_check.py's throwaway venv.

    python clients_calls.py CLIENT BASE_URL MODEL RUNS

imports only that client (and pydantic), makes its basic, streaming, structured and Responses
calls, then RUNS seeded structured calls of a schema with integer fields, and prints one JSON object:
`{"client", "version", "calls": {name: {"ok", "detail"}}, "seeded": [{"seed", "ok", "detail",
"integers"}]}`. A call the client cannot make without tool calling (its own issue) is `"ok": null`
with the reason. Nothing here imports infer: the clients see only HTTP.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import os
import sys
import traceback
import urllib.request
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel

PROMPT = "Name one city in France."
STRUCTURED_PROMPT = "Give a city, its country, its population and the year it was founded, as JSON."
MAX_TOKENS = 200
"""The structured calls' token limit: far more than a City takes, so only a runaway reaches it."""


class City(BaseModel):
    """The structured output: two strings and two integers (the issue's runaway was an integer)."""

    name: str
    country: str
    population: int
    founded: int


SCHEMA = {
    "name": "City",
    "schema": {**City.model_json_schema(), "additionalProperties": False},
    "strict": True,
}


def _integers(city: Any) -> list[int]:
    if isinstance(city, City):
        return [city.population, city.founded]
    if isinstance(city, dict):
        return [v for v in city.values() if isinstance(v, int)]
    return []


def _short(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}"


# -- each client: basic, stream, structured(seed), responses ------------------------------------------
def openai_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    import openai

    client = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
    chat = [{"role": "user", "content": PROMPT}]

    def basic() -> str:
        return (
            client.chat.completions.create(model=model, messages=chat, max_tokens=24)
            .choices[0]
            .message.content
        )

    def stream() -> str:
        parts = client.chat.completions.create(model=model, messages=chat, max_tokens=24, stream=True)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    def structured(seed: int = 0) -> Any:
        reply = client.chat.completions.parse(
            model=model,
            messages=[{"role": "user", "content": STRUCTURED_PROMPT}],
            response_format=City,
            max_tokens=MAX_TOKENS,
            temperature=0.8,
            seed=seed,
        )
        return reply.choices[0].message.parsed

    def responses() -> Any:
        plain = client.responses.create(model=model, input=PROMPT, max_output_tokens=24).output_text
        parsed = client.responses.parse(
            model=model, input=STRUCTURED_PROMPT, text_format=City, max_output_tokens=MAX_TOKENS
        ).output_parsed
        return {"text": plain, "parsed": parsed.model_dump() if parsed else None}

    return {"basic": basic, "stream": stream, "structured": structured, "responses": responses}


def langchain_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    from langchain_openai import ChatOpenAI

    def llm(**kw: Any) -> Any:
        return ChatOpenAI(model=model, base_url=base, api_key="unused", max_retries=0, timeout=300, **kw)

    def structured(seed: int = 0) -> Any:
        runnable = llm(max_tokens=MAX_TOKENS, temperature=0.8, seed=seed).with_structured_output(
            City, method="json_schema", strict=True
        )
        return runnable.invoke(STRUCTURED_PROMPT)

    def responses() -> Any:
        return llm(max_tokens=24, use_responses_api=True).invoke(PROMPT).text

    return {
        "basic": lambda: llm(max_tokens=24).invoke(PROMPT).content,
        "stream": lambda: "".join(str(c.content) for c in llm(max_tokens=24).stream(PROMPT)),
        "structured": structured,
        "responses": responses,
    }


def litellm_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    import litellm

    common = {"model": f"openai/{model}", "api_base": base, "api_key": "unused", "num_retries": 0}
    chat = [{"role": "user", "content": PROMPT}]

    def stream() -> str:
        parts = litellm.completion(messages=chat, max_tokens=24, stream=True, **common)
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    def structured(seed: int = 0) -> Any:
        reply = litellm.completion(
            messages=[{"role": "user", "content": STRUCTURED_PROMPT}],
            response_format={"type": "json_schema", "json_schema": SCHEMA},
            max_tokens=MAX_TOKENS,
            temperature=0.8,
            seed=seed,
            **common,
        )
        if reply.choices[0].finish_reason == "length":
            raise RuntimeError(f"finish_reason length: {reply.choices[0].message.content[-80:]!r}")
        return City.model_validate_json(reply.choices[0].message.content)

    def responses() -> Any:
        reply = litellm.responses(input=PROMPT, max_output_tokens=24, **common)
        return reply.output[0].content[0].text

    return {
        "basic": lambda: (
            litellm.completion(messages=chat, max_tokens=24, **common).choices[0].message.content
        ),
        "stream": stream,
        "structured": structured,
        "responses": responses,
    }


def instructor_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    import instructor
    import openai

    raw = openai.OpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
    client = instructor.from_openai(raw, mode=instructor.Mode.JSON_SCHEMA)
    chat = [{"role": "user", "content": PROMPT}]

    def structured(seed: int = 0) -> Any:
        return client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": STRUCTURED_PROMPT}],
            response_model=City,
            max_tokens=MAX_TOKENS,
            temperature=0.8,
            seed=seed,
            max_retries=0,
        )

    def stream() -> str:
        parts = client.chat.completions.create(
            model=model, messages=chat, max_tokens=24, stream=True, response_model=None
        )
        return "".join(c.choices[0].delta.content or "" for c in parts if c.choices)

    def responses() -> Any:
        # RESPONSES_TOOLS: instructor asks for its model as a forced function call on /v1/responses
        tools_client = instructor.from_openai(raw, mode=instructor.Mode.RESPONSES_TOOLS)
        return tools_client.responses.create(
            model=model,
            input=[{"role": "user", "content": STRUCTURED_PROMPT}],
            response_model=City,
            max_output_tokens=MAX_TOKENS,
            max_retries=0,
        ).model_dump()

    return {
        "basic": lambda: (
            client.chat.completions.create(model=model, messages=chat, max_tokens=24, response_model=None)
            .choices[0]
            .message.content
        ),
        "stream": stream,
        "structured": structured,
        "responses": responses,
    }


def agents_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    import openai
    from agents import (
        Agent,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    loop = asyncio.new_event_loop()  # one loop for every call: the async client's connections live in it
    raw = openai.AsyncOpenAI(base_url=base, api_key="unused", max_retries=0, timeout=300)
    chat_model = OpenAIChatCompletionsModel(model=model, openai_client=raw)
    responses_model = OpenAIResponsesModel(model=model, openai_client=raw)

    def run(agent: Any, prompt: str) -> Any:
        return loop.run_until_complete(Runner.run(agent, prompt)).final_output

    def stream() -> str:
        async def go() -> str:
            agent = Agent(name="a", model=chat_model, model_settings=ModelSettings(max_tokens=24))
            result = Runner.run_streamed(agent, PROMPT)
            async for _ in result.stream_events():
                pass
            return str(result.final_output)

        return loop.run_until_complete(go())

    def structured(seed: int = 0) -> Any:
        settings = ModelSettings(max_tokens=MAX_TOKENS, temperature=0.8, extra_args={"seed": seed})
        agent = Agent(name="a", model=chat_model, model_settings=settings, output_type=City)
        return run(agent, STRUCTURED_PROMPT)

    def responses() -> Any:
        settings = ModelSettings(max_tokens=MAX_TOKENS)
        # the agents SDK raises on an `incomplete` response, so the text call gets room and an instruction
        # to finish (without one the default model went on past 200 tokens about French cities)
        brief = "Answer in one short sentence."
        plain_agent = Agent(name="a", instructions=brief, model=responses_model, model_settings=settings)
        plain = run(plain_agent, PROMPT)
        parsed = run(
            Agent(name="a", model=responses_model, model_settings=settings, output_type=City),
            STRUCTURED_PROMPT,
        )
        return {"text": plain, "parsed": parsed.model_dump()}

    return {
        "basic": lambda: run(
            Agent(name="a", model=chat_model, model_settings=ModelSettings(max_tokens=24)), PROMPT
        ),
        "stream": stream,
        "structured": structured,
        "responses": responses,
    }


def pydantic_ai_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    from pydantic_ai import Agent, NativeOutput
    from pydantic_ai.models.openai import OpenAIChatModel, OpenAIResponsesModel
    from pydantic_ai.providers.openai import OpenAIProvider

    loop = asyncio.new_event_loop()  # one loop for every call, as the provider's client keeps connections
    asyncio.set_event_loop(loop)  # run_sync uses the current loop
    provider = OpenAIProvider(base_url=base, api_key="unused")
    chat_model = OpenAIChatModel(model, provider=provider)
    responses_model = OpenAIResponsesModel(model, provider=provider)
    short = {"max_tokens": 24}

    def stream() -> str:
        async def go() -> str:
            async with Agent(chat_model).run_stream(PROMPT, model_settings=short) as result:
                return "".join([part async for part in result.stream_text(delta=True)])

        return loop.run_until_complete(go())

    def structured(seed: int = 0) -> Any:
        agent = Agent(chat_model, output_type=NativeOutput(City))
        settings = {"max_tokens": MAX_TOKENS, "temperature": 0.8, "seed": seed}
        return agent.run_sync(STRUCTURED_PROMPT, model_settings=settings).output  # type: ignore[arg-type]

    def responses() -> Any:
        plain = Agent(responses_model).run_sync(PROMPT, model_settings=short).output
        parsed = (
            Agent(responses_model, output_type=NativeOutput(City))
            .run_sync(STRUCTURED_PROMPT, model_settings={"max_tokens": MAX_TOKENS})
            .output
        )
        return {"text": plain, "parsed": parsed.model_dump()}

    return {
        "basic": lambda: Agent(chat_model).run_sync(PROMPT, model_settings=short).output,
        "stream": stream,
        "structured": structured,
        "responses": responses,
    }


def llama_index_calls(base: str, model: str) -> dict[str, Callable[..., Any]]:
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.openai_like import OpenAILike

    def llm(**extra: Any) -> Any:
        return OpenAILike(
            model=model,
            api_base=base,
            api_key="unused",
            is_chat_model=True,
            max_retries=0,
            timeout=300,
            **extra,
        )

    chat = [ChatMessage(role="user", content=PROMPT)]

    def structured(seed: int = 0) -> Any:
        kwargs = {"response_format": {"type": "json_schema", "json_schema": SCHEMA}, "seed": seed}
        reply = llm(max_tokens=MAX_TOKENS, temperature=0.8, additional_kwargs=kwargs).chat(
            [ChatMessage(role="user", content=STRUCTURED_PROMPT)]
        )
        return City.model_validate_json(reply.message.content)

    return {
        "basic": lambda: llm(max_tokens=24).chat(chat).message.content,
        "stream": lambda: "".join(c.delta or "" for c in llm(max_tokens=24).stream_chat(chat)),
        "structured": structured,
    }


CLIENTS: dict[str, tuple[str, Callable[[str, str], dict[str, Callable[..., Any]]]]] = {
    "openai": ("openai", openai_calls),
    "langchain-openai": ("langchain-openai", langchain_calls),
    "litellm": ("litellm", litellm_calls),
    "instructor": ("instructor", instructor_calls),
    "openai-agents": ("openai-agents", agents_calls),
    "pydantic-ai": ("pydantic-ai-slim", pydantic_ai_calls),
    "llama-index": ("llama-index-llms-openai-like", llama_index_calls),
}
"""Client name -> (its distribution, its calls)."""

NOT_OFFERED = {
    (
        "llama-index",
        "responses",
    ): "OpenAILike has no Responses API (llama-index-llms-openai's OpenAIResponses has)",
}


def main() -> None:
    """Run one client's calls and print the JSON report (module docstring)."""
    name, base, model, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    distribution, make = CLIENTS[name]
    os.environ.setdefault("OPENAI_API_KEY", "unused")
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no fetch from the internet
    report: dict[str, Any] = {
        "client": name,
        "version": importlib.metadata.version(distribution),
        "calls": {},
        "seeded": [],
    }
    calls = make(base, model)
    for call in ("basic", "stream", "structured", "responses"):
        if (name, call) in NOT_OFFERED:
            report["calls"][call] = {"ok": None, "detail": NOT_OFFERED[(name, call)]}
            continue
        try:
            value = calls[call]()
            shown = value.model_dump() if isinstance(value, BaseModel) else value
            report["calls"][call] = {"ok": True, "detail": json.dumps(shown, default=str)[:300]}
        except Exception as exc:  # every failure is a finding to report, not a crash of the check
            report["calls"][call] = {
                "ok": False,
                "detail": _short(exc),
                "trace": traceback.format_exc()[-1500:],
            }
    # a mark in the server's access log: the lines after the first `GET /health` are the seeded runs
    urllib.request.urlopen(base.removesuffix("/v1") + "/health", timeout=30).read()
    for seed in range(runs):
        try:
            city = calls["structured"](seed)
            report["seeded"].append({"seed": seed, "ok": True, "detail": "", "integers": _integers(city)})
        except Exception as exc:
            report["seeded"].append({"seed": seed, "ok": False, "detail": _short(exc), "integers": []})
    print(json.dumps(report))


if __name__ == "__main__":
    main()
