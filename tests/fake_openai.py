"""A small fake OpenAI-compatible server for tests: fixed answers, and the failures a real deployment
shows (an HTTP 500 or 400 with an OpenAI error body, an answer or a stream cut half-way, a slow
answer). It listens on 127.0.0.1 only, in a thread; `FakeServer.mode` picks the behaviour.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FIXED_IDS = [5, 6, 7]
FIXED_TEXT = "abc"
VERSION_HEADER = ("x-fake-version", "1.2.3")
CALL_TOKENS = 9
"""`usage.completion_tokens` of a streamed reply that is one tool call (its two chunks hold them all)."""


@dataclass
class FakeServer:
    """The running fake: its URL, the behaviour to show, and the bodies it received."""

    url: str = ""
    mode: str = "ids"
    """ids | logprobs | text | 500 | 400 | cut | slow | unstable (the last id changes every call)."""
    owner: str | None = None
    """`owned_by` of the listed model (None: not written), which tells the engine apart."""
    ids: list[int] = field(default_factory=lambda: list(FIXED_IDS))
    gaps: list[float] = field(default_factory=lambda: [3.0, 3.0, 3.0])
    """Per step: the logprob gap between the chosen token and the runner-up (mode logprobs)."""
    runner_ups: list[int] = field(default_factory=lambda: [100, 101, 102])
    bodies: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[dict[str, Any]] | None = None
    """Chat answers to requests with `tools` carry these calls (finish reason `tool_calls`; streamed as
    `infer serve` streams them: the id and name, then the arguments); None: plain text."""


def _completion(fake: FakeServer, chat: bool, body: dict[str, Any]) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": "length"}
    if chat and fake.tool_calls is not None and body.get("tools"):
        choice["message"] = {"role": "assistant", "content": None, "tool_calls": fake.tool_calls}
        choice["finish_reason"] = "tool_calls"
    elif chat:
        choice["message"] = {"role": "assistant", "content": FIXED_TEXT}
    else:
        choice["text"] = FIXED_TEXT
    if fake.mode == "ids":
        choice["token_ids"] = list(fake.ids)
    elif fake.mode == "unstable":  # a server whose answer depends on what it ran before
        choice["token_ids"] = [*fake.ids[:-1], fake.ids[-1] + len(fake.bodies)]
    elif fake.mode == "logprobs":
        choice["logprobs"] = {
            "content": [
                {
                    "token": f"token_id:{tid}",
                    "logprob": -0.1,
                    "top_logprobs": [
                        {"token": f"token_id:{tid}", "logprob": -0.1},
                        {"token": f"token_id:{other}", "logprob": -0.1 - gap},
                    ],
                }
                for tid, gap, other in zip(fake.ids, fake.gaps, fake.runner_ups, strict=True)
            ]
        }
    return {
        "id": "cmpl-fake",
        "object": "chat.completion" if chat else "text_completion",
        "model": "fake-model",
        "system_fingerprint": "fake-build-1",
        "choices": [choice],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(fake.ids), "total_tokens": 3 + len(fake.ids)},
    }


def _handler(fake: FakeServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:  # quiet
            pass

        def _json(self, status: int, body: Any, extra: tuple[str, str] | None = None) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if extra:
                self.send_header(*extra)
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            if self.path == "/v1/models":
                card = {"id": "fake-model", **({"owned_by": fake.owner} if fake.owner else {})}
                self._json(200, {"object": "list", "data": [card]}, VERSION_HEADER)
            else:
                self._json(404, {"error": {"message": "no such route", "type": "invalid_request_error"}})

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length", "0"))
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.bodies.append(body)
            chat = self.path.endswith("/chat/completions")
            if fake.mode == "500":
                self._json(500, {"error": {"message": "engine exploded", "type": "server_error"}})
                return
            if fake.mode == "400":
                error = {"message": "temperature is out of range", "type": "invalid_request_error"}
                self._json(400, {"error": {**error, "param": "temperature"}})
                return
            if fake.mode == "slow":
                time.sleep(3)
            if body.get("stream"):
                calls = fake.tool_calls if chat and body.get("tools") else None
                self._stream(chat, cut=fake.mode == "cut", calls=calls)
                return
            data = json.dumps(_completion(fake, chat, body)).encode()
            if fake.mode == "cut":  # promise the whole body, send half, hang up
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            self._json(200, json.loads(data))

        def _stream(self, chat: bool, cut: bool, calls: list[dict[str, Any]] | None = None) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()

            def send(payload: str) -> None:
                data = f"data: {payload}\n\n".encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()

            pieces: list[Any] = ["a", "b", "c", "d"]
            if calls is not None:  # one call: its id and name, then its arguments, then the finish
                (call,) = calls
                head = {"index": 0, "id": call["id"], "type": "function"}
                named = {**head, "function": {"name": call["function"]["name"], "arguments": ""}}
                pieces = [[named], [{"index": 0, "function": {"arguments": call["function"]["arguments"]}}]]
            for index, piece in enumerate(pieces):
                if cut and index == len(pieces) // 2:
                    self.close_connection = True  # no final chunk: the stream is cut half-way
                    return
                key = "tool_calls" if calls is not None else "content"
                delta = {"delta": {key: piece}} if chat else {"text": piece}
                finish = None
                if index == len(pieces) - 1:  # as real servers end a stream
                    finish = "tool_calls" if calls is not None else "length"
                send(json.dumps({"choices": [{"index": 0, **delta, "finish_reason": finish}]}))
            generated = len(pieces) if calls is None else CALL_TOKENS
            usage = {"prompt_tokens": 3, "completion_tokens": generated, "total_tokens": 3 + generated}
            send(json.dumps({"choices": [], "usage": usage}))
            send("[DONE]")
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

    return Handler


@contextmanager
def fake_openai_server() -> Iterator[FakeServer]:
    """A fake server on 127.0.0.1 (a free port) for the duration of the block."""
    fake = FakeServer()
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fake))
    httpd.daemon_threads = True
    httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]  # clients that hang up
    fake.url = f"http://127.0.0.1:{httpd.server_address[1]}"
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield fake
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(5)
