"""`infer bench --server URL`: the same tests against any OpenAI-compatible streaming endpoint, and
serving runs over a prompt dataset (`--dataset`) with Poisson arrivals, as `vllm bench serve` does.

Tokens are counted from the stream: every chunk that carries new text (chat `delta.content` or
`delta.tool_calls`, or completions `text`) counts as one token, which is what llama-server and
`infer serve` send; when the server reports `usage.completion_tokens` (asked for with
`stream_options.include_usage`) that count is the request's output tokens (vLLM may put several
tokens in a chunk). TTFT is the time to the first
such chunk. Prompts of about P tokens are built from a repeated common word (" the" is one token in
every mainstream BPE vocabulary); when the server reports `usage.prompt_tokens` that count is used for
prefill figures instead. Requests send `ignore_eos: true` (llama-server's, vLLM's and infer's
extension) so the server generates all N tokens. A dataset chat with `tools` sends them and its
`tool_choice`; its reply's calls count like text (a server that sends a call only once it is complete,
as `infer serve` does, puts its tokens in that call's chunks: `usage` then gives the count, and TTFT is
the time to the first content or call chunk).

A failed request (refused, an HTTP error with the server's message, a timeout, a stream cut before
`[DONE]`) is recorded on its trace with the server's words; the run goes on.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

import httpx

from infer.cli.bench.dataset import DatasetItem, arrival_offsets
from infer.cli.bench.stats import BenchResult, Trace, serving_sweep
from infer.cli.server_client import (
    RemoteError,
    ServerIdentity,
    auth_headers,
    base_url,
    discover,
    server_message,
    transport_message,
)

TIMEOUT_S = 600.0
ServerError = RemoteError
"""The server could not be reached or answered with an error (one line); the old name."""


def _prompt_text(n_tokens: int, index: int) -> str:
    """About `n_tokens` tokens of text, different from the first words for every request `index`: a
    server that keeps earlier prompts (llama-server's per-slot prompt cache) cannot skip the prefill
    that the benchmark means to measure."""
    return f"Request {index}. Continue:" + " the" * max(n_tokens - 6, 1)


class ServerBench:
    """Runs bench tests over HTTP with streaming."""

    def __init__(
        self,
        url: str,
        *,
        api: str = "chat",
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = TIMEOUT_S,
    ) -> None:
        self.base = base_url(url)
        self._sent = itertools.count()
        """Requests made so far: each gets its own prompt text."""
        self.api = api
        self.timeout = timeout
        self.headers = auth_headers(api_key)
        with httpx.Client(timeout=min(timeout, 30.0), headers=self.headers) as client:
            self.identity: ServerIdentity = discover(client, self.base, model)
        self.model = self.identity.model

    def _body(
        self, n_prompt: int, max_tokens: int, item: DatasetItem | None = None
    ) -> tuple[str, dict[str, Any]]:
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if self.api == "chat":
            messages = (
                item.as_messages()
                if item is not None
                else [{"role": "user", "content": _prompt_text(n_prompt, next(self._sent))}]
            )
            tools: dict[str, Any] = {}
            if item is not None and item.tools is not None:
                tools["tools"] = item.tools
                if item.tool_choice is not None:
                    tools["tool_choice"] = item.tool_choice
                if item.parallel_tool_calls is not None:
                    tools["parallel_tool_calls"] = item.parallel_tool_calls
            return "/chat/completions", {**common, "messages": messages, **tools}
        prompt = item.prompt if item is not None else _prompt_text(n_prompt, next(self._sent))
        return "/completions", {**common, "prompt": prompt}

    async def _one(
        self, client: httpx.AsyncClient, n_prompt: int, max_tokens: int, item: DatasetItem | None = None
    ) -> Trace:
        """One streamed request; any failure is recorded on the trace with the server's message."""
        path, body = self._body(n_prompt, max_tokens, item)
        trace = Trace(time.perf_counter(), prompt_tokens=n_prompt)
        finished = False
        try:
            async with client.stream("POST", self.base + path, json=body) as response:
                if response.status_code != 200:
                    trace.error = (
                        f"POST {path}: {server_message(response.status_code, await response.aread())}"
                    )
                    trace.done = time.perf_counter()
                    return trace
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        finished = True
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        trace.error = f"POST {path}: {server_message(200, data)}"
                        break
                    usage = chunk.get("usage") or {}
                    if usage.get("prompt_tokens"):
                        trace.prompt_tokens = int(usage["prompt_tokens"])
                    if isinstance(usage.get("completion_tokens"), int):
                        trace.reported_tokens = int(usage["completion_tokens"])
                    for choice in chunk.get("choices") or []:
                        if self.api == "chat":
                            delta = choice.get("delta") or {}
                            piece = delta.get("content") or delta.get("tool_calls")
                        else:
                            piece = choice.get("text")
                        if piece:
                            trace.token_times.append(time.perf_counter())
        except httpx.HTTPError as exc:
            trace.error = f"POST {path}: {transport_message(exc, self.timeout)} after {trace.tokens} token(s)"
        except ValueError:
            trace.error = f"POST {path}: a stream chunk is not JSON after {trace.tokens} token(s)"
        if trace.error is None and not finished:
            trace.error = f"POST {path}: the stream ended without [DONE] after {trace.tokens} token(s)"
        trace.done = time.perf_counter()
        return trace

    def _client(self, connections: int) -> httpx.AsyncClient:
        limits = httpx.Limits(max_connections=connections + 2)
        return httpx.AsyncClient(timeout=self.timeout, limits=limits, headers=self.headers)

    async def _many(self, concurrency: int, n_prompt: int, max_tokens: int) -> list[Trace]:
        async with self._client(concurrency) as client:
            return list(
                await asyncio.gather(*(self._one(client, n_prompt, max_tokens) for _ in range(concurrency)))
            )

    async def _serve(
        self,
        items: Sequence[DatasetItem],
        max_tokens: int,
        rate: float,
        burstiness: float,
        max_concurrency: int | None,
    ) -> tuple[float, list[Trace]]:
        """Send every item at its arrival time, at most `max_concurrency` in flight; (duration, traces)."""
        offsets = arrival_offsets(len(items), rate, burstiness)
        gate = asyncio.Semaphore(max_concurrency) if max_concurrency else None
        async with self._client(max_concurrency or len(items)) as client:
            start = time.perf_counter()

            async def one(item: DatasetItem, offset: float) -> Trace:
                await asyncio.sleep(max(0.0, start + offset - time.perf_counter()))
                limit = item.max_tokens or max_tokens
                if gate is None:
                    return await self._one(client, 0, limit, item)
                async with gate:
                    return await self._one(client, 0, limit, item)

            traces = list(await asyncio.gather(*(one(i, o) for i, o in zip(items, offsets, strict=True))))
        return time.perf_counter() - start, traces

    def serve(
        self,
        items: Sequence[DatasetItem],
        levels: Sequence[int | None],
        max_tokens: int,
        rate: float,
        burstiness: float,
        slo: dict[str, float],
        repetitions: int,
        warmup: bool,
        advance: Callable[[str], None],
    ) -> list[BenchResult]:
        """Serving runs over the dataset, `repetitions` per concurrency limit in `levels` (None:
        unlimited); the figures pool every repetition's requests over their summed durations."""

        def run(level: int | None, warm_up: bool, tag: str) -> tuple[float, list[Trace]]:
            if warm_up:
                return asyncio.run(self._serve(items[: max(level or 1, 1)], 2, float("inf"), 1.0, level))
            return asyncio.run(self._serve(items, max_tokens, rate, burstiness, level))

        return serving_sweep(
            run,
            levels=levels,
            num_prompts=len(items),
            max_tokens=max_tokens,
            rate=rate,
            burstiness=burstiness,
            slo=slo,
            repetitions=repetitions,
            warmup=warmup,
            advance=advance,
        )

    def _run_one(self, kind: str, shape: dict[str, int], concurrency: int) -> tuple[float, list[Trace]]:
        p, n, depth = shape["n_prompt"], shape["n_gen"], shape["depth"]
        if kind == "pp":
            traces = asyncio.run(self._many(1, p + depth, 1))
            t = traces[0]
            return ((t.prompt_tokens / t.ttft) if t.ttft else 0.0), traces
        if kind == "tg":
            traces = asyncio.run(self._many(1, max(depth, 4), n + 1))
            t = traces[0]
            span = t.token_times[-1] - t.token_times[0] if t.tokens > 1 else 0.0
            return (((t.tokens - 1) / span) if span > 0 else 0.0), traces
        if kind == "pg":
            traces = asyncio.run(self._many(1, p, n))
            t = traces[0]
            return (((t.prompt_tokens + t.tokens) / t.e2e) if t.e2e > 0 else 0.0), traces
        traces = asyncio.run(self._many(concurrency, p, n))
        wall = max(t.done for t in traces) - min(t.submitted for t in traces)
        return (sum(t.tokens for t in traces) / wall if wall > 0 else 0.0), traces

    def run(
        self,
        tests: list[tuple[str, str, dict[str, int]]],
        levels: list[int],
        conc_prompt: int,
        conc_gen: int,
        repetitions: int,
        warmup: bool,
        advance: Callable[[str], None],
    ) -> list[BenchResult]:
        """Run the planned tests and the concurrency sweep against the server."""
        plan = [(name, kind, shape, 1) for name, kind, shape in tests]
        plan += [
            (f"tg{conc_gen} c{c}", "conc", {"n_prompt": conc_prompt, "n_gen": conc_gen, "depth": 0}, c)
            for c in levels
        ]
        results: list[BenchResult] = []
        for name, kind, shape, concurrency in plan:
            if warmup:
                advance(f"{name} (warm-up)")
                warm_shape = {**shape, "n_gen": min(shape["n_gen"], 4)}
                self._run_one(kind, warm_shape, concurrency)
            samples: list[float] = []
            traces: list[Trace] = []
            for rep in range(repetitions):
                advance(f"{name} ({rep + 1}/{repetitions})")
                tps, got = self._run_one(kind, shape, concurrency)
                samples.append(tps)
                traces.extend(got)
            results.append(
                BenchResult(name, kind, samples=samples, traces=traces, concurrency=concurrency, **shape)
            )
        return results


__all__ = ["ServerBench", "ServerError"]
