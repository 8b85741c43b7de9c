"""The async side of the engine: admission, merged event streams for `n` choices, cancellation, and
the graceful-shutdown sequence.

The engine's step loop runs in its own thread (`Engine.start()`); each request's `RequestStream`
wakes the asyncio loop for every event. This module keeps track of what is in flight so a client
that disconnects, or a SIGTERM, cancels exactly the engine requests it should.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import TypeVar

from fastapi import Request as HTTPRequest

from infer.cli.serve.access_log import note_done
from infer.cli.serve.errors import SERVER_ERROR, APIError
from infer.engine import DoneEvent, Engine, EngineBusy, Event, Request, RequestStream

T = TypeVar("T")

SHUTDOWN_MESSAGE = "the server is shutting down and cancelled this request"

RETRY_AFTER = {"Retry-After": "5"}
"""Sent with every 503: a client (or load balancer) should retry, on this server's successor."""


class EngineBridge:
    """Submits requests to a running engine and hands their events to asyncio code.

    `admitting` turns False when shutdown begins: new requests get 503 while the ones in flight
    finish (or are cancelled when the grace period ends).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.admitting = True
        self.shutting_down = False
        """True once shutdown began; a request the server cancels then says so in its error."""
        self._in_flight: set[RequestStream] = set()
        self.in_flight_at_shutdown = 0
        """Engine requests in flight when shutdown began (for the shutdown line)."""
        self._cancelled_in_shutdown: set[RequestStream] = set()

    @property
    def in_flight(self) -> int:
        """Engine requests submitted through this bridge and not finished yet."""
        return len(self._in_flight)

    def submit(self, requests: Sequence[Request]) -> list[RequestStream]:
        """Submit every request (all or none: a RequestError on one cancels the ones before it).

        Raises APIError 503 once shutdown has begun or when the engine's waiting queue is full
        (`max_queue`, with Retry-After), and lets `RequestError` through for the route.
        """
        if not self.admitting:
            raise APIError(
                "the server is shutting down and accepts no new requests",
                status=503,
                type=SERVER_ERROR,
                code="server_shutting_down",
                headers=RETRY_AFTER,
            )
        streams: list[RequestStream] = []
        try:
            for request in requests:
                streams.append(self.engine.submit(request))
        except BaseException as exc:
            for stream in streams:
                stream.cancel()
            if isinstance(exc, EngineBusy):  # load shed: the queue is full, not the request wrong
                raise APIError(
                    f"the server is overloaded: {exc}",
                    status=503,
                    type=SERVER_ERROR,
                    code="server_overloaded",
                    headers={"Retry-After": str(exc.retry_after_s)},
                ) from None
            raise
        self._in_flight.update(streams)
        return streams

    def release(self, streams: Sequence[RequestStream]) -> None:
        """Cancel whatever of `streams` is still running and forget them (safe to call twice)."""
        for stream in streams:
            stream.cancel()  # a no-op for a finished request: the engine no longer holds it
            self._in_flight.discard(stream)

    async def events(self, streams: Sequence[RequestStream]) -> AsyncIterator[tuple[int, Event]]:
        """(choice index, event) from every stream as they arrive, until each has sent its DoneEvent.

        Leaving early (an exception, a cancelled task, `aclose()`) cancels the remaining requests.
        """
        if len(streams) == 1:  # the common case needs no tasks or queue
            try:
                async for event in streams[0]:
                    if isinstance(event, DoneEvent):
                        note_done(event)  # the access log's figures for this HTTP request
                    yield 0, event
            finally:
                self.release(streams)
            return
        queue: asyncio.Queue[tuple[int, Event]] = asyncio.Queue()

        async def pump(index: int, stream: RequestStream) -> None:
            async for event in stream:
                queue.put_nowait((index, event))

        tasks = [asyncio.create_task(pump(i, s)) for i, s in enumerate(streams)]
        remaining = len(streams)
        try:
            while remaining:
                index, event = await queue.get()
                if isinstance(event, DoneEvent):
                    remaining -= 1
                    note_done(event)
                yield index, event
        finally:
            for task in tasks:
                task.cancel()
            self.release(streams)

    def cancel_all(self) -> None:
        """Cancel every request in flight (the end of the shutdown grace period)."""
        for stream in list(self._in_flight):
            stream.cancel()
            if self.shutting_down:
                self._cancelled_in_shutdown.add(stream)

    @property
    def cancelled_in_shutdown(self) -> int:
        """Engine requests the end of the shutdown grace period cancelled."""
        return len(self._cancelled_in_shutdown)

    def begin_shutdown(self, loop: asyncio.AbstractEventLoop, grace_seconds: float) -> None:
        """Stop admitting now; cancel whatever still runs after `grace_seconds`.

        Safe to call from a signal handler: the timer is scheduled on `loop` thread-safely.
        """
        self.admitting = False
        if not self.shutting_down:
            self.in_flight_at_shutdown = len(self._in_flight)
        self.shutting_down = True

        def schedule() -> None:
            loop.call_later(grace_seconds, self.cancel_all)

        with contextlib.suppress(RuntimeError):  # the loop already closed: nothing left to cancel
            loop.call_soon_threadsafe(schedule)


async def until_disconnect(request: HTTPRequest, work: Awaitable[T], on_disconnect: Callable[[], None]) -> T:
    """Await `work`, but if the client disconnects first call `on_disconnect` and cancel it.

    Non-streaming routes use this so a client that gives up frees its engine requests at once
    instead of when generation would have ended.
    """
    task = asyncio.ensure_future(work)

    async def watch() -> None:
        while True:
            message = await request.receive()
            if message["type"] == "http.disconnect":
                return

    watcher = asyncio.ensure_future(watch())
    try:
        done, _ = await asyncio.wait({task, watcher}, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            return task.result()
        on_disconnect()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        raise APIError("the client disconnected", status=499, code="client_disconnected")
    finally:
        watcher.cancel()
        if not task.done():
            on_disconnect()
            task.cancel()
