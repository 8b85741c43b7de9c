"""The FastAPI app: routes, API-key check, body limits (cli/serve/limits.py), and the engine's lifetime.

`create_app(engine, settings, AppOptions(model_id, ...))` is all a caller needs; `infer serve`
(command.py) runs it under uvicorn, tests may run it in-process.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from fastapi.responses import JSONResponse, Response
from starlette.types import ASGIApp, Receive, Scope, Send

from infer.cli.serve import completions, responses
from infer.cli.serve.access_log import AccessLog, AccessStats, LogFormat
from infer.cli.serve.bridge import RETRY_AFTER
from infer.cli.serve.context import ServeContext
from infer.cli.serve.errors import APIError, error_body, install_error_handlers
from infer.cli.serve.limits import DEFAULT_MAX_BODY_BYTES, BodyLimit, send_json
from infer.cli.serve.metrics import CountStatuses, ServerMetrics
from infer.cli.serve.openapi import install_openapi
from infer.cli.serve.webui import PATHS as WEBUI_PATHS
from infer.cli.serve.webui import install_webui
from infer.engine import Engine
from infer.profiles.settings import Settings

OPEN_PATHS = frozenset({"/health"})
"""Routes that need no API key (load balancers probe them)."""


class _Gate:
    """ASGI middleware: the API key (when set), checked before any route and before the body is read.

    Pure ASGI rather than `@app.middleware("http")`: Starlette's BaseHTTPMiddleware would sit between
    a streaming response and the client and hide disconnects from it.
    """

    def __init__(self, app: ASGIApp, *, api_key: str | None, open_paths: frozenset[str] = OPEN_PATHS) -> None:
        self.app = app
        self.api_key = api_key
        self.open_paths = open_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}
        if self.api_key is not None and scope.get("path") not in self.open_paths:
            given = headers.get("authorization", "")
            token = given[7:].strip() if given[:7].lower() == "bearer " else ""
            if not hmac.compare_digest(token.encode(), self.api_key.encode()):
                body = error_body(
                    "invalid or missing API key (Authorization: Bearer ...)", code="invalid_api_key"
                )
                await send_json(send, 401, body, {"www-authenticate": "Bearer"})
                return
        await self.app(scope, receive, send)


@dataclass(frozen=True)
class AppOptions:
    """What the app serves under which names, and what it admits."""

    model_id: str
    """The model's name in /v1/models and the name requests use."""
    aliases: tuple[str, ...] = ()
    """Other names requests may use; any other is 404 model_not_found."""
    accept_any_model: bool = False
    """Answer a request naming any model with the served one (`--accept-any-model`), as llama-server
    does, for clients whose model name is hard-wired."""
    api_key: str | None = None
    """Require `Authorization: Bearer KEY` on every route but /health (None: open)."""
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    """Larger request bodies are refused (413), counted as they arrive (cli/serve/limits.py)."""
    tool_call_parser: str | None = None
    """The call syntax replies are read in (`--tool-call-parser`; None: the template's)."""
    reasoning_parser: str = "auto"
    """Whether replies' `<think>` blocks are split into reasoning (`--reasoning-parser`)."""
    log_format: LogFormat = "text"
    """The access log's lines: `text` or `json` (cli/serve/access_log.py)."""
    quiet: bool = False
    """No access-log line per request."""
    webui: bool = True
    """Serve the chat page at `/` (cli/serve/webui.py); off (`--no-webui`): `/` is 404 as before."""


def create_app(engine: Engine, settings: Settings, options: AppOptions) -> FastAPI:
    """The OpenAI-compatible app over `engine`.

    Starting the app (its lifespan) starts the engine's background step loop; stopping it refuses new
    requests, cancels what is still running and stops the loop.
    """
    ctx = ServeContext(
        engine=engine,
        settings=settings,
        model_id=options.model_id,
        aliases=options.aliases,
        accept_any_model=options.accept_any_model,
        tool_call_parser=options.tool_call_parser,
        reasoning_parser=options.reasoning_parser,
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        app.state.loop = asyncio.get_running_loop()
        engine.start()
        # the template worker starts now, so the first chat request does not wait for it
        await asyncio.to_thread(ctx.sandbox.start)
        try:
            yield
        finally:
            ctx.bridge.admitting = False
            ctx.bridge.cancel_all()
            ctx.sandbox.close()
            # shutdown() joins the engine thread; keep the event loop free meanwhile.
            await asyncio.to_thread(engine.shutdown, cancel=True)

    app = FastAPI(
        title="infer",
        summary="OpenAI-compatible API over the infer engine.",
        version="0.1.0",
        lifespan=lifespan,
    )
    app.state.ctx = ctx
    install_error_handlers(app)
    app.include_router(completions.router)
    app.include_router(responses.router)

    metrics = ServerMetrics(engine, ctx.model_id)
    engine.add_done_listener(metrics.observe)

    @app.get("/metrics", response_class=Response)
    async def prometheus_metrics() -> Response:
        """Prometheus text format: requests by finish reason and HTTP status, prompt and generated
        tokens, running and waiting sequences, KV-cache use, TTFT / inter-token / end-to-end latency
        histograms, speculative drafted and accepted tokens (vLLM's names, `infer:` prefix)."""
        return Response(metrics.render(), media_type=metrics.content_type)

    @app.get("/health")
    async def health() -> JSONResponse:
        """Liveness and load: 200 while admitting (503 once shutting down); `active_sequences` is what the
        engine still holds (queued or with a KV slot), `waiting_sequences` the queue that `max_queue`
        bounds, `kv_slots_used` of `kv_slots_total` the KV cache in use (`kv_slots_kept` more hold
        kept prompt prefixes), `kv_memory_reserved_bytes` of `kv_memory_budget_bytes` (0 = no budget)
        the KV memory set aside."""
        prefixes = engine.scheduler.prefix_cache
        kept = prefixes.kept_slots if prefixes is not None else 0
        body = {
            "status": "ok" if ctx.bridge.admitting else "shutting_down",
            "model": ctx.model_id,
            "active_sequences": engine.active_sequences,
            "waiting_sequences": engine.waiting_sequences,
            "max_queue": engine.config.max_queue,
            "kv_slots_used": engine.cache.num_slots - engine.cache.free_slots - kept,
            "kv_slots_kept": kept,
            "kv_slots_total": engine.cache.num_slots,
            "kv_memory_reserved_bytes": engine.scheduler.reserved_bytes,
            "kv_memory_budget_bytes": engine.kv_budget.budget_bytes,
            "in_flight": ctx.bridge.in_flight,
        }
        if ctx.bridge.admitting:
            return JSONResponse(body)
        return JSONResponse(body, status_code=503, headers=RETRY_AFTER)

    def model_card(name: str) -> dict[str, Any]:
        return {
            "id": name,
            "object": "model",
            "created": ctx.created,
            "owned_by": "infer",
            "max_model_len": ctx.ctx_size,
        }

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        """The one model this server serves, under its name and each alias."""
        return {"object": "list", "data": [model_card(name) for name in ctx.served_names]}

    @app.get("/v1/models/{model:path}")
    async def retrieve_model(model: str) -> dict[str, Any]:
        """The model card, or 404 for another name."""
        ctx.check_model(model)
        return model_card(model)

    # A client asking for embeddings gets the reason, not a bare 404 (issue 34): a generative model's
    # hidden states are no embedding model's, so none is offered. Kept out of the OpenAPI document,
    # which describes what the server does.
    @app.post("/v1/embeddings", include_in_schema=False)
    async def embeddings() -> None:
        """501: this server generates text; it does not compute embeddings."""
        raise APIError(
            "embeddings are not implemented: infer serve runs a generative model "
            "(/v1/chat/completions, /v1/completions, /v1/responses); use an embedding model's server",
            status=501,
            type="not_implemented_error",
            code="not_implemented",
        )

    open_paths = OPEN_PATHS
    if options.webui:
        install_webui(app)
        open_paths = OPEN_PATHS | WEBUI_PATHS  # the page itself asks for the key the API needs

    install_openapi(app)
    app.add_middleware(BodyLimit, max_body_bytes=options.max_body_bytes)
    # outside the body limit: no key, no body read
    app.add_middleware(_Gate, api_key=options.api_key, open_paths=open_paths)
    app.add_middleware(CountStatuses, metrics=metrics)  # counts the gate's answers too
    app.state.access_stats = AccessStats()
    app.add_middleware(  # outermost: logs every answer, timed from the first byte in
        AccessLog, stats=app.state.access_stats, log_format=options.log_format, quiet=options.quiet
    )
    return app
