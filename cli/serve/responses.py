"""POST /v1/responses: OpenAI's Responses API for one text message out, whole or streamed.

A reply split into reasoning and content (cli/serve/reasoning.py) puts a `reasoning` output item
(`content: [{"type": "reasoning_text", ...}]`, `summary: []`) before the message and the calls; its
stream is `response.output_item.added`, `response.content_part.added`, `response.reasoning_text.delta`,
`response.reasoning_text.done`, `response.content_part.done`, `response.output_item.done`.

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
from infer.cli.serve.reasoning import (
    ReasoningDelta,
    ReplyPart,
    ReplyReader,
    shown_marker_ids,
    with_constraint,
)
from infer.cli.serve.responses_schema import ResponsesRequest
from infer.cli.serve.sse import SSEResponse, sse_event
from infer.cli.serve.tools import CallDelta, ContentDelta, FunctionTool, ToolChoice
from infer.engine import DoneEvent, RequestStream, SamplingParams, TokenEvent

router = APIRouter()


class _ResponseBuilder:
    """The `response` object at each stage, and its message output item."""

    def __init__(
        self,
        response_id: str,
        ctx: ServeContext,
        body: ResponsesRequest,
        params: SamplingParams,
        seed: int,
        choice: ToolChoice | None = None,
    ) -> None:
        self.id = response_id
        self.choice = choice
        self.message_id = new_id("msg_")
        self.reasoning_id = new_id("rs_")
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

    def reasoning(self, text: str, status: str) -> dict[str, Any]:
        """The `reasoning` item (its text as one `reasoning_text` part; none while in progress)."""
        content = [self.reasoning_part(text)] if status != "in_progress" else []
        return {
            "id": self.reasoning_id,
            "type": "reasoning",
            "summary": [],
            "content": content,
            "status": status,
        }

    @staticmethod
    def reasoning_part(text: str) -> dict[str, Any]:
        """A `reasoning_text` content part."""
        return {"type": "reasoning_text", "text": text}

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
            "parallel_tool_calls": self.choice.parallel if self.choice else True,
            "temperature": self.params.temperature,
            "top_p": self.params.top_p,
            "top_logprobs": self.body.top_logprobs,
            "tool_choice": self.choice.echo() if self.choice else "auto",
            "tools": [_flat_tool(t) for t in self.choice.tools] if self.choice else [],
            "text": {"format": self._format()},
            "truncation": "disabled",
            "usage": usage,
            "metadata": self.body.metadata or {},
            "seed": self.seed,
        }


def _flat_tool(tool: FunctionTool) -> dict[str, Any]:
    """A tool in the Responses shape."""
    return {
        "type": "function",
        "name": tool.name,
        "description": tool.description,
        "parameters": tool.parameters,
        "strict": True,
    }


def function_call_item(delta: CallDelta, status: str = "completed") -> dict[str, Any]:
    """A `function_call` output item (arguments empty while in progress)."""
    return {
        "id": f"fc_{delta.id.removeprefix('call_')}",
        "type": "function_call",
        "status": status,
        "call_id": delta.id,
        "name": delta.call.name,
        "arguments": delta.call.arguments if status == "completed" else "",
    }


def _final_status(done: DoneEvent) -> str:
    return "incomplete" if done.finish_reason == "length" else "completed"


@router.post("/v1/responses", response_model=None)
async def create_response(body: ResponsesRequest, request: Request) -> Response:
    """A model response (OpenAI's Responses API); typed Server-Sent Events with `stream`."""
    ctx: ServeContext = request.app.state.ctx
    ctx.check_model(body.model)
    body.check_supported()
    choice = body.tool_choice_of()
    ids, plan = await ctx.tool_prompt(body.chat_messages(), choice, param="input")
    thinking = ctx.thinking_of(ids)
    if thinking is not None:
        body.show_special(shown_marker_ids(ctx.engine.tokenizer))
    if plan is not None:
        body.use_tool_grammar(
            lambda exclusive: plan.grammar(exclusive=exclusive, thinking=thinking),
            plan.shown_special_ids(ctx.engine.tokenizer),
            forced=plan.choice.mode == "required",
        )
    response_id = new_id("resp_")
    requests, seed, streams = await ctx.start(
        body, [ids], choices=1, id_prefix=response_id, prompt_param="input"
    )
    starts = with_constraint(thinking, requests[0].grammar)  # how the reply is read
    syntax = plan.syntax if plan is not None and plan.parses else None
    reader = ReplyReader(starts, syntax) if syntax is not None or starts is not None else None
    builder = _ResponseBuilder(response_id, ctx, body, requests[0].sampling, seed, choice)
    formatter = LogprobFormatter(ctx.engine.tokenizer) if body.wants_logprobs() else None
    if body.stream:
        events = _response_events(ctx, streams[0], builder, formatter, reader)
        return SSEResponse(events, on_close=lambda: ctx.bridge.release(streams))

    (result,) = await run_whole(ctx, request, streams)
    assert result.done is not None
    logprobs = [formatter.chat(t) for t in result.tokens] if formatter else None
    status = _final_status(result.done)
    item_status = "completed" if status == "completed" else "incomplete"
    if reader is None:
        output = [builder.message(result.done.text, item_status, logprobs)]
    else:
        reader.feed(result.done.text)
        reader.finish()
        reasoning = reader.reasoning
        output = [builder.reasoning(reasoning, item_status)] if reasoning is not None else []
        if reader.tools is None or reader.content:  # without tools, always a message
            output.append(builder.message(reader.content or "", item_status, logprobs))
        output += [function_call_item(call) for call in reader.calls]
    return JSONResponse(builder.response(status, output, result.done))


async def _response_events(
    ctx: ServeContext,
    stream: RequestStream,
    builder: _ResponseBuilder,
    formatter: LogprobFormatter | None,
    reader: ReplyReader | None = None,
) -> AsyncIterator[bytes]:
    """The typed events of one response. Without a reader (no tools, no reasoning) the message item
    opens at once; with one it opens at the first content text (without tools, at the end if there
    was none), a `reasoning` item before it holds the reasoning, and each call is a `function_call`
    item (added, its arguments as a delta, done) in output order."""
    sequence = 0

    def event(kind: str, **data: Any) -> bytes:
        nonlocal sequence
        payload = {"type": kind, "sequence_number": sequence, **data}
        sequence += 1
        return sse_event(kind, payload)

    output: list[dict[str, Any]] = []
    message_index: int | None = None
    reasoning_index: int | None = None
    reasoning: list[str] = []
    pending: list[dict[str, Any]] = []
    all_logprobs: list[dict[str, Any]] = []
    text: list[str] = []

    def where() -> dict[str, Any]:
        return {"item_id": builder.message_id, "output_index": message_index}

    def open_message() -> list[bytes]:
        nonlocal message_index
        message_index = len(output)
        output.append(builder.message("", "in_progress", None))
        return [
            event("response.output_item.added", output_index=message_index, item=output[message_index]),
            event("response.content_part.added", **where(), content_index=0, part=builder.part("", None)),
        ]

    def close_message(status: str) -> list[bytes]:
        if message_index is None:
            return []
        full = "".join(text)
        logprobs = all_logprobs if formatter else None
        item = builder.message(full, status, logprobs)
        output[message_index] = item
        return [
            event(
                "response.output_text.done", **where(), content_index=0, text=full, logprobs=logprobs or []
            ),
            event(
                "response.content_part.done", **where(), content_index=0, part=builder.part(full, logprobs)
            ),
            event("response.output_item.done", output_index=message_index, item=item),
        ]

    def reasoning_at() -> dict[str, Any]:
        return {"item_id": builder.reasoning_id, "output_index": reasoning_index, "content_index": 0}

    def reasoning_events(delta: ReasoningDelta) -> list[bytes]:
        nonlocal reasoning_index
        out: list[bytes] = []
        if reasoning_index is None:
            reasoning_index = len(output)
            output.append(builder.reasoning("", "in_progress"))
            out += [
                event("response.output_item.added", output_index=reasoning_index, item=output[-1]),
                event("response.content_part.added", **reasoning_at(), part=builder.reasoning_part("")),
            ]
        reasoning.append(delta.text)
        return [*out, event("response.reasoning_text.delta", **reasoning_at(), delta=delta.text)]

    def close_reasoning(status: str = "completed") -> list[bytes]:
        """The reasoning item's done events, once (when the content or a call starts, or at the end)."""
        if reasoning_index is None or output[reasoning_index]["status"] != "in_progress":
            return []
        full = "".join(reasoning)
        item = output[reasoning_index] = builder.reasoning(full, status)
        return [
            event("response.reasoning_text.done", **reasoning_at(), text=full),
            event("response.content_part.done", **reasoning_at(), part=builder.reasoning_part(full)),
            event("response.output_item.done", output_index=reasoning_index, item=item),
        ]

    def call_events(delta: CallDelta) -> list[bytes]:
        index = len(output)
        item = function_call_item(delta)
        output.append(item)
        at = {"item_id": item["id"], "output_index": index}
        return [
            event(
                "response.output_item.added",
                output_index=index,
                item=function_call_item(delta, "in_progress"),
            ),
            event("response.function_call_arguments.delta", **at, delta=delta.call.arguments),
            event("response.function_call_arguments.done", **at, arguments=delta.call.arguments),
            event("response.output_item.done", output_index=index, item=item),
        ]

    def deltas_events(deltas: list[ReplyPart]) -> list[bytes]:
        nonlocal pending
        out: list[bytes] = []
        for delta in deltas:
            if isinstance(delta, ReasoningDelta):
                out += reasoning_events(delta)
                continue
            out += close_reasoning()
            if isinstance(delta, CallDelta):
                out += call_events(delta)
                continue
            if message_index is None:
                out += open_message()
            text.append(delta.text)
            out.append(
                event(
                    "response.output_text.delta",
                    **where(),
                    content_index=0,
                    delta=delta.text,
                    logprobs=pending,
                )
            )
            pending = []
        return out

    yield event("response.created", response=builder.response("in_progress", []))
    yield event("response.in_progress", response=builder.response("in_progress", []))
    if reader is None:
        for chunk in open_message():
            yield chunk
    async with aclosing(ctx.bridge.events([stream])) as events:
        async for _, item in events:
            if isinstance(item, TokenEvent):
                if formatter is not None:
                    entry = formatter.chat(item)
                    pending.append(entry)
                    all_logprobs.append(entry)
                if item.text:  # never an empty delta: a token without text waits for one that has it
                    deltas = [ContentDelta(item.text)] if reader is None else reader.feed(item.text)
                    for chunk in deltas_events(deltas):
                        yield chunk
                continue
            done = item
    failure = failure_error(ctx, done)
    if failure is not None:
        error = {"code": "server_error", "message": failure.message}
        yield event("error", code=failure.code, message=failure.message, param=None)
        partial = builder.message("".join(text), "incomplete", all_logprobs if formatter else None)
        thought = [builder.reasoning("".join(reasoning), "incomplete")] if reasoning else []
        yield event("response.failed", response=builder.response("failed", [*thought, partial], done, error))
        return
    status = _final_status(done)
    item_status = "completed" if status == "completed" else "incomplete"
    if reader is not None:
        for chunk in deltas_events(reader.finish()):
            yield chunk
        for chunk in close_reasoning(item_status):
            yield chunk
        if reader.tools is None and message_index is None:  # without tools, always a message
            for chunk in open_message():
                yield chunk
    for chunk in close_message(item_status):
        yield chunk
    yield event(f"response.{status}", response=builder.response(status, output, done))
