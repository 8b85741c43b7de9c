"""`infer stream`: text on stdout the moment each token is sampled; `--chat` without a prompt opens
`infer chat`.

The engine runs its step loop in a background thread here, so Ctrl-C reaches this thread while it
waits for the next event: the request is cancelled cleanly, the partial stats go to stderr, and the
command exits 130.
"""

from __future__ import annotations

import sys
from typing import Annotated, Optional

import typer

from infer.cli.generation import (
    PANEL_IO,
    PromptArgument,
    PromptOptions,
    gather_prompt,
    prompt_request,
    stats_line,
    with_system,
)
from infer.cli.options import fail, takes_options, with_settings
from infer.cli.runtime import open_engine
from infer.cli.server_client import RemoteError
from infer.cli.terminal import EXIT_INTERRUPTED, Interrupted, StatusLine, run_request, write_stdout
from infer.profiles.settings import Settings


@with_settings
@takes_options
def stream(
    settings: Settings,
    prompt: PromptArgument = None,
    *,
    options: PromptOptions,
    chat: Annotated[
        Optional[bool],
        typer.Option(
            "--chat/--raw",
            help="Apply the chat template (default: when the model has one); "
            "--chat without a prompt opens a chat loop.",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
) -> None:
    """Stream a completion for PROMPT to stdout as it is generated (stats on stderr)."""
    text = gather_prompt(prompt, options.prompt_option, options.file)
    if text is None and not chat:
        fail("give a PROMPT ('-' for standard input, -p TEXT, -f FILE), or --chat for an interactive chat")
    if text is None:
        from infer.cli.chat import chat_session

        if options.ignore_eos or not options.parse_special:
            fail("the chat loop does not take --ignore-eos or --no-parse-special")
        chat_session(settings, system=options.system, stop=options.stop, verbose=options.verbose)
        return
    messages = with_system(options.system, text, chat)
    with StatusLine() as status:
        engine = open_engine(settings, max_num_seqs=1, status=status, verbose=options.verbose)
        engine.start()
        try:
            request = prompt_request(
                engine,
                settings,
                prompt=None if messages else text,
                messages=messages,
                chat=True if messages else chat,
                parse_special=options.parse_special,
                stop=options.stop,
                ignore_eos=options.ignore_eos,
            )
            try:
                done = run_request(engine, request, write_stdout, status)
            except Interrupted as interrupted:
                sys.stdout.write("\n")
                print(stats_line(interrupted.done), file=sys.stderr)
                raise typer.Exit(EXIT_INTERRUPTED) from None
            except RemoteError as exc:  # the server refused the request: its message, exit 2
                status.clear()
                fail(str(exc))
        finally:
            engine.shutdown()
    sys.stdout.write("\n")
    print(stats_line(done), file=sys.stderr)
    if done.finish_reason == "error":
        raise typer.Exit(1)
