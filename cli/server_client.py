"""Talking to any OpenAI-compatible server (infer serve, vLLM, llama-server, SGLang, TGI ...): the base
URL, the API key, the server's identity for fingerprints, and one-line error messages that keep the
server's own words. Shared by `infer gate --server` and `infer bench --server`; nothing here prints.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any

import httpx

SERVER_ENV = "INFER_SERVER_URL"
"""Environment twin of `--server`."""
API_KEY_ENV = "INFER_API_KEY"
"""Environment twin of `--api-key` (kept out of every report and fingerprint)."""
DEFAULT_TIMEOUT_S = 600.0

_VERSION_HEADER_HINTS = ("version", "build")
"""Response headers recorded in the fingerprint: `server` and every header whose name has one of these
(vLLM and TGI put their version there, llama-server its build in `server` and `system_fingerprint`)."""


class RemoteError(Exception):
    """The server could not be reached or answered with an error; the message is one line with the
    server's own words."""


def base_url(url: str) -> str:
    """`http://host:8000`, `.../v1` or `.../v1/` -> `http://host:8000/v1`."""
    base = url.strip().rstrip("/")
    if not base.startswith(("http://", "https://")):
        raise RemoteError(f"--server {url!r}: give an http:// or https:// URL")
    return base if base.endswith("/v1") else base + "/v1"


def api_key_from(flag: str | None, env_name: str = API_KEY_ENV) -> str | None:
    """`--api-key`, else the variable `env_name` (a profile's `api_key_env`, `INFER_API_KEY` by
    default), else None."""
    return flag or os.environ.get(env_name) or None


def auth_headers(api_key: str | None) -> dict[str, str]:
    """The Authorization header for an API key (none without one)."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(text.split())
    return line if len(line) <= limit else line[: limit - 1] + "…"


def server_message(status: int, body: bytes | str) -> str:
    """`HTTP 400: <message>` from an OpenAI error body (`{"error": {"message": ...}}`, also the shape
    llama-server and vLLM send), a FastAPI `detail`, or the body's first 300 characters."""
    text = body.decode(errors="replace") if isinstance(body, bytes) else body
    message = text
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict):
        error = data.get("error")
        if isinstance(error, dict) and error.get("message"):
            message = str(error["message"])
            if error.get("param"):
                message += f" (param {error['param']})"
        elif isinstance(error, str):
            message = error
        elif data.get("message"):
            message = str(data["message"])
        elif data.get("detail"):
            message = json.dumps(data["detail"]) if not isinstance(data["detail"], str) else data["detail"]
    return f"HTTP {status}: {_one_line(message) or '(empty body)'}"


def transport_message(exc: httpx.HTTPError, timeout: float | None = None) -> str:
    """One line for a failure below HTTP: refused, timed out, or the connection cut mid-response."""
    detail = _one_line(str(exc)) or type(exc).__name__
    if isinstance(exc, httpx.ConnectError):
        return f"cannot connect ({detail})"
    if isinstance(exc, httpx.TimeoutException):
        after = f" after {timeout:g} s" if timeout else ""
        return f"timed out{after} ({type(exc).__name__})"
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError)):
        return f"the connection was cut mid-response ({detail})"
    return f"{type(exc).__name__}: {detail}"


@dataclass(frozen=True)
class ServerIdentity:
    """Who answered: for the environment fingerprint of a gate or bench run against a server."""

    url: str
    model: str
    """The model name sent with every request."""
    models: list[str] = field(default_factory=list)
    """Every id `/v1/models` lists."""
    headers: dict[str, str] = field(default_factory=dict)
    """`server` and version/build response headers of `/v1/models`."""
    version: Any = None
    """`GET /version` (vLLM answers `{"version": ...}`), when the server has it."""
    system_fingerprint: str | None = None
    """The `system_fingerprint` of the server's answers (llama-server's build), once one came back."""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (no API key: it is never recorded)."""
        return {
            "url": self.url,
            "model": self.model,
            "models": list(self.models),
            "headers": dict(self.headers),
            "version": self.version,
            "system_fingerprint": self.system_fingerprint,
        }


def _version_headers(headers: httpx.Headers) -> dict[str, str]:
    return {
        key.lower(): value
        for key, value in headers.items()
        if key.lower() == "server" or any(hint in key.lower() for hint in _VERSION_HEADER_HINTS)
    }


def discover(client: httpx.Client, base: str, model: str | None) -> ServerIdentity:
    """List `/v1/models` (the model to use: `model`, else the first listed) and read the server's
    version headers and `/version`. Raises RemoteError with the server's message."""
    try:
        response = client.get(f"{base}/models")
    except httpx.HTTPError as exc:
        raise RemoteError(f"{base}/models: {transport_message(exc, _timeout_of(client))}") from None
    if response.status_code != 200:
        raise RemoteError(f"{base}/models: {server_message(response.status_code, response.content)}")
    try:
        listed = [str(m["id"]) for m in response.json().get("data") or [] if isinstance(m, dict)]
    except (ValueError, KeyError, AttributeError):
        raise RemoteError(f"{base}/models: not an OpenAI model list") from None
    if model is None and not listed:
        raise RemoteError(f"{base}/models lists no model: name one with --model")
    headers = _version_headers(response.headers)
    version: Any = None
    root = base.removesuffix("/v1")
    try:
        answer = client.get(f"{root}/version")
        if answer.status_code == 200 and "json" in answer.headers.get("content-type", ""):
            version = answer.json()
    except (httpx.HTTPError, ValueError):
        version = None  # optional: only vLLM-style servers have it
    return ServerIdentity(base, model or listed[0], listed, headers, version)


def _timeout_of(client: httpx.Client) -> float | None:
    return client.timeout.read


__all__ = [
    "API_KEY_ENV",
    "DEFAULT_TIMEOUT_S",
    "SERVER_ENV",
    "RemoteError",
    "ServerIdentity",
    "api_key_from",
    "auth_headers",
    "base_url",
    "discover",
    "server_message",
    "transport_message",
]
