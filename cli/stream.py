"""`infer stream`: text on stdout the moment each token is sampled; an interactive chat loop.

The engine runs its step loop in a background thread here, so Ctrl-C reaches this thread while it
waits for the next event: the request is cancelled cleanly, the partial stats go to stderr, and the
command exits 130 (the chat loop returns to its prompt instead).
"""

from __future__ import annotations

import sys
from typing import Annotated, Any, Optional

import typer

from infer.cli.generation import (
    PANEL_IO,
    IgnoreEosOption,
    ParseSpecialOption,
    PromptArgument,
    StopOption,
    prompt_request,
    read_prompt,
    stats_line,
)
from infer.cli.options import fail, with_settings
from infer.cli.runtime import open_engine
from infer.engine.runtime.engine import Engine
from infer.engine.runtime.events import DoneEvent, TokenEvent
from infer.engine.runtime.request import Request
from infer.profiles.settings import Settings

EXIT_INTERRUPTED = 130


class Interrupted(Exception):
    """Ctrl-C stopped a generation; carries its (cancelled) DoneEvent."""

    def __init__(self, done: DoneEvent) -> None:
        super().__init__("interrupted")
        self.done = done


def stream_request(engine: Engine, request: Request) -> DoneEvent:
    """Write each text delta to stdout as it arrives; raise Interrupted on Ctrl-C after cancelling."""
    handle = engine.submit(request)
    try:
        for event in handle:
            if isinstance(event, TokenEvent):
                if event.text:
                    sys.stdout.write(event.text)
                    sys.stdout.flush()
            else:
                return event
    except KeyboardInterrupt:
        handle.cancel()
        for event in handle:  # the rest of the queue, ending with DoneEvent(cancelled)
            if isinstance(event, DoneEvent):
                raise Interrupted(event) from None
    raise RuntimeError("stream ended without a DoneEvent")


def _chat_loop(engine: Engine, settings: Settings, stop: list[str] | None) -> None:
    history: list[dict[str, Any]] = []
    print("infer chat: /exit or Ctrl-D to leave, Ctrl-C stops a reply", file=sys.stderr)
    while True:
        try:
            line = input(">>> ")
        except EOFError:
            print(file=sys.stderr)
            return
        except KeyboardInterrupt:
            print(file=sys.stderr)
            continue
        if line.strip() in {"/exit", "/quit"}:
            return
        if not line.strip():
            continue
        history.append({"role": "user", "content": line})
        request = prompt_request(engine, settings, messages=history, chat=True, stop=stop)
        try:
            done = stream_request(engine, request)
        except Interrupted as interrupted:
            done = interrupted.done
        sys.stdout.write("\n")
        print(stats_line(done), file=sys.stderr)
        history.append({"role": "assistant", "content": done.text})


@with_settings
def stream(
    settings: Settings,
    prompt: PromptArgument = None,
    chat: Annotated[
        Optional[bool],
        typer.Option(
            "--chat/--raw",
            help="Apply the chat template (default: when the model has one); "
            "--chat without a prompt opens a chat loop.",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    stop: StopOption = None,
    ignore_eos: IgnoreEosOption = False,
    parse_special: ParseSpecialOption = True,
) -> None:
    """Stream a completion for PROMPT to stdout as it is generated (stats on stderr)."""
    text = read_prompt(prompt)
    if text is None and not chat:
        fail("give a PROMPT ('-' for standard input), or --chat for an interactive chat")
    engine = open_engine(settings, max_num_seqs=1)
    engine.start()
    try:
        if text is None:
            _chat_loop(engine, settings, stop)
            return
        request = prompt_request(
            engine,
            settings,
            prompt=text,
            chat=chat,
            parse_special=parse_special,
            stop=stop,
            ignore_eos=ignore_eos,
        )
        try:
            done = stream_request(engine, request)
        except Interrupted as interrupted:
            sys.stdout.write("\n")
            print(stats_line(interrupted.done), file=sys.stderr)
            raise typer.Exit(EXIT_INTERRUPTED) from None
        sys.stdout.write("\n")
        print(stats_line(done), file=sys.stderr)
        if done.finish_reason == "error":
            raise typer.Exit(1)
    finally:
        engine.shutdown()
