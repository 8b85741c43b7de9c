"""`infer bench --server URL`: the same tests against any OpenAI-compatible streaming endpoint.

Tokens are counted from the stream: every chunk that carries new text (chat `delta.content`, or
completions `text`) counts as one token, which is what llama-server and `infer serve` send. TTFT is the
time to the first such chunk. Prompts of about P tokens are built from a repeated common word (" the"
is one token in every mainstream BPE vocabulary); when the server reports `usage.prompt_tokens` (asked
for with `stream_options.include_usage`) that count is used for prefill figures instead. Decode tests
send `ignore_eos: true` (llama-server's and infer's extension) so the server generates all N tokens.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from infer.cli.bench.stats import BenchResult, Trace

TIMEOUT_S = 600.0


class ServerError(Exception):
    """The server could not be reached or answered with an error (one line)."""


def _prompt_text(n_tokens: int) -> str:
    return "Continue:" + " the" * max(n_tokens - 3, 1)


class ServerBench:
    """Runs bench tests over HTTP with streaming."""

    def __init__(self, base_url: str, *, api: str = "chat", model: str | None = None) -> None:
        self.base = base_url.rstrip("/")
        if not self.base.endswith("/v1"):
            self.base += "/v1"
        self.api = api
        self.model = model or self._discover_model()

    def _discover_model(self) -> str:
        try:
            response = httpx.get(f"{self.base}/models", timeout=30)
            response.raise_for_status()
            models = response.json().get("data") or []
        except (httpx.HTTPError, ValueError) as exc:
            raise ServerError(f"--server {self.base}: cannot list models ({exc})") from None
        return str(models[0]["id"]) if models else "default"

    def _body(self, n_prompt: int, max_tokens: int) -> tuple[str, dict[str, Any]]:
        text = _prompt_text(n_prompt)
        common: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
            "ignore_eos": True,
        }
        if self.api == "chat":
            return "/chat/completions", {**common, "messages": [{"role": "user", "content": text}]}
        return "/completions", {**common, "prompt": text}

    async def _one(self, client: httpx.AsyncClient, n_prompt: int, max_tokens: int) -> Trace:
        path, body = self._body(n_prompt, max_tokens)
        trace = Trace(time.perf_counter(), prompt_tokens=n_prompt)
        try:
            async with client.stream("POST", self.base + path, json=body) as response:
                if response.status_code != 200:
                    detail = (await response.aread()).decode(errors="replace")[:300]
                    raise ServerError(
                        f"{self.base}{path}: HTTP {response.status_code}: {' '.join(detail.split())}"
                    )
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if chunk.get("error"):
                        trace.error = str(chunk["error"])
                        break
                    usage = chunk.get("usage") or {}
                    if usage.get("prompt_tokens"):
                        trace.prompt_tokens = int(usage["prompt_tokens"])
                    for choice in chunk.get("choices") or []:
                        piece = (
                            (choice.get("delta") or {}).get("content")
                            if self.api == "chat"
                            else choice.get("text")
                        )
                        if piece:
                            trace.token_times.append(time.perf_counter())
        except httpx.HTTPError as exc:
            raise ServerError(f"{self.base}{path}: {type(exc).__name__}: {exc}") from None
        trace.done = time.perf_counter()
        return trace

    async def _many(self, concurrency: int, n_prompt: int, max_tokens: int) -> list[Trace]:
        limits = httpx.Limits(max_connections=concurrency + 2)
        async with httpx.AsyncClient(timeout=TIMEOUT_S, limits=limits) as client:
            return list(
                await asyncio.gather(*(self._one(client, n_prompt, max_tokens) for _ in range(concurrency)))
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
