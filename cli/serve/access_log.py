"""The server's access log: one line on stderr per HTTP request, and one at shutdown.

A request's line names the method, path, status, client, the prompt and completion tokens, the
time to first token and the total time (`POST /v1/chat/completions 200 127.0.0.1:5123 prompt 23
completion 12 ttft 118 ms total 482 ms finish stop`), like uvicorn's and llama-server's access logs
with the figures a user of an inference server asks about. `--log-format json` writes each line as
one JSON object instead, `--quiet` writes none (the start-up and shutdown lines stay).

:class:`AccessLog` is ASGI middleware: it times the request and reads the status; the engine's
DoneEvents reach it through :func:`note_done`, which the bridge calls for every DoneEvent it hands to
a route, and a context variable the middleware sets for the request's task (tasks a route starts
copy it, and the record they see is the same object). The engine itself never prints.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Literal, TextIO

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.engine import DoneEvent

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")


@dataclass
class RequestRecord:
    """What one HTTP request did in the engine (each of its `n` choices adds its DoneEvent)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    finish_reasons: list[str] = field(default_factory=list)

    def add(self, done: DoneEvent) -> None:
        """Count one finished engine request (the prompt is shared by a request's choices)."""
        self.prompt_tokens = max(self.prompt_tokens, done.usage.prompt_tokens)
        self.completion_tokens += done.usage.completion_tokens
        if done.usage.completion_tokens:
            ttft = done.timings.ttft_s
            self.ttft_s = ttft if self.ttft_s is None else min(self.ttft_s, ttft)
        self.finish_reasons.append(done.finish_reason)


_current: contextvars.ContextVar[RequestRecord | None] = contextvars.ContextVar("infer_access", default=None)


def note_done(done: DoneEvent) -> None:
    """Add `done` to the record of the HTTP request being served in this context (if any)."""
    record = _current.get()
    if record is not None:
        record.add(done)


@dataclass
class AccessStats:
    """Totals over the server's life, for the shutdown line."""

    requests: int = 0
    completion_tokens: int = 0


class AccessLog:
    """ASGI middleware writing one line per HTTP request to `stream` (stderr), unless `quiet`."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        stats: AccessStats,
        log_format: LogFormat = "text",
        quiet: bool = False,
        stream: TextIO | None = None,
    ) -> None:
        self.app = app
        self.stats = stats
        self.log_format = log_format
        self.quiet = quiet
        self.stream = stream

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        record = RequestRecord()
        token = _current.set(record)
        status = 500  # what the client gets if the app fails before answering

        async def watching_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, watching_send)
        finally:
            _current.reset(token)
            self.stats.requests += 1
            self.stats.completion_tokens += record.completion_tokens
            if not self.quiet:
                total_s = time.perf_counter() - started
                self._write(format_line(scope, status, record, total_s, self.log_format))

    def _write(self, line: str) -> None:
        # stderr closed or gone: the request is served all the same
        with contextlib.suppress(OSError, ValueError):
            print(line, file=self.stream or sys.stderr, flush=True)


def format_line(
    scope: Scope, status: int, record: RequestRecord, total_s: float, log_format: LogFormat
) -> str:
    """One access-log line (the module docstring shows the text form)."""
    client = scope.get("client")
    where = f"{client[0]}:{client[1]}" if client else "-"
    ttft_ms = None if record.ttft_s is None else round(record.ttft_s * 1000, 1)
    finish = ",".join(sorted(set(record.finish_reasons))) or None
    if log_format == "json":
        entry: dict[str, Any] = {
            "event": "request",
            "method": scope.get("method"),
            "path": scope.get("path"),
            "status": status,
            "client": where,
            "prompt_tokens": record.prompt_tokens,
            "completion_tokens": record.completion_tokens,
            "ttft_ms": ttft_ms,
            "total_ms": round(total_s * 1000, 1),
            "finish_reason": finish,
        }
        return json.dumps(entry)
    line = f"infer serve: {scope.get('method')} {scope.get('path')} {status} {where}"
    if record.finish_reasons:
        line += f" prompt {record.prompt_tokens} completion {record.completion_tokens}"
        if ttft_ms is not None:
            line += f" ttft {ttft_ms:.0f} ms"
    line += f" total {total_s * 1000:.0f} ms"
    if finish:
        line += f" finish {finish}"
    return line


def shutdown_line(
    stats: AccessStats, in_flight: int, cancelled: int, uptime_s: float, log_format: LogFormat
) -> str:
    """The line at shutdown: what was in flight when it began, how much of it finished and how much
    the grace period cancelled, and the totals served."""
    if log_format == "json":
        entry = {
            "event": "shutdown",
            "in_flight": in_flight,
            "drained": in_flight - cancelled,
            "cancelled": cancelled,
            "requests": stats.requests,
            "completion_tokens": stats.completion_tokens,
            "uptime_s": round(uptime_s, 1),
        }
        return json.dumps(entry)
    return (
        f"infer serve: shut down: {in_flight} engine requests in flight, {in_flight - cancelled} finished, "
        f"{cancelled} cancelled; served {stats.requests} HTTP requests, {stats.completion_tokens} tokens "
        f"in {uptime_s:.0f} s"
    )


__all__ = [
    "LOG_FORMATS",
    "AccessLog",
    "AccessStats",
    "LogFormat",
    "RequestRecord",
    "format_line",
    "note_done",
    "shutdown_line",
]
