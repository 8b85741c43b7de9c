"""The consumer side of a request: a sync iterator and an async iterator over the same events."""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass

from infer.engine.runtime.events import DoneEvent, Event, TokenEvent


@dataclass(frozen=True)
class Completion:
    """A finished request gathered from its events."""

    text: str
    tokens: tuple[TokenEvent, ...]
    done: DoneEvent

    @property
    def token_ids(self) -> tuple[int, ...]:
        """Every generated token id."""
        return self.done.token_ids


class RequestStream:
    """Events of one request, in order, ending with exactly one DoneEvent.

    Iterating synchronously drives the engine's step loop from the caller's thread when no
    background loop runs (so each token is yielded before the next is computed); with a background
    loop it just waits for events. `async for` needs the background loop. Leaving either iteration
    early cancels the request.
    """

    def __init__(
        self,
        request_id: str,
        drive: Callable[[Callable[[], bool]], bool],
        background: Callable[[], bool],
        on_cancel: Callable[[], None] = lambda: None,
    ) -> None:
        self.request_id = request_id
        self._on_cancel = on_cancel
        self._queue: queue.Queue[Event] = queue.Queue()
        self._drive = drive
        self._background = background
        self._cancel = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._done: DoneEvent | None = None

    # -- producer side (engine thread) ---------------------------------------------------------
    def push(self, event: Event) -> None:
        """Deliver an event (called by the engine only)."""
        self._queue.put(event)
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            try:
                loop.call_soon_threadsafe(wake.set)
            except RuntimeError:  # the consumer's loop closed; nobody is listening any more
                self._cancel.set()

    @property
    def cancel_requested(self) -> bool:
        """Whether a consumer asked to stop (checked by the engine each step)."""
        return self._cancel.is_set()

    # -- consumer side -------------------------------------------------------------------------
    def cancel(self) -> None:
        """Ask the engine to stop this request; safe from any thread. A DoneEvent(cancelled) follows
        and the KV slot is freed at once (or by the step in progress, when one is running)."""
        self._cancel.set()
        if not self._background():
            self._on_cancel()

    def _has_event(self) -> bool:
        return not self._queue.empty()

    def _next_sync(self) -> Event:
        while True:
            try:
                return self._queue.get_nowait()
            except queue.Empty:
                pass
            if self._background():
                try:
                    return self._queue.get(timeout=0.5)
                except queue.Empty:
                    continue
            if (
                not self._drive(self._has_event) and self._queue.empty()
            ):  # a cancel may finish us in a no-work step
                # No step could run and nothing is queued for us: the engine lost this request.
                raise RuntimeError(f"{self.request_id}: engine has no work but the request is not done")

    def __iter__(self) -> Iterator[Event]:
        finished = False
        try:
            while True:
                event = self._next_sync()
                yield event
                if isinstance(event, DoneEvent):
                    self._done = event
                    finished = True
                    return
        finally:
            if not finished:
                self.cancel()

    async def __aiter__(self) -> AsyncIterator[Event]:
        if self._wake is None:
            self._wake = asyncio.Event()
            self._loop = asyncio.get_running_loop()
        finished = False
        try:
            while True:
                try:
                    event = self._queue.get_nowait()
                except queue.Empty:
                    await self._wake.wait()
                    self._wake.clear()
                    continue
                yield event
                if isinstance(event, DoneEvent):
                    self._done = event
                    finished = True
                    return
        finally:
            if not finished:
                self.cancel()

    def result(self) -> Completion:
        """Consume every event and return the completion."""
        tokens = [event for event in self if isinstance(event, TokenEvent)]
        assert self._done is not None
        return Completion(self._done.text, tuple(tokens), self._done)
