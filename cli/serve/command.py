"""`infer serve`: load the model once and run the OpenAI-compatible server under uvicorn.

SIGTERM (or Ctrl-C) stops admitting at once (new requests get 503 with `Retry-After`, `/health` reports
`shutting_down`; the port stays open meanwhile), lets the requests in flight finish for up to
`--shutdown-grace` seconds, cancels the rest (their streams end with an error event), stops the engine
and exits 0. A second signal skips the wait.
"""

from __future__ import annotations

import asyncio
import signal
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import FrameType

import uvicorn

from infer.cli.hub import is_hub_name
from infer.cli.model_store import DEFAULT_MODEL, KNOWN_MODELS
from infer.cli.options import fail, takes_options, with_settings
from infer.cli.runtime import open_engine
from infer.cli.serve.access_log import LOG_FORMATS, shutdown_line
from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.limits import HttpLimits
from infer.cli.serve.options import ServeOptions
from infer.profiles.settings import Settings, is_remote

LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class _GracefulServer(uvicorn.Server):
    """uvicorn's server with a drain before uvicorn's own shutdown.

    uvicorn closes its listening socket as soon as a signal arrives, so a client would meet
    "connection refused". Here the first SIGTERM (or Ctrl-C) only stops admitting: the socket stays
    open, `/health` says `shutting_down` and new requests get 503 with `Retry-After`, while the
    requests in flight finish (or are cancelled at the end of the grace period and end with their
    cancellation event). Once none is left, uvicorn shuts down. A second signal skips the drain.
    """

    def __init__(
        self,
        config: uvicorn.Config,
        on_exit: Callable[[], None],
        in_flight: Callable[[], int],
        loop_of: Callable[[], asyncio.AbstractEventLoop | None],
        drain_seconds: float,
    ) -> None:
        super().__init__(config)
        self._on_exit = on_exit
        self._in_flight = in_flight
        self._loop_of = loop_of
        self._drain_seconds = drain_seconds
        self._draining = False

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        """Signal handler: the first signal begins the drain, a second one exits at once."""
        loop = self._loop_of()
        if self._draining or loop is None:
            super().handle_exit(sig, frame)
            return
        self._draining = True
        self._on_exit()
        loop.call_soon_threadsafe(lambda: loop.create_task(self._drain(sig, frame)))

    async def _drain(self, sig: int, frame: FrameType | None) -> None:
        deadline = time.monotonic() + self._drain_seconds
        while self._in_flight() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
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
@takes_options
def serve(settings: Settings, options: ServeOptions) -> None:
    """Serve the model over an OpenAI-compatible HTTP API (chat, completions, responses, models)."""
    if options.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        fail(f"--log-level must be one of critical, error, warning, info, debug (got {options.log_level!r})")
    if options.tool_call_parser is not None:
        from infer.engine import TOOL_CALL_PARSERS  # here: `infer --help` loads no engine code

        if options.tool_call_parser not in TOOL_CALL_PARSERS:
            names = ", ".join(TOOL_CALL_PARSERS)
            fail(f"--tool-call-parser must be one of {names} (got {options.tool_call_parser!r})")
    from infer.engine import REASONING_PARSERS  # a stdlib-only module, like TOOL_CALL_PARSERS's

    if options.reasoning_parser not in REASONING_PARSERS:
        names = ", ".join(REASONING_PARSERS)
        fail(f"--reasoning-parser must be one of {names} (got {options.reasoning_parser!r})")
    if options.log_format not in LOG_FORMATS:
        fail(f"--log-format must be one of {', '.join(LOG_FORMATS)} (got {options.log_format!r})")
    if is_remote(settings):  # a proxy in front of another server is not what serve is for
        fail(
            f"{settings.source('backend')}: infer serve runs a local engine, not backend remote "
            f"({settings.server_url}); point clients at that server, or choose a local backend"
        )
    sock = _listen(options.host, options.port)
    engine = open_engine(settings)
    model_id = model_id_of(settings)
    app = create_app(
        engine,
        settings,
        AppOptions(
            model_id,
            aliases=tuple(options.alias or ()),
            accept_any_model=options.accept_any_model,
            api_key=options.api_key or None,
            max_body_bytes=int(options.max_body_mb * 2**20),
            tool_call_parser=options.tool_call_parser,
            reasoning_parser=options.reasoning_parser,
            log_format=options.log_format,  # type: ignore[arg-type]  # checked above
            quiet=options.quiet,
            webui=options.webui,
        ),
    )
    bridge = app.state.ctx.bridge

    def begin_shutdown() -> None:
        loop = getattr(app.state, "loop", None)
        bridge.admitting = False
        if loop is not None:
            bridge.begin_shutdown(loop, options.shutdown_grace)

    config = uvicorn.Config(
        app,
        log_level=options.log_level,
        access_log=False,  # infer's own access log (access_log.py) has the tokens and timings
        timeout_graceful_shutdown=int(options.shutdown_grace) + 5,  # backstop: the app cancels at `grace`
        lifespan="on",
        # header deadline, connection cap, keep-alive and request-head bounds (see limits.py)
        **HttpLimits().uvicorn_options(),
    )
    server = _GracefulServer(
        config,
        begin_shutdown,
        in_flight=lambda: bridge.in_flight,
        loop_of=lambda: getattr(app.state, "loop", None),
        # the grace period, then a little for the cancelled streams to send their last event
        drain_seconds=options.shutdown_grace + 2.0,
    )
    bound_host, bound_port = sock.getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    if options.host not in LOOPBACK_HOSTS and not options.api_key:
        print(f"infer serve: warning: listening on {options.host} without --api-key", file=sys.stderr)
    print(
        f"infer serve: {model_id} (ctx {engine.config.ctx_size}, max {engine.config.max_num_seqs} sequences, "
        f"loaded in {engine.load_seconds:.1f} s) listening on http://{shown}:{bound_port}",
        file=sys.stderr,
        flush=True,
    )
    # uvicorn restores the handlers it found and re-raises a caught SIGTERM/SIGINT after a graceful
    # shutdown; with no-op handlers in place that re-raise does nothing and the exit status stays 0.
    previous = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
    listening_since = time.monotonic()
    try:
        server.run(sockets=[sock])
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        sock.close()
    if not server.started:
        fail("the server failed to start (see the log above)")
    line = shutdown_line(
        app.state.access_stats,
        in_flight=bridge.in_flight_at_shutdown,
        cancelled=bridge.cancelled_in_shutdown,
        uptime_s=time.monotonic() - listening_since,
        log_format=options.log_format,  # type: ignore[arg-type]
    )
    print(line, file=sys.stderr, flush=True)
