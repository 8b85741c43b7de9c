"""`infer generate`: prompt (or chat messages) in, completion out.

On a terminal the text streams as it is sampled (`--no-stream` buffers it) after a transient loading
line on stderr; piped, it prints once at the end, as before. Ctrl-C prints what was generated and
exits 130.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer

from infer.cli.generation import (
    PANEL_IO,
    PromptArgument,
    PromptOptions,
    gather_prompt,
    prompt_request,
    result_json,
    stats_line,
    with_system,
)
from infer.cli.options import fail, takes_options, with_settings
from infer.cli.runtime import open_engine
from infer.cli.server_client import RemoteError
from infer.cli.terminal import EXIT_INTERRUPTED, Interrupted, StatusLine, run_request, write_stdout
from infer.engine import DoneEvent
from infer.profiles.settings import Settings


def _read_messages(path: Path) -> list[dict]:
    try:
        messages = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        fail(f"{path}: cannot read chat messages ({exc})")
    if not isinstance(messages, list):
        fail(f"{path}: expected a JSON list of {{role, content}} messages")
    return messages


def _check_combination(as_json: bool, stream: bool | None, interactive: bool, has_input: bool) -> None:
    """Flags that contradict each other are an error, never a silent choice."""
    if as_json and stream:
        fail("--json and --stream contradict each other: --json prints one object when generation ends")
    if interactive and as_json:
        fail("--interactive and --json contradict each other")
    if interactive and has_input:
        fail("--interactive reads prompts at the terminal: drop the PROMPT, -p, -f or --messages")


def _check_interactive(chat: bool | None, stream: bool | None, ignore_eos: bool, parse_special: bool) -> None:
    """`-i` chats with the template and streams each reply; flags it would not honour are errors."""
    unused = [
        name
        for name, given in (
            ("--raw", chat is False),
            ("--stream/--no-stream", stream is not None),
            ("--ignore-eos", ignore_eos),
            ("--no-parse-special", not parse_special),
        )
        if given
    ]
    if unused:
        fail(f"--interactive does not take {', '.join(unused)}")


@with_settings
@takes_options
def generate(
    settings: Settings,
    prompt: PromptArgument = None,
    *,
    options: PromptOptions,
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
            "--messages",
            metavar="FILE",
            help="JSON file with chat messages instead of a prompt.",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    as_json: Annotated[
        bool,
        typer.Option(
            "--json", help="Print one JSON object with text, ids, timings.", rich_help_panel=PANEL_IO
        ),
    ] = False,
    stream: Annotated[
        Optional[bool],
        typer.Option(
            "--stream/--no-stream",
            help="Print text as it is generated (default: when stdout is a terminal, without --json).",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    tools: Annotated[
        Optional[Path],
        typer.Option(
            "--tools",
            metavar="FILE",
            help="JSON file with function tools (OpenAI's shape) the model may call; the calls are "
            "printed as name(arguments), structured under --json.",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    tool_choice: Annotated[
        Optional[str],
        typer.Option(
            "--tool-choice",
            metavar="CHOICE",
            help="With --tools: auto (default), none, required, or a function's name (required and a "
            "name generate under a grammar that allows only valid calls).",
            rich_help_panel=PANEL_IO,
        ),
    ] = None,
    interactive: Annotated[
        bool,
        typer.Option(
            "-i", "--interactive", help="Chat at the terminal (as `infer chat`).", rich_help_panel=PANEL_IO
        ),
    ] = False,
) -> None:
    """Generate a completion for PROMPT and print it (streamed on a terminal)."""
    has_input = any(v is not None for v in (prompt, options.prompt_option, options.file, messages))
    _check_combination(as_json, stream, interactive, has_input)
    if interactive:
        from infer.cli.chat import chat_session

        _check_interactive(chat, stream, options.ignore_eos, options.parse_special)
        chat_session(settings, system=options.system, stop=options.stop, verbose=options.verbose)
        return
    text = gather_prompt(prompt, options.prompt_option, options.file)
    if messages is not None and (text is not None or options.system is not None):
        fail("--messages holds the whole conversation: drop the prompt and --system")
    chat_messages = _read_messages(messages) if messages else with_system(options.system, text, chat)
    if text is None and chat_messages is None:
        fail("give a PROMPT, -p TEXT, -f FILE, '-' for standard input, or --messages FILE")
    if tools is not None or tool_choice is not None:
        _generate_with_tools(
            settings,
            options,
            chat_messages or [{"role": "user", "content": text or ""}],
            chat=chat,
            tools=tools,
            tool_choice=tool_choice,
            as_json=as_json,
            stream=stream,
        )
        return
    streaming = stream if stream is not None else (sys.stdout.isatty() and not as_json)
    with StatusLine() as status:
        engine = open_engine(settings, max_num_seqs=1, status=status, verbose=options.verbose)
        request = prompt_request(
            engine,
            settings,
            prompt=None if chat_messages else text,
            messages=chat_messages,
            chat=True if options.system is not None else chat,
            parse_special=options.parse_special,
            stop=options.stop,
            ignore_eos=options.ignore_eos,
        )
        engine.start()
        interrupted = False
        try:
            done = run_request(engine, request, write_stdout if streaming else None, status)
        except Interrupted as stopped:
            done, interrupted = stopped.done, True
        except RemoteError as exc:  # the server refused the request: its message, exit 2
            status.clear()
            fail(str(exc))
        finally:
            engine.shutdown()
    _report(
        done,
        as_json=as_json,
        streamed=streaming,
        verbose=options.verbose,
        json_text=result_json(engine, request, done),
    )
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if done.finish_reason == "error":
        raise typer.Exit(1)


def _generate_with_tools(
    settings: Settings,
    options: PromptOptions,
    messages: list[dict],
    *,
    chat: bool | None,
    tools: Path | None,
    tool_choice: str | None,
    as_json: bool,
    stream: bool | None,
) -> None:
    """`--tools`: a chat request with function tools; its content and calls printed once it ends
    (a call is known only when it is complete, so nothing streams)."""
    from infer.cli.tool_use import read_choice, read_reply, read_tools, tool_request

    if tools is None:
        fail("--tool-choice needs --tools")
    if chat is False:
        fail("--tools needs the chat template: drop --raw")
    if stream:
        fail("--tools prints the reply once it is complete: drop --stream")
    choice = read_choice(read_tools(tools), tool_choice)
    with StatusLine() as status:
        engine = open_engine(settings, max_num_seqs=1, status=status, verbose=options.verbose)
        request, plan = tool_request(
            engine,
            settings,
            messages,
            choice=choice,
            stop=options.stop,
            ignore_eos=options.ignore_eos,
        )
        engine.start()
        interrupted = False
        try:
            done = run_request(engine, request, None, status)
        except Interrupted as stopped:
            done, interrupted = stopped.done, True
        finally:
            engine.shutdown()
    reply = read_reply(plan, done)
    if as_json:
        fields = json.loads(result_json(engine, request, done))
        fields.update(content=reply.content, tool_calls=reply.calls, finish_reason=reply.finish_reason)
        print(json.dumps(fields, ensure_ascii=False))
    else:
        print(reply.text())
    sys.stdout.flush()
    if options.verbose or done.finish_reason in ("error", "cancelled"):
        print(stats_line(done), file=sys.stderr)
    if interrupted:
        raise typer.Exit(EXIT_INTERRUPTED)
    if done.finish_reason == "error":
        raise typer.Exit(1)


def _report(done: DoneEvent, *, as_json: bool, streamed: bool, verbose: bool, json_text: str) -> None:
    """The result on stdout (the JSON object, the buffered text, or the newline after streamed text), and
    the stats line on stderr when asked for, interrupted or failed."""
    if as_json:
        print(json_text)
    elif streamed:
        sys.stdout.write("\n")
    else:
        print(done.text)
    sys.stdout.flush()
    if verbose or done.finish_reason in ("error", "cancelled"):
        print(stats_line(done), file=sys.stderr)
