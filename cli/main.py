"""The `infer` command-line entry point.

Subcommands are imported only when they run (`infer.cli.help.LazyGroup`): `infer --help`, `--version`
and shell completion of the command names load Typer and nothing else.
"""

from __future__ import annotations

import difflib
from typing import Annotated, Any, Optional

import typer

from infer.cli.help import LazyCommand, LazyGroup, load_command


def _examples(*lines: str) -> str:
    # "\b" keeps click from re-wrapping the example lines into one paragraph.
    return "Examples:\n\n\b\n" + "\n".join(f"  {line}" for line in lines)


COMMANDS: dict[str, LazyCommand] = {
    "generate": LazyCommand(
        "infer.cli.generate",
        "generate",
        "Generate a completion for a prompt and print it.",
        _examples(
            "infer generate 'Write a haiku about the sea'",
            "infer generate -p 'Hello' --system 'Answer in French' -n 64",
            "infer generate -f prompt.txt --no-stream > out.txt",
            "infer generate -m hf://OWNER/REPO/model.Q4_0.gguf 'Hi'",
            "infer generate --json --temp 0 'Hi' | jq .text",
        ),
    ),
    "chat": LazyCommand(
        "infer.cli.chat",
        "chat",
        "Chat with the model at the terminal (line editing, history, /clear, /exit).",
        _examples("infer chat", "infer chat --system 'You are terse.' -m mycopy"),
    ),
    "stream": LazyCommand(
        "infer.cli.stream",
        "stream",
        "Stream a completion to stdout as it is generated (stats on stderr).",
        _examples("infer stream 'Tell me a story' -n 200", "echo 'Hi' | infer stream -"),
    ),
    "serve": LazyCommand(
        "infer.cli.serve.command",
        "serve",
        "Serve the model over an OpenAI-compatible HTTP API.",
        _examples("infer serve --port 8080", "infer serve -m mycopy --alias gpt-4o-mini"),
    ),
    "bench": LazyCommand(
        "infer.cli.bench.command",
        "bench",
        "Measure prefill and decode throughput (llama-bench style).",
        _examples(
            "infer bench -p 512 -n 128 -r 3",
            "infer bench --concurrency 1,4,16 --json > run.json",
            "infer bench --concurrency 1,4,16 --plot sweep.png",
            "infer bench compare old.json new.json --fail-below 0.95",
            "infer bench compare a.json b.json c.json --plot runs.svg",
        ),
    ),
    "gate": LazyCommand(
        "infer.cli.gate.command",
        "gate",
        "Check pinned anchors for drift (CI): exit 1 if any token hash changed.",
        _examples("infer gate anchors/default.yaml", "infer gate anchors/default.yaml --junit out.xml"),
    ),
    "models": LazyCommand(
        "infer.cli.models_cmd",
        "models_app",
        "Fetch, list and remove models in the local cache.",
    ),
    "profiles": LazyCommand(
        "infer.cli.profiles_cmd",
        "profiles_app",
        "List the hardware profiles and show resolved settings.",
    ),
}


SUBCOMMANDS: dict[tuple[str, str], LazyCommand] = {
    ("bench", "compare"): LazyCommand(
        "infer.cli.bench.compare",
        "compare",
        "Compare bench runs: every common figure with ratios, and their fingerprints' differences.",
        _examples(
            "infer bench compare old.json new.json",
            "infer bench compare old.json new.json --fail-below 0.95",
            "infer bench compare a.json b.json --plot runs.png",
        ),
    ),
}
"""Commands under a command that runs by itself (`infer bench` measures; `infer bench compare` reads
what it wrote), reached as `infer NAME SUB ...`."""


COMMAND_HABITS = {
    "run": "generate",
    "pull": "models pull",
    "list": "models list",
    "ls": "models list",
    "rm": "models rm",
    "server": "serve",
    "complete": "generate",
}
"""Commands other tools spell differently (ollama's run/pull/list/rm, llama.cpp's server) -> ours."""


class InferGroup(LazyGroup):
    """The top-level `infer` group: Ctrl-C anywhere (loading a model, say) exits 130 without a traceback
    or click's "Aborted!"; commands that generate handle it themselves and print what they have."""

    lazy_commands = COMMANDS

    def resolve_command(self, ctx: typer.Context, args: list[str]) -> tuple[str | None, Any, list[str]]:
        """The subcommand named by `args[0]`; an unknown name is a usage error that says which command
        was probably meant: a habit from ollama or llama.cpp (`run`, `pull`, `list`, ...) or the
        closest spelling (`genrate`)."""
        nested = SUBCOMMANDS.get((args[0], args[1])) if len(args) >= 2 else None
        if nested is not None:
            name = f"{args[0]} {args[1]}"
            return name, load_command(name, nested), args[2:]
        name = args[0] if args else None
        if name is not None and not name.startswith("-") and self.get_command(ctx, name) is None:
            guess = COMMAND_HABITS.get(name)
            if guess is None:
                close = difflib.get_close_matches(name, self.list_commands(ctx), n=1, cutoff=0.6)
                guess = close[0] if close else None
            if guess is not None:
                # ctx.fail: the usage error of the click typer runs on (typer 0.29 vendors its own)
                ctx.fail(f"No such command '{name}'. Did you mean 'infer {guess}'?")
        return super().resolve_command(ctx, args)

    def invoke(self, ctx: typer.Context) -> object:
        """Run the subcommand; KeyboardInterrupt becomes exit code 130 (128 + SIGINT), as in a shell."""
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            typer.echo("", err=True)
            raise SystemExit(130) from None


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("infer")
    except PackageNotFoundError:  # running from a source tree that was never installed
        return "unknown"


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"infer {_version()}")
        raise typer.Exit()


app = typer.Typer(
    cls=InferGroup,
    no_args_is_help=True,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    help="Run LLMs on your own hardware.",
    epilog=_examples(
        "infer generate 'Write a haiku about the sea'",
        "infer chat",
        "infer models list",
        "infer COMMAND -h    (help for one command)",
    ),
)


@app.callback()
def root(
    version: Annotated[
        Optional[bool],
        typer.Option(
            "--version", "-V", callback=_print_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    """Run LLMs on your own hardware."""


def main() -> None:
    """Console-script entry point."""
    app(prog_name="infer")
