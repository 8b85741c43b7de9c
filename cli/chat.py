"""`infer chat` (also `infer generate -i` and `infer stream --chat`): a conversation at the terminal.

Lines are read with prompt_toolkit (arrow keys, Ctrl-R search, history kept in
`$INFER_HOME/chat_history`) when stdin and stdout are a terminal, and plainly otherwise (piped input,
no prompt written to stdout). `/clear` forgets the conversation, `/exit` (or Ctrl-D) leaves, Ctrl-C
stops a reply. Each reply streams as it is sampled, with its stats line on stderr.
"""

from __future__ import annotations

import sys
from typing import Any

from infer.cli.generation import ChatOptions, is_remote_engine, prompt_request, stats_line
from infer.cli.model_store import infer_home
from infer.cli.options import fail, takes_options, with_settings
from infer.cli.runtime import open_engine
from infer.cli.server_client import RemoteError
from infer.cli.terminal import Interrupted, StatusLine, run_request, write_stdout
from infer.engine import Engine
from infer.profiles.settings import Settings

EXIT_WORDS = frozenset({"/exit", "/quit", "/bye"})
HELP_WORDS = frozenset({"/help", "/?"})
"""What ollama and llama.cpp's chat users type for help."""
HELP = (
    "infer chat: /clear forgets the conversation, /exit or Ctrl-D leaves, Ctrl-C stops a reply, "
    "/help shows this"
)


class LineReader:
    """Reads one line of input: prompt_toolkit at a terminal, plain `readline` from a pipe."""

    def __init__(self) -> None:
        self._session: Any = None
        if sys.stdin.isatty() and sys.stdout.isatty():
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory, InMemoryHistory

            try:
                infer_home().mkdir(parents=True, exist_ok=True)
                history: Any = FileHistory(str(infer_home() / "chat_history"))
            except OSError:  # a read-only home: history for this session only
                history = InMemoryHistory()
            self._session = PromptSession(history=history)

    def read(self, prompt: str) -> str:
        """The next line (without its newline); EOFError at the end, KeyboardInterrupt on Ctrl-C."""
        if self._session is not None:
            return self._session.prompt(prompt)
        line = sys.stdin.readline()
        if not line:
            raise EOFError
        return line.rstrip("\n")


def _opening(system: str | None) -> list[dict[str, Any]]:
    return [{"role": "system", "content": system}] if system else []


def chat_loop(engine: Engine, settings: Settings, *, system: str | None, stop: list[str] | None) -> None:
    """Read a line, answer it with the whole conversation so far, repeat until /exit or end of input."""
    reader = LineReader()
    history = _opening(system)
    print(HELP, file=sys.stderr, flush=True)
    while True:
        try:
            line = reader.read(">>> ").strip()
        except EOFError:
            return
        except KeyboardInterrupt:
            continue
        if not line:
            continue
        if line in EXIT_WORDS:
            return
        if line in HELP_WORDS:
            print(HELP, file=sys.stderr, flush=True)
            continue
        if line == "/clear":
            history = _opening(system)
            print("infer: conversation cleared", file=sys.stderr, flush=True)
            continue
        if line.startswith("/") and " " not in line:
            print(f"infer: unknown command {line}; {HELP.split(': ', 1)[1]}", file=sys.stderr, flush=True)
            continue
        history.append({"role": "user", "content": line})
        try:
            request = prompt_request(engine, settings, messages=history, chat=True, stop=stop)
        except SystemExit:  # the one-line reason is printed (e.g. the context is full); keep chatting
            history.pop()
            continue
        with StatusLine() as status:
            try:
                done = run_request(engine, request, write_stdout, status)
            except Interrupted as stopped:
                done = stopped.done
            except RemoteError as exc:  # the server refused this turn: say why, keep chatting
                status.clear()
                print(f"infer: error: {exc}", file=sys.stderr, flush=True)
                history.pop()
                continue
        sys.stdout.write("\n")
        sys.stdout.flush()
        print(stats_line(done), file=sys.stderr, flush=True)
        history.append({"role": "assistant", "content": done.text})


def chat_prefix_caching(settings: Settings) -> bool:
    """Prefix caching for a chat: on unless the user set it (flag, variable or profile), since every
    turn's prompt starts with the whole conversation before it; the tokens are the same either way
    (tests/test_prefix_cache.py), only the next turn's prefill is saved."""
    return True if settings.source("prefix_caching").kind == "default" else bool(settings.prefix_caching)


def chat_session(
    settings: Settings, *, system: str | None, stop: list[str] | None, verbose: bool = False
) -> None:
    """Load the model (with a loading line on the terminal) and run the chat loop."""
    with StatusLine() as status:
        engine = open_engine(
            settings,
            max_num_seqs=1,
            prefix_caching=chat_prefix_caching(settings),
            status=status,
            verbose=verbose,
        )
    if not is_remote_engine(engine) and engine.tokenizer.chat_template is None:
        fail("this model has no chat template: use `infer generate --raw` or `infer stream --raw`")
    engine.start()
    try:
        chat_loop(engine, settings, system=system, stop=stop)
    finally:
        engine.shutdown()


@with_settings
@takes_options
def chat(
    settings: Settings,
    *,
    options: ChatOptions,
) -> None:
    """Chat with the model at the terminal (line editing, history, /clear, /exit)."""
    chat_session(settings, system=options.system, stop=options.stop, verbose=options.verbose)
