"""POST /v1/responses: OpenAI's Responses API for one text message out, whole or streamed.

A stream is the typed event sequence OpenAI sends: `response.created`, `response.in_progress`,
`response.output_item.added`, `response.content_part.added`, `response.output_text.delta` (only for
tokens that add text), `response.output_text.done`, `response.content_part.done`,
`response.output_item.done`, then `response.completed` (or `response.incomplete` when the token limit
or context ended it). An engine failure sends `error` and `response.failed` instead.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from infer.cli.serve.completions import LogprobFormatter, failure_error, run_whole, speculation_of
from infer.cli.serve.context import ServeContext, new_id
from infer.cli.serve.responses_schema import ResponsesRequest
from infer.cli.serve.sse import SSEResponse, sse_event
from infer.engine import DoneEvent, RequestStream, SamplingParams, TokenEvent

router = APIRouter()


class _ResponseBuilder:
    """The `response` object at each stage, and its message output item."""

    def __init__(
        self, response_id: str, ctx: ServeContext, body: ResponsesRequest, params: SamplingParams, seed: int
    ) -> None:
        self.id = response_id
        self.message_id = new_id("msg_")
        self.created_at = time.time()
        self.body = body
        self.ctx = ctx
        self.params = params
        self.seed = seed

    def _format(self) -> dict[str, Any]:
        """The request's `text.format`, echoed as OpenAI does (plain text when none was given)."""
        fmt = self.body.text.format if self.body.text is not None else None
        return {"type": "text"} if fmt is None else fmt.model_dump(by_alias=True, exclude_none=True)

    def message(self, text: str, status: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        """The assistant message item (content empty while nothing was generated)."""
        content = [self.part(text, logprobs)] if status != "in_progress" else []
        return {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "status": status,
            "content": content,
        }

    def part(self, text: str, logprobs: list[dict[str, Any]] | None) -> dict[str, Any]:
        """An `output_text` content part."""
        return {"type": "output_text", "text": text, "annotations": [], "logprobs": logprobs or []}

    def response(
        self,
        status: str,
        output: list[dict[str, Any]],
        done: DoneEvent | None = None,
        error: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The `response` object."""
        usage = None
        if done is not None:
            usage = {
                "input_tokens": done.usage.prompt_tokens,
                "input_tokens_details": {
                    "cached_tokens": done.usage.cached_prompt_tokens,
                    "cache_write_tokens": 0,
                },
                "output_tokens": done.usage.completion_tokens,
                "output_tokens_details": {"reasoning_tokens": 0},
                "total_tokens": done.usage.total_tokens,
            }
            speculative = speculation_of([done])
            if speculative is not None:
                usage["speculative"] = speculative
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "completed_at": time.time() if status in ("completed", "incomplete") else None,
            "status": status,
            "error": error,
            "incomplete_details": incomplete,
            "instructions": self.body.instructions,
            "max_output_tokens": self.body.max_output_tokens,
            "model": self.ctx.model_id,
            "output": output,
            "parallel_tool_calls": False,
            "temperature": self.params.temperature,
            "top_p": self.params.top_p,
            "top_logprobs": self.body.top_logprobs,
            "tool_choice": "none",
            "tools": [],
            "text": {"format": self._format()},
            "truncation": "disabled",
            "usage": usage,
            "metadata": self.body.metadata or {},
            "seed": self.seed,
        }


def _final_status(done: DoneEvent) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """A model response (OpenAI's Responses API); typed Server-Sent Events with `stream`."""
    ctx: ServeContext = request.app.state.ctx
    ctx.check_model(body.model)
    body.check_supported()
    ids = await ctx.chat_prompt(body.chat_messages(), param="input")
    response_id = new_id("resp_")
    requests, seed, streams = await ctx.start(
        body, [ids], choices=1, id_prefix=response_id, prompt_param="input"
    )
    builder = _ResponseBuilder(response_id, ctx, body, requests[0].sampling, seed)
    formatter = LogprobFormatter(ctx.engine.tokenizer) if body.wants_logprobs() else None
    if body.stream:
        events = _response_events(ctx, streams[0], builder, formatter)
        return SSEResponse(events, on_close=lambda: ctx.bridge.release(streams))

    (result,) = await run_whole(ctx, request, streams)
    assert result.done is not None
    logprobs = [formatter.chat(t) for t in result.tokens] if formatter else None
    status = _final_status(result.done)
    message = builder.message(
        result.done.text, "completed" if status == "completed" else "incomplete", logprobs
    )
    return JSONResponse(builder.response(status, [message], result.done))


async def _response_events(
    ctx: ServeContext, stream: RequestStream, builder: _ResponseBuilder, formatter: LogprobFormatter | None
) -> AsyncIterator[bytes]:
    sequence = 0

    def event(kind: str, **data: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **data}
        sequence += 1
        return sse_event(kind, payload)

    where = {"item_id": builder.message_id, "output_index": 0}
    yield event("response.created", response=builder.response("in_progress", []))
    yield event("response.in_progress", response=builder.response("in_progress", []))
    yield event("response.output_item.added", output_index=0, item=builder.message("", "in_progress", None))
    yield event("response.content_part.added", **where, content_index=0, part=builder.part("", None))
    pending: list[dict[str, Any]] = []
    all_logprobs: list[dict[str, Any]] = []
    text: list[str] = []
    async with aclosing(ctx.bridge.events([stream])) as events:
        async for _, item in events:
            if isinstance(item, TokenEvent):
                if formatter is not None:
                    entry = formatter.chat(item)
                    pending.append(entry)
                    all_logprobs.append(entry)
                if item.text:  # never an empty delta: a token without text waits for one that has it
                    text.append(item.text)
                    yield event(
                        "response.output_text.delta",
                        **where,
                        content_index=0,
                        delta=item.text,
                        logprobs=pending,
                    )
                    pending = []
                continue
            done = item
    failure = failure_error(ctx, done)
    if failure is not None:
        error = {"code": "server_error", "message": failure.message}
        yield event("error", code=failure.code, message=failure.message, param=None)
        partial = builder.message("".join(text), "incomplete", all_logprobs if formatter else None)
        yield event("response.failed", response=builder.response("failed", [partial], done, error))
        return
    full = "".join(text)
    logprobs = all_logprobs if formatter else None
    yield event("response.output_text.done", **where, content_index=0, text=full, logprobs=logprobs or [])
    yield event("response.content_part.done", **where, content_index=0, part=builder.part(full, logprobs))
    status = _final_status(done)
    message = builder.message(full, "completed" if status == "completed" else "incomplete", logprobs)
    yield event("response.output_item.done", output_index=0, item=message)
    yield event(f"response.{status}", response=builder.response(status, [message], done))
