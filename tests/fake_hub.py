"""A stand-in for the Hugging Face hub on 127.0.0.1, enough for `huggingface_hub` to list a repository
and download a file (`HF_ENDPOINT=http://127.0.0.1:PORT`): no test reaches the real hub."""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FakeHub:
    """Repositories by `OWNER/REPO`, each a {path: bytes} mapping; `requests` logs (method, path)."""

    repos: dict[str, dict[str, bytes]]
    url: str = ""
    requests: list[tuple[str, str]] = field(default_factory=list)


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:  # keep pytest's output clean
            pass

        def _send(self, status: int, body: bytes, headers: dict[str, str], with_body: bool) -> None:
            self.send_response(status)
            for key, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(key, value)
            self.end_headers()
            if with_body:
                self.wfile.write(body)

        def _not_found(self, code: str, with_body: bool) -> None:
            body = json.dumps({"error": code}).encode()
            self._send(404, body, {"X-Error-Code": code, "Content-Type": "application/json"}, with_body)

        def _serve(self, with_body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path))
            parts = path.strip("/").split("/")
            if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                files = hub.repos.get("/".join(parts[2:4]))
                if files is None:
                    return self._not_found("RepoNotFound", with_body)
                listing = [
                    {"type": "file", "path": name, "size": len(data), "oid": hashlib.sha1(data).hexdigest()}
                    for name, data in sorted(files.items())
                ]
                return self._send(
                    200, json.dumps(listing).encode(), {"Content-Type": "application/json"}, with_body
                )
            if len(parts) >= 5 and parts[2] == "resolve":
                files = hub.repos.get("/".join(parts[:2]))
                if files is None:
                    return self._not_found("RepoNotFound", with_body)
                data = files.get("/".join(parts[4:]))
                if data is None:
                    return self._not_found("EntryNotFound", with_body)
                headers = {"X-Repo-Commit": COMMIT, "ETag": f'"{hashlib.sha256(data).hexdigest()}"'}
                return self._send(200, data, headers, with_body)
            return self._not_found("NotFound", with_body)

        def do_GET(self) -> None:
            self._serve(with_body=True)

        def do_HEAD(self) -> None:
            self._serve(with_body=False)

    return Handler


@contextmanager
def running(repos: dict[str, dict[str, bytes]]) -> Iterator[FakeHub]:
    """Serve `repos` on a free port of 127.0.0.1 for the duration of the block."""
    hub = FakeHub(repos)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    hub.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield hub
    finally:
        server.shutdown()
        server.server_close()
