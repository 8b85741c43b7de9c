"""The chat page at `/` (`--no-webui` leaves it out): five static files shipped in the package
(cli/serve/static/: no build step, no library, nothing fetched from a network), answered from memory.

The files are read on the first request for one (a few tens of KB, kept for the app's life) and
served with an ETag, `no-cache` (a browser revalidates, so an upgraded server never runs yesterday's
script) and a Content-Security-Policy that lets the page run only its own scripts and talk only to
this server. The page renders model text with DOM nodes alone (static/markdown.js); the policy is the second
wall: even an element that slipped through could run no inline handler and load nothing remote.
The page and its files need no API key (they hold nothing secret; the page asks for the key the API
routes need), so they are open paths of the key check.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from importlib import resources

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import Response

PAGE_FILES: dict[str, str] = {
    "index.html": "text/html; charset=utf-8",
    "app.js": "text/javascript; charset=utf-8",
    "markdown.js": "text/javascript; charset=utf-8",
    "style.css": "text/css; charset=utf-8",
    "favicon.svg": "image/svg+xml",
}
"""The page's files (in cli/serve/static/) and their media types; nothing else is served."""
ASSET_PREFIX = "/webui/"
PATHS = frozenset({"/", *(ASSET_PREFIX + name for name in PAGE_FILES if name != "index.html")})
"""Every path the page adds to the app (all open: no API key needed)."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
    "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)


@dataclass(frozen=True)
class _File:
    body: bytes
    media_type: str
    etag: str


def _read_files() -> dict[str, _File]:
    folder = resources.files("infer.cli.serve") / "static"
    files = {}
    for name, media_type in PAGE_FILES.items():
        body = (folder / name).read_bytes()
        files[name] = _File(body, media_type, '"' + hashlib.sha256(body).hexdigest()[:16] + '"')
    return files


def install_webui(app: FastAPI) -> None:
    """Add `GET /` (the chat page) and `GET /webui/<file>` (its script, style and icon) to `app`, kept
    out of the OpenAPI document (they are not API). The files are read on the first request for one,
    so building the app (the server's start-up) pays for two routes and nothing else."""
    files: dict[str, _File] = {}

    def answer(request: Request, name: str) -> Response:
        if name not in PAGE_FILES:
            raise HTTPException(status_code=404)  # the same answer as any path the app does not have
        if not files:
            files.update(_read_files())
        file = files[name]
        headers = {
            "ETag": file.etag,
            "Cache-Control": "no-cache",
            "X-Content-Type-Options": "nosniff",
            "Referrer-Policy": "no-referrer",
        }
        if name == "index.html":
            headers["Content-Security-Policy"] = CSP
        if request.headers.get("if-none-match") == file.etag:
            return Response(status_code=304, headers=headers)
        return Response(file.body, media_type=file.media_type, headers=headers)

    @app.get("/", include_in_schema=False)
    async def chat_page(request: Request) -> Response:
        """The chat page."""
        return answer(request, "index.html")

    @app.get(ASSET_PREFIX + "{name}", include_in_schema=False)
    async def chat_page_file(request: Request, name: str) -> Response:
        """The page's script, style and icon (index.html only at `/`)."""
        return answer(request, name if name != "index.html" else "")


__all__ = ["PATHS", "install_webui"]
