"""`infer generate`: prompt (or chat messages) in, completion out."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from infer.cli.generation import (
    PANEL_IO,
    IgnoreEosOption,
    ParseSpecialOption,
    PromptArgument,
    StopOption,
    prompt_request,
    read_prompt,
    result_json,
    stats_line,
)
from infer.cli.options import fail, with_settings
from infer.cli.runtime import open_engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.profiles.settings import Settings


def _read_messages(path: Path) -> list[dict]:
    try:
        messages = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"{path}: cannot read chat messages ({exc})")
    if not isinstance(messages, list):
        fail(f"{path}: expected a JSON list of {{role, content}} messages")
    return messages


@with_settings
def generate(
    settings: Settings,
    prompt: PromptArgument = None,
    chat: Annotated[
        Optional[bool],
        typer.Option(
            "--chat/--raw",
            help="Apply the model's chat template (default: when it has one).",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    messages: Annotated[
        Optional[Path],
        typer.Option(
            "--messages", help="JSON file with chat messages instead of a prompt.", rich_help_panel=PANEL_IO
        ),
    ] = None,
    stop: StopOption = None,
    ignore_eos: IgnoreEosOption = False,
    parse_special: ParseSpecialOption = True,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object with text, ids, timings.", rich_help_panel=PANEL_IO
        ),
    ] = False,
    stream: Annotated[
        bool, typer.Option("--stream", help="Print text as it is generated.", rich_help_panel=PANEL_IO)
    ] = False,
) -> None:
    """Generate a completion for PROMPT and print it."""
    text = read_prompt(prompt)
    chat_messages = _read_messages(messages) if messages else None
    if text is None and chat_messages is None:
        fail("give a PROMPT, '-' for standard input, or --messages FILE")
    engine = open_engine(settings, max_num_seqs=1)
    request = prompt_request(
        engine,
        settings,
        prompt=text,
        messages=chat_messages,
        chat=chat,
        parse_special=parse_special,
        stop=stop,
        ignore_eos=ignore_eos,
    )
    done: DoneEvent | None = None
    for event in engine.submit(request):
        if isinstance(event, TokenEvent):
            if stream and not as_json and event.text:
                sys.stdout.write(event.text)
                sys.stdout.flush()
        else:
            done = event
    assert done is not None
    if as_json:
        print(result_json(engine, request, done))
    elif stream:
        sys.stdout.write("\n")
    else:
        print(done.text)
    if done.finish_reason == "error":
        print(stats_line(done), file=sys.stderr)
        raise typer.Exit(1)
