"""`infer serve`: load the model once and run the OpenAI-compatible server under uvicorn.

SIGTERM (or Ctrl-C) stops admitting at once (new requests get 503), lets the requests in flight
finish for up to `--shutdown-grace` seconds, cancels the rest (their streams end with an error event),
stops the engine and exits 0.
"""

from __future__ import annotations

import signal
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Optional

import typer
import uvicorn

from infer.cli.hub import is_hub_name
from infer.cli.model_store import DEFAULT_MODEL, KNOWN_MODELS
from infer.cli.options import fail, with_settings
from infer.cli.runtime import open_engine
from infer.cli.serve.app import DEFAULT_MAX_BODY_BYTES, create_app
from infer.profiles.settings import Settings

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class _GracefulServer(uvicorn.Server):
    """uvicorn's server, telling the app that shutdown began before uvicorn starts its own steps."""

    def __init__(self, config: uvicorn.Config, on_exit: Callable[[], None]) -> None:
        super().__init__(config)
        self._on_exit = on_exit

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: stop admitting and start the grace timer, then let uvicorn shut down."""
        self._on_exit()
        super().handle_exit(sig, frame)


def model_id_of(settings: Settings) -> str:
    """The name /v1/models reports: the known model's name, or the file (or folder) name."""
    model = settings.model
    if model is None:
        return DEFAULT_MODEL.name
    if model in KNOWN_MODELS or is_hub_name(model):
        return model
    path = Path(model)
    return path.stem if path.suffix == ".gguf" else path.name


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket ourselves, so a busy port is a one-line error and `--port 0` works."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, proto)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(2048)
        sock.set_inheritable(True)
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}")
    return sock


@with_settings
def serve(
    settings: Settings,
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Address to listen on (loopback by default; others need care)."
    ),
    port: int = typer.Option(8080, "--port", min=0, max=65535, help="TCP port; 0 = any free port."),
    api_key: Optional[str] = typer.Option(
        None,
        "--api-key",
        envvar="INFER_API_KEY",
        help="Require `Authorization: Bearer KEY` on every route but /health (env INFER_API_KEY).",
    ),
    shutdown_grace: float = typer.Option(
        30.0, "--shutdown-grace", min=0.0, help="Seconds in-flight requests may finish after SIGTERM."
    ),
    max_body_mb: float = typer.Option(
        DEFAULT_MAX_BODY_BYTES / 2**20,
        "--max-body-mb",
        min=0.001,
        help="Largest request body accepted (MiB).",
    ),
    alias: Optional[list[str]] = typer.Option(
        None,
        "--alias",
        metavar="NAME",
        help="Another model name requests may use (repeatable); any other name is 404 model_not_found.",
    ),
    log_level: str = typer.Option(
        "warning", "--log-level", help="uvicorn log level: critical, error, warning, info, debug."
    ),
) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, responses, models)."""
    if log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(f"--log-level must be one of critical, error, warning, info, debug (got {log_level!r})")
    sock = _listen(host, port)
    engine = open_engine(settings)
    model_id = model_id_of(settings)
    app = create_app(
        engine,
        settings,
        model_id=model_id,
        aliases=tuple(alias or ()),
        api_key=api_key or None,
        max_body_bytes=int(max_body_mb * 2**20),
    )
    bridge = app.state.ctx.bridge

    def begin_shutdown() -> None:
        loop = getattr(app.state, "loop", None)
        bridge.admitting = False
        if loop is not None:
            bridge.begin_shutdown(loop, shutdown_grace)

    config = uvicorn.Config(
        app,
        log_level=log_level,
        access_log=log_level in ("info", "debug", "trace"),
        timeout_graceful_shutdown=int(shutdown_grace) + 5,  # backstop: the app cancels at `grace`
        lifespan="on",
    )
    server = _GracefulServer(config, begin_shutdown)
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    if host not in LOOPBACK_HOSTS and not api_key:
        print(f"infer serve: warning: listening on {host} without --api-key", file=sys.stderr)
    print(
        f"infer serve: {model_id} (ctx {engine.config.ctx_size}, max {engine.config.max_num_seqs} sequences, "
        f"loaded in {engine.load_seconds:.1f} s) listening on http://{shown}:{bound_port}",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn restores the handlers it found and re-raises a caught SIGTERM/SIGINT after a graceful
    # shutdown; with no-op handlers in place that re-raise does nothing and the exit status stays 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not server.started:
        fail("the server failed to start (see the log above)")
