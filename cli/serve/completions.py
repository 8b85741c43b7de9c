"""POST /v1/chat/completions and POST /v1/completions, whole or streamed, shaped as OpenAI shapes them.

A stream sends the role first (chat), then one chunk per token that adds text (a token that renders
no text, e.g. half a UTF-8 character, sends nothing; its logprob rides on the next chunk), then a
chunk with `finish_reason` per choice, an optional usage chunk, and `data: [DONE]`. An engine failure
mid-stream sends an OpenAI error object (`{"error": {...}}`, which the official client raises) and
`[DONE]`; the whole-response form answers 500 with the engine's message instead of a truncated text.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from dataclasses import dataclass, field
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response

from infer.cli.serve.bridge import RETRY_AFTER, SHUTDOWN_MESSAGE, until_disconnect
from infer.cli.serve.context import ServeContext, new_id
from infer.cli.serve.errors import SERVER_ERROR, APIError, error_body
from infer.cli.serve.reasoning import (
    ReasoningDelta,
    ReplyPart,
    ReplyReader,
    shown_marker_ids,
    with_constraint,
)
from infer.cli.serve.schemas import (
    INVALID_GRAMMAR,
    ChatCompletionRequest,
    CompletionRequest,
    is_constraint_param,
)
from infer.cli.serve.sse import DONE, SSEResponse, finite_or_none, sse_data
from infer.cli.serve.tools import ContentDelta, finish_reason
from infer.engine import (
    CallSyntax,
    DoneEvent,
    RequestStream,
    ThinkingStart,
    TokenEvent,
    Tokenizer,
    merge_spec_counters,
    spec_summary,
)

router = APIRouter()

FINGERPRINT = "infer"
"""`system_fingerprint`: the server. The seed that replays a response is its own field, `seed`."""


# -- shared pieces ---------------------------------------------------------------------------------
@dataclass
class ChoiceResult:
    """Everything one choice produced."""

    tokens: list[TokenEvent] = field(default_factory=list)
    done: DoneEvent | None = None


async def collect(ctx: ServeContext, streams: Sequence[RequestStream]) -> list[ChoiceResult]:
    """Run every stream to its DoneEvent."""
    results = [ChoiceResult() for _ in streams]
    async with aclosing(ctx.bridge.events(streams)) as events:
        async for index, event in events:
            if isinstance(event, TokenEvent):
                results[index].tokens.append(event)
            else:
                results[index].done = event
    return results


async def run_whole(
    ctx: ServeContext, request: Request, streams: Sequence[RequestStream]
) -> list[ChoiceResult]:
    """Collect every choice (cancelling them if the client leaves); APIError if any failed."""
    results = await until_disconnect(request, collect(ctx, streams), lambda: ctx.bridge.release(streams))
    for result in results:
        assert result.done is not None
        failure = failure_error(ctx, result.done)
        if failure is not None:
            raise failure
    return results


def failure_error(ctx: ServeContext, done: DoneEvent) -> APIError | None:
    """The APIError a failed or cancelled request answers with (None when it finished normally)."""
    if done.finish_reason == "error":
        if done.error_param is not None:  # the request's own settings or grammar failed: its fault
            code = INVALID_GRAMMAR if is_constraint_param(done.error_param) else "sampling_failed"
            return APIError(done.error or "generation failed", param=done.error_param, code=code)
        return APIError(done.error or "generation failed", status=500, type=SERVER_ERROR, code="engine_error")
    if done.finish_reason == "cancelled":
        message = SHUTDOWN_MESSAGE if ctx.bridge.shutting_down else "the request was cancelled"
        return APIError(message, status=503, type=SERVER_ERROR, code="cancelled", headers=RETRY_AFTER)
    return None


def usage_of(results_done: Sequence[DoneEvent], prompt_lengths: Sequence[int]) -> dict[str, Any]:
    """OpenAI usage: each prompt counted once, every choice's completion tokens summed; with
    speculation, `speculative` holds the choices' counters summed (`infer.engine.speculative.summary`)."""
    prompt = sum(prompt_lengths)
    completion = sum(d.usage.completion_tokens for d in results_done)
    # Prompt tokens served from the prefix cache: the choices' average, as each prompt counts once.
    per_choice = len(results_done) / max(len(prompt_lengths), 1)
    cached = (
        round(sum(d.usage.cached_prompt_tokens for d in results_done) / per_choice) if results_done else 0
    )
    usage: dict[str, Any] = {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": min(cached, prompt)},
    }
    speculative = speculation_of(results_done)
    if speculative is not None:
        usage["speculative"] = speculative
    return usage


def speculation_of(results_done: Sequence[DoneEvent]) -> dict[str, Any] | None:
    """The choices' speculation counters summed, as `summary` shows them, plus llama-server's names
    (`draft_n`, `draft_n_accepted`); None when no choice speculated."""
    totals: dict[str, int] = {}
    for done in results_done:
        totals = merge_spec_counters(totals, done.counters)
    stats = spec_summary(totals)
    if stats is None:
        return None
    return {**stats, "draft_n": stats["draft_tokens"], "draft_n_accepted": stats["accepted_tokens"]}


def timings_of(results_done: Sequence[DoneEvent]) -> dict[str, Any]:
    """llama-server's `timings` fields this server reports: `{"timings": {"draft_n", "draft_n_accepted"}}`
    when the request speculated, else nothing (merged into a response object)."""
    stats = speculation_of(results_done)
    if stats is None:
        return {}
    return {"timings": {"draft_n": stats["draft_n"], "draft_n_accepted": stats["draft_n_accepted"]}}


class LogprobFormatter:
    """Token log-probabilities in the chat (`content: [...]`) and legacy completions shapes."""

    def __init__(self, tokenizer: Tokenizer, as_ids: bool = False) -> None:
        self.tokenizer = tokenizer
        self.as_ids = as_ids
        """vLLM's `return_tokens_as_token_ids`: tokens are written `"token_id:N"`."""

    def token(self, token_id: int, logprob: float) -> dict[str, Any]:
        """`{"token", "logprob", "bytes"}`; -inf is null."""
        data = self.tokenizer.token_bytes(token_id)
        return {
            "token": f"token_id:{token_id}" if self.as_ids else data.decode("utf-8", errors="replace"),
            "logprob": finite_or_none(logprob),
            "bytes": list(data),
        }

    def chat(self, event: TokenEvent) -> dict[str, Any]:
        """One chat `logprobs.content` entry."""
        entry = self.token(event.token_id, event.logprob)
        entry["top_logprobs"] = [self.token(t, lp) for t, lp in event.top_logprobs]
        return entry

    def legacy(self, events: Sequence[TokenEvent], offset: int, with_top: bool) -> dict[str, Any]:
        """The completions `logprobs` object for `events`, text offsets starting at `offset`."""
        tokens, token_logprobs, top, offsets = [], [], [], []
        for event in events:
            tokens.append(self.token(event.token_id, event.logprob)["token"])
            token_logprobs.append(finite_or_none(event.logprob))
            top.append({self.token(t, lp)["token"]: finite_or_none(lp) for t, lp in event.top_logprobs})
            offsets.append(offset)
            offset += len(event.text)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": top if with_top else None,
            "text_offset": offsets,
        }


def _stream_failure(ctx: ServeContext, done: DoneEvent) -> bytes:
    failure = failure_error(ctx, done)
    assert failure is not None
    return sse_data(error_body(failure.message, type=failure.type, code=failure.code))


# -- chat ----------------------------------------------------------------------------------------
@router.post("/v1/chat/completions", response_model=None)
async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
    """Chat completion (OpenAI's shape), streamed as `chat.completion.chunk` events with `stream`."""
    ctx: ServeContext = request.app.state.ctx
    ctx.check_model(body.model)
    body.check_supported()
    ids, plan = await ctx.tool_prompt(body.chat_messages(), body.tool_choice_of())
    thinking = ctx.thinking_of(ids)
    if thinking is not None:
        body.show_special(shown_marker_ids(ctx.engine.tokenizer))
    if plan is not None:
        body.use_tool_grammar(
            lambda exclusive: plan.grammar(exclusive=exclusive, thinking=thinking),
            plan.shown_special_ids(ctx.engine.tokenizer),
            forced=plan.choice.mode == "required",
        )
    parser = plan.syntax if plan is not None and plan.parses else None
    completion_id = new_id("chatcmpl-")
    requests, seed, streams = await ctx.start(
        body, [ids], choices=body.n, id_prefix=completion_id, prompt_param="messages"
    )
    starts = with_constraint(thinking, requests[0].grammar)  # how the reply is read
    head = {
        "id": completion_id,
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": FINGERPRINT,
        "seed": seed,
    }
    formatter = (
        LogprobFormatter(ctx.engine.tokenizer, body.return_tokens_as_token_ids) if body.logprobs else None
    )
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _chat_chunks(
            ctx, streams, head, formatter, len(ids), include_usage, body.return_token_ids, parser, starts
        )
        return SSEResponse(chunks, on_close=lambda: ctx.bridge.release(streams))

    results = await run_whole(ctx, request, streams)
    choices = []
    for index, result in enumerate(results):
        assert result.done is not None
        logprobs = None
        if formatter is not None:
            logprobs = {"content": [formatter.chat(t) for t in result.tokens], "refusal": None}
        message: dict[str, Any] = {"role": "assistant", "content": result.done.text, "refusal": None}
        reader = ReplyReader(starts, parser) if parser is not None or starts is not None else None
        if reader is not None:
            reader.feed(result.done.text)
            reader.finish()
            message["content"] = reader.content
            if starts is not None:
                message["reasoning_content"] = reader.reasoning
            if reader.calls:
                message["tool_calls"] = [call.openai() for call in reader.calls]
        choice = {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": finish_reason(result.done.finish_reason, reader.tools if reader else None),
        }
        if body.return_token_ids:
            choice["token_ids"] = list(result.done.token_ids)
        choices.append(choice)
    dones = [r.done for r in results if r.done is not None]
    extra = {"prompt_token_ids": list(ids)} if body.return_token_ids else {}
    return JSONResponse(
        {
            **head,
            "object": "chat.completion",
            "choices": choices,
            "usage": usage_of(dones, [len(ids)]),
            **extra,
            **timings_of(dones),
        }
    )


async def _chat_chunks(
    ctx: ServeContext,
    streams: Sequence[RequestStream],
    head: dict[str, Any],
    formatter: LogprobFormatter | None,
    prompt_tokens: int,
    include_usage: bool,
    token_ids: bool = False,
    parser: CallSyntax | None = None,
    thinking: ThinkingStart | None = None,
) -> AsyncIterator[bytes]:
    head = {**head, "object": "chat.completion.chunk"}
    reads = parser is not None or thinking is not None
    readers = [ReplyReader(thinking, parser) if reads else None for _ in streams]
    usage_field = {"usage": None} if include_usage else {}
    pending_ids: list[list[int]] = [[] for _ in streams]

    def chunk(
        index: int, delta: dict[str, Any], finish: str | None, logprobs: list[dict[str, Any]] | None
    ) -> bytes:
        choice = {
            "index": index,
            "delta": delta,
            "logprobs": {"content": logprobs, "refusal": None} if logprobs is not None else None,
            "finish_reason": finish,
        }
        if token_ids:  # vLLM's return_token_ids: the ids this chunk completes
            choice["token_ids"], pending_ids[index] = pending_ids[index], []
        return sse_data({**head, "choices": [choice], **usage_field})

    for index in range(len(streams)):
        yield chunk(index, {"role": "assistant"}, None, None)
    pending: list[list[dict[str, Any]]] = [[] for _ in streams]
    dones: list[DoneEvent] = []
    async with aclosing(ctx.bridge.events(streams)) as events:
        async for index, event in events:
            if isinstance(event, TokenEvent):
                pending_ids[index].append(event.token_id)
                if formatter is not None:
                    pending[index].append(formatter.chat(event))
                if event.text:  # a token without text yet (half a character) sends nothing
                    reader = readers[index]
                    deltas = [ContentDelta(event.text)] if reader is None else reader.feed(event.text)
                    for delta in _reply_chunks(deltas):
                        yield chunk(index, delta, None, pending[index] if formatter else None)
                        pending[index] = []
                continue
            if event.finish_reason in ("error", "cancelled"):
                yield _stream_failure(ctx, event)
                yield DONE
                return
            dones.append(event)
            reader = readers[index]
            if reader is not None:
                for delta in _reply_chunks(reader.finish()):
                    yield chunk(index, delta, None, pending[index] if formatter else None)
                    pending[index] = []
            reason = finish_reason(event.finish_reason, reader.tools if reader else None)
            yield chunk(index, {}, reason, (pending[index] or None) if formatter else None)
    if include_usage:
        yield sse_data({**head, "choices": [], "usage": usage_of(dones, [prompt_tokens])})
    yield DONE


def _reply_chunks(deltas: Sequence[ReplyPart]) -> list[dict[str, Any]]:
    """The chat `delta` objects for reasoning (`reasoning_content`, as llama-server and vLLM send
    it), content and calls: a call is two chunks, its id and name with empty arguments, then the
    arguments (as OpenAI streams a call: the name first, the arguments in pieces after it)."""
    out: list[dict[str, Any]] = []
    for delta in deltas:
        if isinstance(delta, ReasoningDelta):
            out.append({"reasoning_content": delta.text})
            continue
        if isinstance(delta, ContentDelta):
            out.append({"content": delta.text})
            continue
        head = {"index": delta.index, "id": delta.id, "type": "function"}
        out.append({"tool_calls": [{**head, "function": {"name": delta.call.name, "arguments": ""}}]})
        out.append({"tool_calls": [{"index": delta.index, "function": {"arguments": delta.call.arguments}}]})
    return out


# -- completions ---------------------------------------------------------------------------------
@router.post("/v1/completions", response_model=None)
async def completions(body: CompletionRequest, request: Request) -> Response:
    """Text completion (OpenAI's legacy shape), streamed as `text_completion` chunks with `stream`."""
    ctx: ServeContext = request.app.state.ctx
    ctx.check_model(body.model)
    body.check_supported()
    prompts = body.prompt_list()
    if not prompts:
        raise APIError("prompt must not be empty", param="prompt")
    ids = [await ctx.text_prompt(p) for p in prompts]
    completion_id = new_id("cmpl-")
    _, seed, streams = await ctx.start(
        body, ids, choices=body.n, id_prefix=completion_id, prompt_param="prompt"
    )
    tokenizer = ctx.engine.tokenizer
    echoes = [
        (p if isinstance(p, str) else tokenizer.decode(p)) if body.echo else ""
        for p in prompts
        for _ in range(body.n)
    ]
    head = {
        "id": completion_id,
        "object": "text_completion",
        "created": int(time.time()),
        "model": ctx.model_id,
        "system_fingerprint": FINGERPRINT,
        "seed": seed,
    }
    formatter = (
        LogprobFormatter(tokenizer, body.return_tokens_as_token_ids) if body.logprobs is not None else None
    )
    with_top = bool(body.logprobs)
    prompt_lengths = [len(p) for p in ids]
    if body.stream:
        include_usage = body.stream_options is not None and body.stream_options.include_usage
        chunks = _completion_chunks(
            ctx,
            streams,
            head,
            formatter,
            with_top,
            echoes,
            prompt_lengths,
            include_usage,
            body.return_token_ids,
        )
        return SSEResponse(chunks, on_close=lambda: ctx.bridge.release(streams))

    results = await run_whole(ctx, request, streams)
    choices = []
    for index, result in enumerate(results):
        assert result.done is not None
        echo = echoes[index]
        choice = {
            "index": index,
            "text": echo + result.done.text,
            "logprobs": formatter.legacy(result.tokens, len(echo), with_top) if formatter else None,
            "finish_reason": result.done.finish_reason,
        }
        if body.return_token_ids:  # vLLM's return_token_ids: the prompt's and the completion's ids
            choice["prompt_token_ids"] = list(ids[index // body.n])
            choice["token_ids"] = list(result.done.token_ids)
        choices.append(choice)
    dones = [r.done for r in results if r.done is not None]
    return JSONResponse(
        {**head, "choices": choices, "usage": usage_of(dones, prompt_lengths), **timings_of(dones)}
    )


async def _completion_chunks(
    ctx: ServeContext,
    streams: Sequence[RequestStream],
    head: dict[str, Any],
    formatter: LogprobFormatter | None,
    with_top: bool,
    echoes: Sequence[str],
    prompt_lengths: Sequence[int],
    include_usage: bool,
    token_ids: bool = False,
) -> AsyncIterator[bytes]:
    usage_field = {"usage": None} if include_usage else {}
    pending_ids: list[list[int]] = [[] for _ in streams]

    def chunk(index: int, text: str, finish: str | None, logprobs: dict[str, Any] | None) -> bytes:
        choice = {"index": index, "text": text, "logprobs": logprobs, "finish_reason": finish}
        if token_ids:  # vLLM's return_token_ids: the ids this chunk completes
            choice["token_ids"], pending_ids[index] = pending_ids[index], []
        return sse_data({**head, "choices": [choice], **usage_field})

    offsets = [len(e) for e in echoes]
    for index, echo in enumerate(echoes):
        if echo:
            yield chunk(index, echo, None, None)
    pending: list[list[TokenEvent]] = [[] for _ in streams]
    dones: list[DoneEvent] = []

    def logprobs_of(index: int) -> dict[str, Any] | None:
        if formatter is None:
            return None
        data = formatter.legacy(pending[index], offsets[index], with_top)
        pending[index] = []
        return data

    async with aclosing(ctx.bridge.events(streams)) as events:
        async for index, event in events:
            if isinstance(event, TokenEvent):
                pending[index].append(event)
                pending_ids[index].append(event.token_id)
                if event.text:
                    logprobs = logprobs_of(index)
                    offsets[index] += len(event.text)
                    yield chunk(index, event.text, None, logprobs)
                continue
            if event.finish_reason in ("error", "cancelled"):
                yield _stream_failure(ctx, event)
                yield DONE
                return
            dones.append(event)
            yield chunk(index, "", event.finish_reason, logprobs_of(index) if pending[index] else None)
    if include_usage:
        yield sse_data({**head, "choices": [], "usage": usage_of(dones, prompt_lengths)})
    yield DONE
