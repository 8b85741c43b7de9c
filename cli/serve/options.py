"""`infer serve`'s own options (the shared settings flags come on top)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from infer.cli.options import option
from infer.cli.serve.limits import DEFAULT_MAX_BODY_BYTES


@dataclass(frozen=True)
class ServeOptions:
    """Where to listen and how to admit; each field is the command-line option of its metadata."""

    host: str = option(
        "127.0.0.1", "--host", help="Address to listen on (loopback by default; others need care)."
    )
    port: int = option(8080, "--port", min=0, max=65535, help="TCP port; 0 = any free port.")
    api_key: Optional[str] = option(
        None,
        "--api-key",
        envvar="INFER_API_KEY",
        help="Require `Authorization: Bearer KEY` on every route but /health (env INFER_API_KEY).",
    )
    shutdown_grace: float = option(
        30.0, "--shutdown-grace", min=0.0, help="Seconds in-flight requests may finish after SIGTERM."
    )
    max_body_mb: float = option(
        DEFAULT_MAX_BODY_BYTES / 2**20,
        "--max-body-mb",
        min=0.001,
        help="Largest request body accepted (MiB).",
    )
    alias: Optional[list[str]] = option(
        None,
        "--alias",
        metavar="NAME",
        help="Another model name requests may use (repeatable); any other name is 404 model_not_found.",
    )
    accept_any_model: bool = option(
        False,
        "--accept-any-model",
        help="Answer a request naming any model with the served one (responses still name the served "
        "model), for clients whose model name is hard-wired; off: another name is 404.",
    )
    tool_call_parser: Optional[str] = option(
        None,
        "--tool-call-parser",
        metavar="NAME",
        help="How replies' tool calls are read: hermes, llama3_json, mistral, phi4_mini_json, json (or the "
        "aliases qwen, qwen3, llama3, granite); default: the syntax the model's chat template teaches "
        "(hermes for a template that cannot render tools).",
    )
    reasoning_parser: str = option(
        "auto",
        "--reasoning-parser",
        metavar="NAME",
        help="How replies' thinking is read: auto (split `<think>` blocks into reasoning_content when "
        "the chat template writes them), think (always; aliases qwen3, deepseek_r1), none (all text "
        "is content).",
    )
    log_format: str = option(
        "text",
        "--log-format",
        help="The access log (one line per request on stderr, and one at shutdown): text or json.",
    )
    quiet: bool = option(
        False, "--quiet", help="No access-log line per request (start-up and shutdown lines stay)."
    )
    webui: bool = option(
        True,
        "--webui/--no-webui",
        help="Serve the chat page at / (static files in the package; no API key needed for the page "
        "itself). --no-webui: / is 404; the API, /health and /metrics are the same either way.",
    )
    log_level: str = option(
        "warning",
        "--log-level",
        help="uvicorn's own log level: critical, error, warning, info, debug (the access log is infer's).",
    )
