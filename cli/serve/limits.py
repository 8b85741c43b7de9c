"""What one HTTP client may hold on `infer serve`: body bytes, time, and connections.

Two layers, because each bound has to act where the bytes are:
- `BodyLimit` (ASGI middleware) counts a request's body as it is read, so a chunked body (no
  `Content-Length`) is refused with 413 the moment the count passes the limit, and a body that stops
  arriving gets 408; nothing is buffered beyond the limit first.
- `GuardedH11Protocol` (the h11 protocol uvicorn runs, with a deadline and a cap added) closes a
  connection whose request headers are not complete `header_timeout_s` after they began (uvicorn has
  no header timeout: its keep-alive timer only starts after a first response), and answers 503 at
  once to a connection beyond `max_connections` (uvicorn's `limit_concurrency` acts only when a
  request's headers are complete, so it cannot bound clients that never finish them).
uvicorn's own `timeout_keep_alive` closes idle connections between requests, and h11's
`max_incomplete_event_size` bounds the bytes of an unfinished request head.

An answer given before the body was read (a 413 on `Content-Length`, a refused chunked body) closes
the connection lingering, as nginx and Apache do: a plain close with the client's unread bytes in the
socket makes the kernel send a reset, which drops whatever of the answer it had not yet sent (once
seen in CI: httpx read the 413's head, then lost its body to the reset).
"""

from __future__ import annotations

import asyncio
import json
import traceback
from dataclasses import dataclass
from typing import Any, ClassVar, cast

import h11
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import H11Protocol

from infer.cli.serve.errors import INVALID_REQUEST, SERVER_ERROR, error_body

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
"""Bodies larger than this are refused (413): at once when `Content-Length` says so, else as they arrive."""
LINGER_S = 2.0
"""How long a lingering close reads on (and discards) what the client still sends after the answer."""
LINGER_MAX_BYTES = 4 * 1024 * 1024
"""How many bytes a lingering close discards before it closes anyway."""


@dataclass(frozen=True)
class HttpLimits:
    """The per-connection bounds `infer serve` runs with (see the module docstring for who enforces each)."""

    header_timeout_s: float = 10.0
    """A request's headers must be complete this long after its first byte (or after connecting); so
    must an unread body that still arrives after the answer."""
    body_idle_timeout_s: float = 30.0
    """A request body that has not finished may pause this long between two reads."""
    keep_alive_timeout_s: int = 5
    """An idle connection between requests is closed after this long (uvicorn's `timeout_keep_alive`)."""
    max_connections: int = 2048
    """Open connections at once; one more gets 503 `server_overloaded` and is closed."""
    max_header_bytes: int = 16 * 1024
    """The largest unfinished request head (h11's `max_incomplete_event_size`); more is a 400."""

    def uvicorn_options(self) -> dict[str, Any]:
        """The `uvicorn.Config` keyword arguments that put these bounds in place."""
        return {
            "http": guarded_protocol(self),
            "timeout_keep_alive": self.keep_alive_timeout_s,
            "h11_max_incomplete_event_size": self.max_header_bytes,
        }


def _raw_response(status: int, reason: str, body: dict[str, Any], extra: str = "") -> bytes:
    """A whole HTTP/1.1 response with a JSON body that closes the connection, for the protocol layer
    (no request cycle exists yet, so h11 cannot frame it)."""
    data = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n"
        f"{extra}connection: close\r\n\r\n"
    )
    return head.encode("latin-1") + data


class _LingeringTransport:
    """The connection's transport as uvicorn sees it: `close()` while the client still owes request
    body bytes sends the answer's end and a FIN (`write_eof`), then reads on, discarding, until the
    client closes, `LINGER_S` pass or `LINGER_MAX_BYTES` arrive; every other close is immediate."""

    def __init__(self, transport: asyncio.Transport, protocol: GuardedH11Protocol) -> None:
        self._transport = transport
        self._protocol = protocol
        self._timer: asyncio.TimerHandle | None = None
        self.lingering = False
        self.discarded = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)

    def is_closing(self) -> bool:
        """Closing, lingering included (uvicorn must neither answer nor keep the connection alive)."""
        return self.lingering or self._transport.is_closing()

    def close(self) -> None:
        """Close, lingering if the client is still sending a body no one will read."""
        if self.is_closing():
            return
        owes_body = self._protocol.conn.their_state is h11.SEND_BODY
        if not owes_body or not self._transport.can_write_eof():
            self._transport.close()
            return
        self.lingering = True
        self._transport.write_eof()  # after what is buffered: the whole answer goes out first
        self._transport.resume_reading()  # uvicorn paused it once the unread body filled its buffer
        self._timer = self._protocol.loop.call_later(LINGER_S, self.close_now)

    def discard(self, data: bytes) -> None:
        """Drop bytes that arrived while lingering; close once there have been too many."""
        self.discarded += len(data)
        if self.discarded > LINGER_MAX_BYTES:
            self.close_now()

    def close_now(self) -> None:
        """Close at once (a deadline passed, or the lingering ended)."""
        self.cancel_timer()
        self._transport.close()

    def cancel_timer(self) -> None:
        """Stop the lingering timer (the connection is gone)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a deadline on request headers and a cap on open connections.

    The deadline is armed when a connection opens and when the first bytes of a later request arrive,
    and cleared once h11 has the whole request head; bytes sent one at a time do not move it. The same
    deadline bounds a body that keeps coming after the answer was sent.
    """

    limits: ClassVar[HttpLimits] = HttpLimits()

    _header_deadline: asyncio.TimerHandle | None = None
    _lingering: _LingeringTransport

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        """Count the connection; beyond the cap answer 503 and close, else start the header deadline."""
        cap = self.limits.max_connections
        full = len(self.server_state.connections) >= cap or len(self.server_state.tasks) >= cap
        self._lingering = _LingeringTransport(transport, self)
        super().connection_made(cast(asyncio.Transport, self._lingering))
        if full:
            body = error_body(
                f"the server has {cap} connections open, its limit; try again later",
                type=SERVER_ERROR,
                code="server_overloaded",
            )
            transport.write(_raw_response(503, "Service Unavailable", body, "retry-after: 1\r\n"))
            transport.close()
            return
        self._arm_header_deadline()

    def data_received(self, data: bytes) -> None:
        """Feed h11, then keep the deadline only while the client owes the rest of a request."""
        if self._lingering.lingering:
            self._lingering.discard(data)
            return
        super().data_received(data)
        if self._waiting_on_client() and not self.transport.is_closing():
            self._arm_header_deadline()  # a new request has begun (or the first is still coming)
        else:
            self._clear_header_deadline()

    def _waiting_on_client(self) -> bool:
        """A request head still incomplete, or a body still trickling in after its answer was sent (no
        route reads it, and uvicorn's keep-alive timer stops at the first byte of it)."""
        their, ours = self.conn.their_state, self.conn.our_state
        return their is h11.IDLE or (ours is h11.DONE and their is h11.SEND_BODY)

    def connection_lost(self, exc: Exception | None) -> None:
        """Drop the deadline and the lingering timer with the connection."""
        self._clear_header_deadline()
        self._lingering.cancel_timer()
        super().connection_lost(exc)

    def _arm_header_deadline(self) -> None:
        if self._header_deadline is None:
            self._header_deadline = self.loop.call_later(self.limits.header_timeout_s, self._headers_late)

    def _clear_header_deadline(self) -> None:
        if self._header_deadline is not None:
            self._header_deadline.cancel()
            self._header_deadline = None

    def _headers_late(self) -> None:
        self._header_deadline = None
        if not self._waiting_on_client() or self.transport.is_closing():
            return
        if self.conn.their_state is h11.IDLE:  # no answer was sent on this request yet: say why
            seconds = self.limits.header_timeout_s
            body = error_body(
                f"the request headers did not arrive within {seconds:g} s", code="request_timeout"
            )
            self.transport.write(_raw_response(408, "Request Timeout", body))
        self._lingering.close_now()  # a deadline: no lingering past it


def guarded_protocol(limits: HttpLimits) -> type[GuardedH11Protocol]:
    """The protocol class to give `uvicorn.Config(http=...)`: `GuardedH11Protocol` with `limits`."""
    return type("GuardedH11Protocol", (GuardedH11Protocol,), {"limits": limits})


class _Refused(Exception):
    """Raised into the app from `receive` once the body is refused; `BodyLimit` answers instead."""


class _BodyGuard:
    """One request's counting `receive` and the `send` that lets the refusal replace the app's answer."""

    def __init__(self, receive: Receive, send: Send, max_bytes: int, idle_timeout_s: float) -> None:
        self._receive = receive
        self._send = send
        self.max_bytes = max_bytes
        self.idle_timeout_s = idle_timeout_s
        self.received = 0
        self.body_done = False
        self.refusal: tuple[int, dict[str, Any]] | None = None
        self.response_started = False
        self.raised: list[_Refused] = []

    def refuse(self, status: int, message: str, code: str) -> _Refused:
        """Remember the answer to give, and the exception that stops the app's reading."""
        self.refusal = (status, error_body(message, type=INVALID_REQUEST, code=code))
        return self._refused(message)

    def _refused(self, message: str) -> _Refused:
        self.raised.append(_Refused(message))
        return self.raised[-1]

    def forget_tracebacks(self) -> None:
        """Free what the app had read. The app keeps the exceptions raised into it in a reference cycle
        (FastAPI chains them to its own 400), and their tracebacks hold the frame with the body's
        chunks: up to the limit, kept until the cyclic collector happens to run (three refused 64 MiB
        bodies held 190 MB). Clearing those frames frees the chunks at once."""
        for exc in self.raised:
            if exc.__traceback__ is not None:
                traceback.clear_frames(exc.__traceback__)
                exc.__traceback__ = None

    async def receive(self) -> Message:
        """The next message, counted; raises `_Refused` once the body passes the limit or stalls."""
        if self.refusal is not None:
            raise self._refused("the request body was refused")
        if self.body_done:  # past the body only `http.disconnect` comes, whenever it comes
            return await self._receive()
        try:
            message = await asyncio.wait_for(self._receive(), self.idle_timeout_s)
        except asyncio.TimeoutError:
            raise self.refuse(
                408, f"no request body bytes arrived for {self.idle_timeout_s:g} s", "request_timeout"
            ) from None
        if message["type"] != "http.request":
            self.body_done = True
            return message
        self.received += len(message.get("body", b""))
        if self.received > self.max_bytes:
            raise self.refuse(
                413,
                f"the request body is over {self.max_bytes} bytes, the limit",
                "request_too_large",
            )
        self.body_done = not message.get("more_body", False)
        return message

    async def send(self, message: Message) -> None:
        """Pass the app's answer on, unless the body was refused before it began."""
        if self.refusal is not None and not self.response_started:
            return  # the app's answer to a body it could not read (a 400 or 500); the refusal replaces it
        if message["type"] == "http.response.start":
            self.response_started = True
        await self._send(message)


class BodyLimit:
    """ASGI middleware: a request body of more than `max_body_bytes` is 413 `request_too_large`, one
    whose bytes stop for `idle_timeout_s` is 408 `request_timeout`; either closes the connection.

    `Content-Length` over the limit is refused before any byte is read; otherwise the bytes are counted
    as the app reads them (chunked bodies included), so the app never holds more than the limit.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        idle_timeout_s: float = HttpLimits.body_idle_timeout_s,
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.idle_timeout_s = idle_timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Run the app on the counted body; answer the refusal if there is one."""
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        guard = _BodyGuard(receive, send, self.max_body_bytes, self.idle_timeout_s)
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            guard.refuse(
                413,
                f"the request body is {declared} bytes; the limit is {self.max_body_bytes}",
                "request_too_large",
            )
        else:
            try:
                await self.app(scope, guard.receive, guard.send)
            except Exception:
                if guard.refusal is None:
                    raise
            finally:
                guard.forget_tracebacks()
        if guard.refusal is not None and not guard.response_started:
            status, body = guard.refusal
            await send_json(send, status, body, {"connection": "close"})


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name.lower() == b"content-length":
            text = value.decode("latin-1").strip()
            return int(text) if text.isdigit() else None
    return None


async def send_json(send: Send, status: int, body: dict[str, Any], extra: dict[str, str]) -> None:
    """Send a whole JSON response through ASGI `send` (middleware answers before any route)."""
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in extra.items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
