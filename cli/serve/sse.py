"""Server-Sent Events framing, JSON that never contains NaN/Infinity, and a streaming response that
notices a client disconnect at once."""

from __future__ import annotations

import contextlib
import json
import math
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from starlette.responses import StreamingResponse
from starlette.types import Receive, Scope, Send

DONE = b"data: [DONE]\n\n"
"""The chat/completions stream terminator OpenAI sends."""


def json_safe(value: Any) -> Any:
    """`value` with every non-finite float replaced by None (JSON has no -Infinity or NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def finite_or_none(value: float | None) -> float | None:
    """A log-probability for JSON: -inf (a token the model gives no mass) becomes null."""
    return value if value is not None and math.isfinite(value) else None


def dumps(value: Any) -> str:
    """Compact, strictly valid JSON (non-finite floats become null)."""
    try:
        return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except ValueError:  # only reached when a non-finite float slipped through; rare, so walk lazily
        return json.dumps(json_safe(value), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def sse_data(value: Any) -> bytes:
    """One `data:` event (chat/completions streams)."""
    return f"data: {dumps(value)}\n\n".encode()


def sse_event(event: str, value: Any) -> bytes:
    """One named event with a data line (the Responses API's `event: response.output_text.delta`)."""
    return f"event: {event}\ndata: {dumps(value)}\n\n".encode()


class SSEResponse(StreamingResponse):
    """A `text/event-stream` response that runs `on_close` however the stream ends.

    Starlette only notices a disconnect on the next write under ASGI 2.4, and never closes the body
    iterator when the write fails. Here a second task listens for `http.disconnect` the whole time,
    so a client that goes away cancels the body at once, and `on_close` (which cancels the engine
    requests and frees their KV slots) runs on success, error and disconnect alike.
    """

    media_type = "text/event-stream"

    def __init__(self, content: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(
            content,
            headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
            media_type=self.media_type,
        )
        self._on_close = on_close
        self._content = content

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:

                async def stream_then_stop() -> None:
                    with contextlib.suppress(OSError):  # the client went away mid-write
                        await self.stream_response(send)
                    group.cancel_scope.cancel()

                group.start_soon(stream_then_stop)
                await self.listen_for_disconnect(receive)
                group.cancel_scope.cancel()
        finally:
            self._on_close()
            aclose = getattr(self._content, "aclose", None)
            if aclose is not None:
                with anyio.CancelScope(shield=True):
                    await aclose()
