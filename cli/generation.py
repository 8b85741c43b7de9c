"""What `generate` and `stream` share: reading the prompt, building the request, reporting results."""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from infer.cli.options import fail, option
from infer.engine import ChatTemplateError, DoneEvent, Engine, Request, prompt_ids, spec_summary
from infer.profiles.requests import build_request
from infer.profiles.settings import Settings, SettingsError

PANEL_IO = "Input & output"

PromptArgument = Annotated[
    Optional[str], typer.Argument(metavar="PROMPT", help="Prompt text; '-' reads standard input.")
]


@dataclass(frozen=True)
class ChatOptions:
    """What every command that chats takes: a system message, stop strings, how much to report."""

    system: Optional[str] = option(
        None,
        "--system",
        "--system-prompt",
        metavar="TEXT",
        help="System message (needs the chat template).",
        rich_help_panel=PANEL_IO,
    )
    stop: Optional[list[str]] = option(
        None, "--stop", metavar="TEXT", help="Stop string (repeatable).", rich_help_panel=PANEL_IO
    )
    verbose: bool = option(
        False,
        "-v",
        "--verbose",
        help="Also print the load time and the stats line on stderr.",
        rich_help_panel=PANEL_IO,
    )


@dataclass(frozen=True)
class PromptOptions(ChatOptions):
    """What a one-shot command (generate, stream) takes besides the PROMPT argument."""

    prompt_option: Optional[str] = option(
        None, "-p", "--prompt", help="Prompt text (as the PROMPT argument).", rich_help_panel=PANEL_IO
    )
    file: Optional[Path] = option(
        None,
        "-f",
        "--file",
        metavar="FILE",
        help="Read the prompt from FILE ('-' = standard input).",
        rich_help_panel=PANEL_IO,
    )
    ignore_eos: bool = option(
        False, "--ignore-eos", help="Keep generating past end-of-sequence.", rich_help_panel=PANEL_IO
    )
    parse_special: bool = option(
        True,
        "--parse-special/--no-parse-special",
        help="Parse special-token text such as <|im_start|> in a raw prompt.",
        rich_help_panel=PANEL_IO,
    )


def read_prompt(prompt: str | None) -> str | None:
    """The prompt argument, or standard input when it is `-`."""
    if prompt == "-":
        return sys.stdin.read()
    return prompt


def gather_prompt(argument: str | None, option: str | None = None, file: Path | None = None) -> str | None:
    """The prompt from exactly one of the PROMPT argument, `-p/--prompt` or `-f/--file` (None if none);
    two of them at once is an error, not a silent choice."""
    given = [
        name for name, value in (("PROMPT", argument), ("-p", option), ("-f", file)) if value is not None
    ]
    if len(given) > 1:
        fail(f"give the prompt once, not as {' and '.join(given)}")
    if file is not None:
        if str(file) == "-":
            return sys.stdin.read()
        try:
            return file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            fail(f"{file}: cannot read the prompt ({exc})")
    return read_prompt(argument if argument is not None else option)


def with_system(system: str | None, prompt: str | None, chat: bool | None) -> list[dict[str, Any]] | None:
    """Chat messages for `--system` and a prompt (None without `--system`); `--system --raw` is an error."""
    if system is None:
        return None
    if chat is False:
        fail("--system needs the chat template: drop --raw")
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    if prompt is not None:
        messages.append({"role": "user", "content": prompt})
    return messages


def prompt_request(
    engine: Engine,
    settings: Settings,
    *,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    chat: bool | None = None,
    parse_special: bool = True,
    stop: list[str] | None = None,
    ignore_eos: bool = False,
) -> Request:
    """The Request for CLI input (a prompt or chat messages) under resolved settings, made by
    `build_request` as on every surface (a `RemoteRequest` for a server, made by the remote engine);
    bad input exits 2 with one line."""
    if is_remote_engine(engine):
        try:
            return engine.request(  # type: ignore[attr-defined,no-any-return]
                settings,
                prompt=prompt,
                messages=messages,
                chat=chat,
                parse_special=parse_special,
                stop=stop,
                ignore_eos=ignore_eos,
            )
        except (ValueError, SettingsError, OSError) as exc:
            fail(str(exc))
    use_chat = chat if chat is not None else engine.tokenizer.chat_template is not None
    try:
        ids = prompt_ids(
            engine.tokenizer, prompt=prompt, messages=messages, chat=use_chat, parse_special=parse_special
        )
        request = build_request(ids, settings, stop=stop or (), ignore_eos=ignore_eos)
        engine.validate(request)
    except (ChatTemplateError, ValueError) as exc:  # RequestError is a ValueError
        fail(str(exc))
    return request


def is_remote_engine(engine: Any) -> bool:
    """Whether `engine` is a server standing in for the local engine (`backend: remote`)."""
    from infer.cli.remote.client import RemoteEngine

    return isinstance(engine, RemoteEngine)


def stats_line(done: DoneEvent) -> str:
    """The one-line summary printed on stderr: tokens, TTFT, decode speed, finish reason, and the
    speculation counters when the request speculated."""
    tokens = done.usage.completion_tokens
    speed = done.timings.decode_tokens_per_s(tokens)
    line = (
        f"infer: {tokens} tokens, prompt {done.usage.prompt_tokens}, TTFT {done.timings.ttft_s:.2f} s, "
        f"{speed:.1f} tok/s decode, finish {done.finish_reason}, seed {done.seed}"
    )
    spec = spec_summary(done.counters)
    if spec is not None:
        line += (
            f", drafts {spec['drafts']}, accepted {spec['accepted_tokens']}/{spec['draft_tokens']} "
            f"({spec['acceptance_rate']:.0%}), mean accepted length {spec['mean_accepted_length']:.2f}"
        )
    if done.error:
        line += f" -- {done.error}"
    return line


def json_number(value: float) -> float | None:
    """JSON-safe float: -inf/nan become null."""
    return value if math.isfinite(value) else None


def generation_fields(
    done: DoneEvent, load_s: float, prompt_ids: list[int] | None, token_ids: list[int] | None
) -> dict[str, Any]:
    """The keys every `--json` object of `infer generate` has, local or against a server, in order:
    the text and ids, how it ended, the usage and the timings measured here."""
    timings = done.timings
    return {
        "text": done.text,
        "prompt_ids": prompt_ids,
        "token_ids": token_ids,
        "finish_reason": done.finish_reason,
        "error": done.error,
        "seed": done.seed,
        "prompt_tokens": done.usage.prompt_tokens,
        "completion_tokens": done.usage.completion_tokens,
        "load_s": round(load_s, 4),
        "prefill_s": round(timings.prefill_s, 4),
        "decode_s": round(timings.decode_s, 4),
        "ttft_s": round(timings.ttft_s, 4),
    }


def result_json(engine: Engine, request: Request, done: DoneEvent) -> str:
    """The `--json` object of `infer generate` (with the server's usage and timings for a server)."""
    if is_remote_engine(engine):
        from infer.cli.remote.client import server_json

        return server_json(engine, request, done)  # type: ignore[arg-type]
    timings = done.timings
    fields = generation_fields(done, engine.load_seconds, list(request.prompt_ids), list(done.token_ids))
    return json.dumps(
        fields
        | {
            "prefill_tokens_per_s": round(timings.prefill_tokens_per_s(done.usage.prompt_tokens), 2),
            "decode_tokens_per_s": round(timings.decode_tokens_per_s(done.usage.completion_tokens), 2),
            "speculative": spec_summary(done.counters),
        },
        ensure_ascii=False,
    )
