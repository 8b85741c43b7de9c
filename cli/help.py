"""Help that reads well at 80 columns, and a command group that imports a subcommand only when it runs.

Help is click's plain formatter (no Rich markup, so square brackets and angle brackets print as written,
and an option name is never cut: a long one puts its help on the next line), with the options grouped
under their `rich_help_panel` titles. `LazyGroup` lists its subcommands from one-line summaries and
imports a subcommand's module only when it is invoked, completed or asked for its own help, so
`infer --help` does not pay for numpy, the engine or FastAPI.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import typer
from typer.core import TyperArgument, TyperCommand, TyperGroup

if TYPE_CHECKING:  # Typer vendors its own click; these names are for annotations only
    from typer._click import Command, Context, HelpFormatter

_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")
_LITERAL = re.compile(r"``([^`]+)``")
_TYPE_METAVAR = re.compile(r"<(?:list\[)?(\w+)\]?>")
_TYPE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "path": "PATH", "bool": ""}


def _metavar(match: re.Match[str]) -> str:
    return _TYPE_NAMES.get(match.group(1), match.group(1).upper())


def plain_text(text: str) -> str:
    """Docstring text for a terminal: Sphinx roles (:func:`x`) and literals (``x``) become plain `x`."""
    return _LITERAL.sub(r"\1", _ROLE.sub(r"\1", text))


class PanelCommand(TyperCommand):
    """A command whose help lists its options in panels (Typer's `rich_help_panel`), as plain text."""

    first_panels: tuple[str, ...] = ("Arguments", "Input & output", "Sampling", "Structured output")
    """Panels shown first, in this order (what a user reaches for: what to say, how much and how to
    sample, as llama.cpp's and mlx-lm's help put them near the top); the others follow in the order
    they first appear (model, engine, speculative decoding, ...)."""

    def format_options(self, ctx: Context, formatter: HelpFormatter) -> None:
        """One section per panel: `first_panels` first, then the others in the order they appear."""
        panels: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            argument = isinstance(param, TyperArgument)
            panel = getattr(param, "rich_help_panel", None) or ("Arguments" if argument else "Options")
            # Typer shows a parameter without a metavar as its Python type (`<int>`): say INTEGER, and
            # nothing for an argument, whose name already says what it is.
            names = _TYPE_METAVAR.sub("" if argument else _metavar, record[0]).strip()
            panels.setdefault(panel, []).append((names, plain_text(record[1])))
        order = {title: i for i, title in enumerate(self.first_panels)}
        titles = sorted(panels, key=lambda t: order.get(t, len(order)))  # stable: the rest keep their order
        for title in titles:
            rows = panels[title]
            with formatter.section(title):
                formatter.write_dl(rows)


@dataclass(frozen=True)
class LazyCommand:
    """Where a subcommand lives and the one line `infer --help` shows for it."""

    module: str
    """Module to import, e.g. `infer.cli.generate`."""
    attr: str
    """A command function (registered with `PanelCommand`) or a `typer.Typer` app (a command group)."""
    summary: str
    """The line in `infer --help` (tests/test_help.py checks it against the command's own help)."""
    epilog: str | None = None
    """Examples shown at the end of the command's help."""


def load_command(name: str, spec: LazyCommand) -> Command:
    """Import `spec.module` and build the click command for `name`."""
    target = getattr(importlib.import_module(spec.module), spec.attr)
    if isinstance(target, typer.Typer):
        command = typer.main.get_command(target)
    else:
        single = typer.Typer(rich_markup_mode=None, add_completion=False)
        single.command(name, cls=PanelCommand, epilog=spec.epilog)(target)
        command = typer.main.get_command(single)
    command.name = name
    if spec.epilog and not command.epilog:
        command.epilog = spec.epilog
    return command


class LazyGroup(TyperGroup):
    """A Typer group whose subcommands are `LazyCommand`s, imported on first use.

    Subclasses set `lazy_commands`; the loaded commands are kept per group instance.
    """

    lazy_commands: dict[str, LazyCommand] = {}  # noqa: RUF012 - a class-level table, never mutated

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._loaded: dict[str, Command] = {}

    def list_commands(self, ctx: Context) -> list[str]:
        """The subcommand names, in the order of `lazy_commands`."""
        return list(self.lazy_commands)

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        """The subcommand, imported now if it has not been yet."""
        spec = self.lazy_commands.get(cmd_name)
        if spec is None:
            return None
        if cmd_name not in self._loaded:
            self._loaded[cmd_name] = load_command(cmd_name, spec)
        return self._loaded[cmd_name]

    def format_commands(self, ctx: Context, formatter: HelpFormatter) -> None:
        """The command list from the summaries, importing nothing."""
        rows = [(name, spec.summary) for name, spec in self.lazy_commands.items()]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
