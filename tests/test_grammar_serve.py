"""Structured output through `infer serve` on the default model, with the official `openai` client:
chat `response_format` json_schema (strict) and json_object, whole and streamed, the client's
`chat.completions.parse` with a pydantic model, responses `text.format`, and llama-server's
`json_schema` / `grammar` body fields on completions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Literal

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel, Field

from infer.cli.serve.launch import ServerProcess, start_server

pytestmark = pytest.mark.real_model

ASK = [{"role": "user", "content": "Describe a pet as JSON."}]
PET = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "species": {"enum": ["cat", "dog", "fish"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
    },
    "required": ["name", "species", "age"],
    "additionalProperties": False,
}
FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET, "strict": True}}


class Pet(BaseModel):
    name: str = Field(max_length=8)
    species: Literal["cat", "dog", "fish"]
    age: int = Field(ge=0, le=30)


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    process = start_server(
        ["-m", str(default_model_path), "-c", "512", "--max-num-seqs", "4", "--alias", "any"]
    )
    yield process
    assert process.stop() == 0, process.stderr


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=300)


def test_chat_json_schema_whole_and_streamed_agree(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any",
        messages=ASK,
        response_format=FORMAT,
        max_tokens=40,
        temperature=0,  # type: ignore[arg-type]
    )
    text = reply.choices[0].message.content or ""
    assert reply.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(text), PET)
    chunks = list(
        client.chat.completions.create(
            model="any",
            messages=ASK,
            response_format=FORMAT,
            max_tokens=40,
            temperature=0,
            stream=True,  # type: ignore[arg-type]
        )
    )
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert streamed == text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"


def test_chat_json_object_sampled(client: openai.OpenAI) -> None:
    reply = client.chat.completions.create(
        model="any",
        messages=ASK,
        response_format={"type": "json_object"},
        max_tokens=30,
        temperature=1.0,
        seed=5,
    )
    if reply.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(reply.choices[0].message.content or ""), dict)
    else:  # any object may run past the budget: what was written is still an object's prefix
        assert (reply.choices[0].message.content or "").startswith("{")


def test_parse_with_a_pydantic_model(client: openai.OpenAI) -> None:
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    completion = parse(model="any", messages=ASK, response_format=Pet, max_tokens=40, temperature=0)
    pet = completion.choices[0].message.parsed
    assert isinstance(pet, Pet)
    with client.beta.chat.completions.stream(
        model="any", messages=ASK, response_format=Pet, max_tokens=40, temperature=0
    ) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].message.parsed == pet


def test_responses_text_format(client: openai.OpenAI) -> None:
    response = client.responses.create(
        model="any",
        input="Describe a pet as JSON.",
        text={"format": {"type": "json_schema", "name": "pet", "schema": PET, "strict": True}},
        max_output_tokens=40,
        temperature=0,
    )
    jsonschema.validate(json.loads(response.output_text), PET)
    assert response.text.format.type == "json_schema"  # type: ignore[union-attr]


def test_completions_llama_server_fields(server: ServerProcess) -> None:
    with httpx.Client(base_url=server.url, timeout=300) as http:
        body = {"prompt": "A pet as JSON: ", "max_tokens": 40, "temperature": 0, "json_schema": PET}
        reply = http.post("/v1/completions", json=body).json()
        jsonschema.validate(json.loads(reply["choices"][0]["text"]), PET)
        gbnf = 'root ::= "The answer is " ("yes" | "no") "."'
        body = {"prompt": "Is the sea blue?", "max_tokens": 10, "temperature": 0, "grammar": gbnf}
        reply = http.post("/v1/completions", json=body).json()
        assert reply["choices"][0]["text"] in ("The answer is yes.", "The answer is no.")
        assert reply["choices"][0]["finish_reason"] == "stop"


def test_a_request_for_text_outranks_the_servers_constraint(default_model_path: Path) -> None:
    """A server started with `--choice` constrains requests that name no format; `response_format`
    / `text.format` type text asks for free text and gets it; a format of its own replaces the
    server's."""
    process = start_server(
        ["-m", str(default_model_path), "-c", "256", "--choice", "yes,no", "--alias", "any"]
    )
    try:
        client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="unused", max_retries=0, timeout=300)
        ask = [{"role": "user", "content": "Write a sentence about the sea."}]

        def chat(max_tokens: int = 12, **extra: object) -> str:
            reply = client.chat.completions.create(
                model="any", messages=ask, max_tokens=max_tokens, temperature=0, **extra
            )
            return reply.choices[0].message.content or ""

        assert chat() in ("yes", "no")
        free = chat(response_format={"type": "text"})
        assert free not in ("yes", "no") and len(free.split()) > 2, free
        assert isinstance(json.loads(chat(response_format={"type": "json_object"}, max_tokens=40)), dict)
        response = client.responses.create(
            model="any",
            input="Write a sentence about the sea.",
            text={"format": {"type": "text"}},
            max_output_tokens=12,
            temperature=0,
        )
        assert response.output_text not in ("yes", "no") and len(response.output_text.split()) > 2
        plain = client.responses.create(
            model="any", input="Write a sentence about the sea.", max_output_tokens=12, temperature=0
        )
        assert plain.output_text in ("yes", "no")
    finally:
        assert process.stop() == 0, process.stderr
