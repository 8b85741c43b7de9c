"""The OpenAPI document: what each route really answers, for clients and for schemathesis.

FastAPI documents a 200 typed `{}` for routes that return a `Response`, and a 422 that this server
never sends (validation problems are 400, see errors.py). `install_openapi(app)` replaces that with:
the 200 body model of each route (JSON, or `text/event-stream` when the body asks for `stream`), the
OpenAI error body for every error status a route can answer, and `minimum`/`maximum` (or the
exclusive forms) on every bounded sampler field, taken from `SamplingParams`' own ranges.

A stream is described as OpenAPI 3.1 describes Server-Sent Events: the `text/event-stream` schema
is that of one event (`{"event", "data", "id", "retry"}`), and `data` is JSON
(`contentMediaType`) of the route's chunk or event model, an error body, or chat/completions'
`[DONE]`; schemathesis checks every event against it.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi
from pydantic import BaseModel, ConfigDict

from infer.engine import FIELD_RANGES, LOGIT_BIAS_LIMIT


class _Open(BaseModel):
    # Response models document the fields a client can rely on; more may be present.
    model_config = ConfigDict(extra="allow")


class ErrorObject(_Open):
    """OpenAI's error object."""

    message: str
    type: str
    param: Optional[str]
    code: Optional[str]


class ErrorResponse(BaseModel):
    """Every error this server answers: `{"error": {...}}`."""

    error: ErrorObject


class Usage(_Open):
    """Token counts."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int


class ChatMessageOut(_Open):
    """The assistant's message."""

    role: str
    content: Optional[str]
    tool_calls: Optional[list[dict[str, Any]]] = None
    """The calls the reply made (`{id, type: function, function: {name, arguments}}`), when any."""
    reasoning_content: Optional[str] = None
    """The reply's thinking (its `<think>` block), when replies are split (`--reasoning-parser`)."""


class ChatChoice(_Open):
    """One chat choice."""

    index: int
    message: ChatMessageOut
    logprobs: Optional[dict[str, Any]]
    finish_reason: Optional[str]


class ChatCompletion(_Open):
    """POST /v1/chat/completions (whole)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class CompletionChoice(_Open):
    """One completion choice."""

    index: int
    text: str
    logprobs: Optional[dict[str, Any]]
    finish_reason: Optional[str]


class Completion(_Open):
    """POST /v1/completions (whole)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class ResponseObject(_Open):
    """POST /v1/responses (whole)."""

    id: str
    object: str
    created_at: float
    status: str
    model: str
    output: list[dict[str, Any]]
    usage: Optional[dict[str, Any]]


class ChunkChoice(_Open):
    """One choice of a stream chunk: `delta` (chat) or `text` (completions)."""

    index: int
    finish_reason: Optional[str]


class ChatCompletionChunk(_Open):
    """One `chat.completion.chunk` of a chat stream (the usage chunk has no choices)."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]


class CompletionChunk(_Open):
    """One `text_completion` chunk of a completions stream."""

    id: str
    object: str
    created: int
    model: str
    choices: list[ChunkChoice]


class ResponseStreamEvent(_Open):
    """One typed event of a Responses stream (`response.output_text.delta`, ..., `error`)."""

    type: str
    sequence_number: int


class ModelCard(_Open):
    """One model."""

    id: str
    object: str
    created: int
    owned_by: str


class ModelList(_Open):
    """GET /v1/models."""

    object: str
    data: list[ModelCard]


class Health(_Open):
    """GET /health: 200 while admitting, 503 (`shutting_down`) once shutdown began."""

    status: str
    model: str
    active_sequences: int
    waiting_sequences: int
    max_queue: int
    kv_slots_used: int
    kv_slots_kept: int
    kv_slots_total: int
    kv_memory_reserved_bytes: int
    kv_memory_budget_bytes: int
    in_flight: int


_ERROR_STATUSES: dict[str, str] = {
    "400": "Invalid request: `param` names the field at fault.",
    "401": "Missing or wrong API key (when the server has one).",
    "404": "No such model or route.",
    "405": "Method not allowed.",
    "413": "The request body is larger than the server accepts.",
    "500": "An engine failure (the message names the step).",
    "503": "The server is shutting down (`Retry-After` says when to retry elsewhere).",
}

_GENERATION: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletion,
    "/v1/completions": Completion,
    "/v1/responses": ResponseObject,
}
_STREAMED: dict[str, type[BaseModel]] = {
    "/v1/chat/completions": ChatCompletionChunk,
    "/v1/completions": CompletionChunk,
    "/v1/responses": ResponseStreamEvent,
}
"""What each `data:` line of a route's stream holds (besides an error body and `[DONE]`)."""
_READS: dict[str, type[BaseModel]] = {
    "/v1/models": ModelList,
    "/v1/models/{model}": ModelCard,
    "/health": Health,
}


def _ref(model: type[BaseModel]) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def _add_models(schemas: dict[str, Any], models: list[type[BaseModel]]) -> None:
    for model in models:
        schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas.update(schema.pop("$defs", {}))
        schemas[model.__name__] = schema


def _range_keywords(name: str) -> dict[str, float]:
    interval = FIELD_RANGES[name]
    out: dict[str, float] = {}
    if interval.lo != -math.inf:
        out["exclusiveMinimum" if interval.lo_open else "minimum"] = interval.lo
    if interval.hi != math.inf:
        out["exclusiveMaximum" if interval.hi_open else "maximum"] = interval.hi
    return out


def _document_ranges(schemas: dict[str, Any]) -> None:
    """`minimum`/`maximum` on the bounded sampler fields of every request body (JSON Schema range
    keywords apply to numbers only, so `null` stays valid). `temperature` has no minimum: a
    negative one is greedy."""
    for schema in schemas.values():
        properties = schema.get("properties", {})
        for name, prop in properties.items():
            if name in FIELD_RANGES and name != "temperature":
                prop.update(_range_keywords(name))
            elif name == "temperature":
                prop["maximum"] = FIELD_RANGES["temperature"].hi
        bias = properties.get("logit_bias")
        if bias is not None:
            # additionalProperties of the {token id: bias} map; -inf has no JSON form
            for branch in bias.get("anyOf", [bias]):
                values = branch.get("additionalProperties")
                if isinstance(values, dict):
                    values.update({"minimum": -LOGIT_BIAS_LIMIT, "maximum": LOGIT_BIAS_LIMIT})


def _event_schema(path: str) -> dict[str, Any]:
    """One Server-Sent Event of `path`'s stream: `data` is `[DONE]` (chat and completions, whose
    events are unnamed) or JSON of the route's chunk model or an error body."""
    json_data = {
        "type": "string",
        "contentMediaType": "application/json",
        "contentSchema": {"anyOf": [_ref(_STREAMED[path]), _ref(ErrorResponse)]},
    }
    named = path == "/v1/responses"
    data = json_data if named else {"if": {"const": "[DONE]"}, "then": {"type": "string"}, "else": json_data}
    return {
        "type": "object",
        "required": ["data"],
        "properties": {
            "event": {"type": "string"} if named else {"const": "message"},
            "data": data,
            "id": {"type": "string"},
            "retry": {"type": "integer"},
        },
    }


def _responses_for(path: str, method: str) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    if path in _GENERATION:
        responses["200"] = {
            "description": "The whole result, or Server-Sent Events when the body sets `stream`.",
            "content": {
                "application/json": {"schema": _ref(_GENERATION[path])},
                "text/event-stream": {"schema": _event_schema(path)},
            },
        }
        statuses = ["400", "401", "404", "405", "413", "500", "503"]
    else:
        model = _READS[path]
        responses["200"] = {"description": "OK", "content": {"application/json": {"schema": _ref(model)}}}
        statuses = ["401", "404", "405"] if path != "/health" else ["405"]
    for status in statuses:
        responses[status] = {
            "description": _ERROR_STATUSES[status],
            "content": {"application/json": {"schema": _ref(ErrorResponse)}},
        }
    if path == "/health":
        responses["503"] = {
            "description": "Shutting down.",
            "content": {"application/json": {"schema": _ref(Health)}},
        }
    return responses


def _metrics_responses() -> dict[str, Any]:
    """GET /metrics: Prometheus text, or the error body (API key, method)."""
    responses: dict[str, Any] = {
        "200": {
            "description": "Prometheus text format",
            "content": {"text/plain": {"schema": {"type": "string"}}},
        }
    }
    for status in ("401", "405"):
        responses[status] = {
            "description": _ERROR_STATUSES[status],
            "content": {"application/json": {"schema": _ref(ErrorResponse)}},
        }
    return responses


def build_openapi(app: FastAPI) -> dict[str, Any]:
    """The document for `app` (see the module docstring)."""
    document = get_openapi(
        title=app.title,
        version=app.version,
        summary=app.summary,
        description=app.description,
        routes=app.routes,
    )
    schemas = document.setdefault("components", {}).setdefault("schemas", {})
    for phantom in ("HTTPValidationError", "ValidationError"):
        schemas.pop(phantom, None)
    _add_models(
        schemas,
        [
            ErrorResponse,
            ChatCompletion,
            Completion,
            ResponseObject,
            ChatCompletionChunk,
            CompletionChunk,
            ResponseStreamEvent,
            ModelList,
            ModelCard,
            Health,
        ],
    )
    _document_ranges(schemas)
    for path, operations in document.get("paths", {}).items():
        for method, operation in operations.items():
            if path in _GENERATION or path in _READS:
                operation["responses"] = _responses_for(path, method)
            elif path == "/metrics":
                operation["responses"] = _metrics_responses()
    return document


def install_openapi(app: FastAPI) -> None:
    """Serve :func:`build_openapi`'s document at /openapi.json (built on first request, then kept in
    `app.openapi_schema` as FastAPI keeps its own)."""

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            app.openapi_schema = build_openapi(app)
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]


__all__ = ["ErrorResponse", "build_openapi", "install_openapi"]
