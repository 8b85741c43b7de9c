"""A remote engine: what `Engine` offers the commands (build a request, submit it, get its events),
over an OpenAI-compatible server's streaming routes, so `generate`, `stream` and `chat` run the same
code against a local engine or a server (`backend: remote`).

A request goes to `/v1/chat/completions` (chat messages; the server's template renders them) or
`/v1/completions` (a raw prompt), always streamed: each content delta becomes a `TokenEvent` as it
arrives, and the last event is one `DoneEvent`. The sampler settings are sent under the names the
detected engine honours (`infer.cli.remote.engines`); what it cannot honour was refused before.
A server's refusal (4xx/5xx) raises `RemoteError` with its message (the CLI: one line, exit 2); a
connection cut mid-stream, or an error chunk, ends the request with `finish_reason` `error` and the
text so far; cancelling (Ctrl-C) closes the stream and ends it `cancelled`.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer.cli.generation import generation_fields
from infer.cli.remote.engines import RemoteKind, constraint_fields, detect_kind, map_sampler
from infer.cli.server_client import (
    RemoteError,
    ServerIdentity,
    api_key_from,
    auth_headers,
    base_url,
    discover,
    server_message,
    transport_message,
)
from infer.engine import DoneEvent, Timings, TokenEvent, Usage
from infer.profiles.remote import refuse_local_settings
from infer.profiles.settings import Settings, SettingsError

CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 600.0
"""How long a stream may stay silent (a long prompt being read) before it counts as dropped."""
_FINISH = {"stop": "stop", "length": "length", "eos": "stop", "tool_calls": "stop"}
"""Finish reasons servers write, as infer's (anything else ends the request with an error)."""


@dataclass(frozen=True)
class RemoteRequest:
    """One request for a server: the route, the JSON body, and what the stats line reports."""

    path: str
    """`/chat/completions` or `/completions`."""
    body: dict[str, Any]
    seed: int
    request_id: str
    prompt_ids: tuple[int, ...] = ()
    """Unknown on this side (the server tokenizes); kept so the commands read it like a Request."""


@dataclass
class ServerReport:
    """What the server said about a finished request, for `--json`: its usage and timings objects as
    sent (llama-server's `timings`, vLLM's `usage`), its `system_fingerprint`, and the ids when it
    streamed them."""

    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    system_fingerprint: str | None = None
    token_ids: list[int] = field(default_factory=list)


class RemoteStream:
    """The events of one server request, in order, ending with exactly one DoneEvent; `cancel()`
    closes the connection (the server stops generating) and the stream ends `cancelled`."""

    def __init__(self, request: RemoteRequest, response: httpx.Response, started: float) -> None:
        self.request_id = request.request_id
        self.report = ServerReport()
        self._request = request
        self._response = response
        self._started = started
        self._text: list[str] = []
        self._count = 0
        self._first: float | None = None
        self._last: float | None = None
        self._done: DoneEvent | None = None
        self._cancelled = False

    def cancel(self) -> None:
        """Stop: close the stream (the server sees the client leave and frees the slot)."""
        self._cancelled = True
        self._response.close()

    def __iter__(self) -> Iterator[TokenEvent | DoneEvent]:
        if self._done is not None:
            yield self._done
            return
        if self._cancelled:
            yield self._finish("cancelled", None)
            return
        finish: str | None = None
        error: str | None = None
        try:
            for payload in self._payloads():
                if payload.get("error"):
                    error = "the server ended the stream: " + server_message(200, json.dumps(payload))
                    break
                event, reason = self._read_chunk(payload)
                if event is not None:
                    yield event
                if reason is not None:
                    finish = reason
        except httpx.HTTPError as exc:
            if self._cancelled:
                yield self._finish("cancelled", None)
                return
            error = transport_message(exc, READ_TIMEOUT_S)
        finally:
            if self._cancelled or error is not None:
                self._response.close()
        if self._cancelled:
            yield self._finish("cancelled", None)
            return
        if error is None and finish is None:
            error = "the connection was cut mid-response (the stream ended without a finish reason)"
        if error is None and finish not in _FINISH:
            error = f"the server ended the completion with finish_reason {finish!r}"
        yield self._finish("error" if error else _FINISH[str(finish)], error)

    def _payloads(self) -> Iterator[dict[str, Any]]:
        """The JSON objects of the Server-Sent Events, up to `data: [DONE]`."""
        for line in self._response.iter_lines():
            if not line.startswith("data:"):
                continue  # comments, event names, keep-alives
            data = line[5:].strip()
            if data == "[DONE]":
                return
            try:
                payload = json.loads(data)
            except ValueError:
                raise httpx.RemoteProtocolError(f"not JSON in the stream: {data[:80]!r}") from None
            if isinstance(payload, dict):
                yield payload

    def _read_chunk(self, payload: dict[str, Any]) -> tuple[TokenEvent | None, str | None]:
        """A chunk's text delta as an event (None when it carries none) and its finish reason."""
        report = self.report
        if isinstance(payload.get("usage"), dict):
            report.usage = payload["usage"]
        if isinstance(payload.get("timings"), dict):
            report.timings = payload["timings"]
        if payload.get("system_fingerprint"):
            report.system_fingerprint = str(payload["system_fingerprint"])
        choices = payload.get("choices") or []
        if not choices or not isinstance(choices[0], dict):
            return None, None
        choice = choices[0]
        delta = choice.get("delta")
        text = (delta.get("content") if isinstance(delta, dict) else None) or choice.get("text") or ""
        ids = choice.get("token_ids")
        if isinstance(ids, list):
            report.token_ids.extend(int(t) for t in ids if isinstance(t, int))
        event = None
        if text:
            now = time.perf_counter()
            self._first = self._first or now
            self._last = now
            self._text.append(text)
            event = TokenEvent(self.request_id, self._count, -1, text, None, (), self._count)
            self._count += 1
        return event, choice.get("finish_reason")

    def _finish(self, reason: Any, error: str | None) -> DoneEvent:
        usage = self.report.usage or {}
        details = usage.get("prompt_tokens_details") if isinstance(usage, dict) else None
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        completion = usage.get("completion_tokens")
        first, last = self._first, self._last
        timings = Timings(
            prefill_s=(first - self._started) if first else 0.0,
            decode_s=(last - first) if first and last else 0.0,
            ttft_s=(first - self._started) if first else 0.0,
        )
        self._done = DoneEvent(
            self.request_id,
            reason,
            error,
            Usage(
                int(usage.get("prompt_tokens") or 0),
                int(completion) if isinstance(completion, int) else self._count,
                int(cached or 0),
            ),
            timings,
            self._request.seed,
            tuple(self.report.token_ids),
            "".join(self._text),
        )
        return self._done


class RemoteEngine:
    """A server standing in for the local engine: the detected engine, the served model, one HTTP
    client. Nothing here prints."""

    tokenizer = None
    """No local tokenizer: the server tokenizes and renders chat templates."""

    def __init__(
        self,
        settings: Settings,
        client: httpx.Client,
        identity: ServerIdentity,
        kind: RemoteKind,
        seconds: float,
    ) -> None:
        self.settings = settings
        self.client = client
        self.identity = identity
        self.kind = kind
        self.load_seconds = seconds
        self.reports: dict[str, ServerReport] = {}
        """Each finished request's `ServerReport`, by request id."""

    def request(
        self,
        settings: Settings,
        *,
        prompt: str | None = None,
        messages: list[dict[str, Any]] | None = None,
        chat: bool | None = None,
        parse_special: bool = True,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        reproducible: bool = False,
    ) -> RemoteRequest:
        """The request for CLI input under `settings`: chat messages (or `--chat` around a prompt, also
        the default, as a local model with a template) to the chat route, a raw prompt (`--raw`) to the
        completions route. Raises `SettingsError` for what this engine cannot honour."""
        from infer.engine import Request  # the one seed rule: a fixed seed, or a fresh random one
        from infer.profiles.constraints import grammar_from_settings
        from infer.profiles.requests import max_tokens_for

        if not parse_special:
            raise SettingsError(
                f"--no-parse-special cannot be honoured by {self.kind.label} (it parses a prompt's "
                "special-token text itself)"
            )
        if ignore_eos and not self.kind.ignore_eos:
            raise SettingsError(f"--ignore-eos cannot be honoured by {self.kind.label} (no such field)")
        constraint = grammar_from_settings(settings)  # at most one, and a valid one, before sending
        local = Request((0,), settings.sampling, stop=tuple(stop or ()))  # the local checks of stop
        sampler = map_sampler(self.kind, settings.sampling, settings)
        use_chat = messages is not None or chat is not False
        body: dict[str, Any] = {
            "model": self.identity.model,
            "stream": True,
            "stream_options": {"include_usage": True},
            **sampler.fields,
            **constraint_fields(self.kind, settings, constraint),
        }
        if "seed" in self.kind.sampler_names and settings.temperature > 0:
            body[self.kind.sampler_names["seed"]] = local.seed
        limit = max_tokens_for(settings.n_predict)
        if limit is not None:
            body["max_tokens"] = limit
        if local.stop:
            body["stop"] = list(local.stop)
        if ignore_eos:
            body["ignore_eos"] = True
        if reproducible:
            body.update(self.kind.reproducible)
        if use_chat:
            chat_messages = messages if messages is not None else [{"role": "user", "content": prompt or ""}]
            return RemoteRequest(
                "/chat/completions", {**body, "messages": chat_messages}, local.seed, local.request_id
            )
        return RemoteRequest("/completions", {**body, "prompt": prompt or ""}, local.seed, local.request_id)

    def validate(self, request: RemoteRequest) -> None:
        """Nothing more to check here: `request()` refused what the engine cannot honour."""

    def start(self) -> None:
        """Nothing to start: the server runs already."""

    def shutdown(self, **_: Any) -> None:
        """Close the HTTP client."""
        self.client.close()

    def submit(self, request: RemoteRequest) -> RemoteStream:
        """POST the request and return its event stream once the server has accepted it; raises
        `RemoteError` (one line with the server's message) when it refuses or cannot be reached."""
        url = self.identity.url + request.path
        started = time.perf_counter()
        try:
            response = self.client.send(
                self.client.build_request("POST", url, json=request.body), stream=True
            )
        except httpx.HTTPError as exc:
            raise RemoteError(f"POST {url}: {transport_message(exc, READ_TIMEOUT_S)}") from None
        if response.status_code != 200:
            content = response.read()
            response.close()
            raise RemoteError(f"POST {url}: {server_message(response.status_code, content)}")
        stream = RemoteStream(request, response, started)
        self.reports[request.request_id] = stream.report
        return stream


def open_remote(settings: Settings) -> RemoteEngine:
    """Connect to the settings' server: list its models (the one to use: the `model` setting when
    given, else the first), tell its engine apart, and check the sampler settings against it.
    Raises `RemoteError` or `SettingsError` (one line each)."""
    refuse_local_settings(settings)
    started = time.perf_counter()
    base = base_url(str(settings.server_url))
    key = api_key_from(None, settings.api_key_env)
    client = httpx.Client(
        timeout=httpx.Timeout(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S), headers=auth_headers(key)
    )
    try:
        model = settings.model if settings.source("model").kind != "default" else None
        identity = discover(client, base, model)
        kind = detect_kind(client, base)
        map_sampler(kind, settings.sampling, settings)  # refuse before the first request
    except BaseException:
        client.close()
        raise
    return RemoteEngine(settings, client, identity, kind, time.perf_counter() - started)


def server_json(engine: RemoteEngine, request: RemoteRequest, done: DoneEvent) -> str:
    """The `--json` object of `infer generate` against a server: the local run's keys (timings
    measured here) plus the server's own usage and timings, and who answered."""
    report = engine.reports.get(request.request_id, ServerReport())
    fields = generation_fields(done, engine.load_seconds, None, list(done.token_ids) or None)
    return json.dumps(
        fields
        | {
            "decode_tokens_per_s": round(done.timings.decode_tokens_per_s(done.usage.completion_tokens), 2),
            "server": {
                "url": engine.identity.url,
                "engine": engine.kind.name,
                "model": engine.identity.model,
                "usage": report.usage,
                "timings": report.timings,
                "system_fingerprint": report.system_fingerprint,
            },
        },
        ensure_ascii=False,
    )


__all__ = ["RemoteEngine", "RemoteRequest", "RemoteStream", "ServerReport", "open_remote", "server_json"]
