"""The shared command-line flags, defined once, and the one-line error exit every CLI module uses.

`@with_settings` adds every setting's flag to a Typer command (grouped in `--help`; the spellings are
the literal table `infer.profiles.flags.FLAGS`), hands what the user gave to `resolve_settings` with
the environment and the profile, and calls the command with `settings: Settings`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import os
import typing
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, NoReturn, Optional, get_args

import typer

from infer.cli.env_check import unknown_variable_warnings
from infer.cli.help import plain_text
from infer.engine import SamplingParamsError
from infer.profiles.loader import ProfileError
from infer.profiles.settings import SETTINGS, Settings, SettingsError, SettingSpec, resolve_settings

PANEL_MODEL = "Model & profile"
PANEL_ENGINE = "Engine"
PANEL_SAMPLING = "Sampling"
PANEL_SPECULATIVE = "Speculative decoding"
PANEL_GRAMMAR = "Structured output"

_PANELS = {"engine": PANEL_ENGINE, "sampler": PANEL_SAMPLING, "speculative": PANEL_SPECULATIVE}
_MODEL_PANEL_NAMES = ("profile", "model")
_GRAMMAR_METAVARS = {"json_schema": "FILE|JSON", "regex": "REGEX", "grammar": "FILE", "choice": "A,B,C"}
"""The output-constraint settings (profiles.constraints.GRAMMAR_SETTINGS but json_object), shown
in their own panel."""


def fail(message: str, code: int = 2) -> NoReturn:
    """Print `infer: error: <message>` as one line on stderr and exit with `code` (default 2)."""
    line = " ".join(str(message).split())
    if not line.startswith("infer:"):
        line = f"infer: error: {line}"
    typer.echo(line, err=True)
    raise SystemExit(code)


@contextmanager
def settings_errors() -> Iterator[None]:
    """Turn `SettingsError` / `SamplingParamsError` raised inside into `fail(...)` (one line, exit 2)."""
    try:
        yield
    except (SettingsError, ProfileError, SamplingParamsError) as exc:
        fail(str(exc))


def _panel(spec: SettingSpec) -> str:
    if spec.name == "n_predict":  # how much to generate sits with how to sample it, near the top
        return PANEL_SAMPLING
    if spec.name in _MODEL_PANEL_NAMES:
        return PANEL_MODEL
    if spec.name in _GRAMMAR_METAVARS or spec.name == "json_object":
        return PANEL_GRAMMAR
    return _PANELS.get(spec.section, PANEL_ENGINE)


def _metavar(spec: SettingSpec) -> str:
    choices = [a for a in get_args(spec.annotation) if isinstance(a, str)]
    if choices:
        return "|".join(choices)
    if spec.name == "profile":
        return "NAME|PATH"
    if spec.name in _GRAMMAR_METAVARS:
        return _GRAMMAR_METAVARS[spec.name]
    if spec.name == "model":
        return "NAME|PATH"
    if spec.name == "spec_draft_model":
        return "PATH"
    if spec.name == "samplers":
        return "'A;B;...'"
    base = [a for a in (*get_args(spec.annotation), spec.annotation) if a in (int, float, str)]
    return {int: "INT", float: "FLOAT", str: "TEXT"}.get(base[0], "TEXT") if base else "TEXT"


def _help(spec: SettingSpec) -> str:
    default = spec.default
    if isinstance(default, list):
        shown = ";".join(default) if spec.name == "samplers" else json.dumps(default)
    else:
        shown = "none" if default is None else str(default)
    return f"{plain_text(spec.description)} (env {spec.env}; default {shown})"


def _option_parameter(spec: SettingSpec) -> inspect.Parameter:
    """The Typer parameter for one setting. Values arrive as text (or a list of text, or a bool) and are
    parsed by `resolve_settings`, so a bad value is the same one-line error from a flag or an env var."""
    common: dict[str, Any] = {"help": _help(spec), "rich_help_panel": _panel(spec), "show_default": False}
    if spec.annotation is bool:
        annotation: Any = Optional[bool]
        decls = [f"{spec.flag}/--no-{spec.flag[2:]}"]
    elif spec.is_list and spec.name != "samplers":
        annotation = Optional[list[str]]
        decls = list(spec.flags)
        common["metavar"] = _GRAMMAR_METAVARS.get(spec.name, "TEXT")
    else:
        annotation = Optional[str]
        decls = list(spec.flags)
        common["metavar"] = _metavar(spec)
    return inspect.Parameter(
        spec.name,
        inspect.Parameter.KEYWORD_ONLY,
        default=typer.Option(None, *decls, **common),
        annotation=annotation,
    )


def _add_flag_parameters(
    command: Callable[..., Any], func: Callable[..., Any], hidden: str
) -> Callable[..., Any]:
    """`command` with `func`'s parameters (less `hidden`) plus one Typer option per setting, as
    Typer reads them from the signature; a parameter named like a setting is a programming error."""
    signature = inspect.signature(func, eval_str=True)
    own = [p for p in signature.parameters.values() if p.name != hidden]
    clash = sorted({p.name for p in own} & set(SETTINGS))
    if clash:
        raise TypeError(f"{func.__name__}: parameter(s) {', '.join(clash)} clash with shared settings flags")
    shared = [_option_parameter(spec) for spec in SETTINGS.values()]
    functools.update_wrapper(command, func)
    command.__signature__ = signature.replace(parameters=[*own, *shared])  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in (*own, *shared)}
    del command.__wrapped__  # type: ignore[attr-defined]  # Typer must see the new signature
    return command


def _given_flags(kwargs: dict[str, Any]) -> dict[str, Any]:
    """Take the settings' flags out of a command's keyword arguments: those the user gave."""
    flags = {name: kwargs.pop(name) for name in SETTINGS if name in kwargs}
    return {name: value for name, value in flags.items() if value is not None}


def shared_flags(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator: add every shared flag to a Typer command and call it with `flags`, a dict of only the
    flags the user gave (setting name -> raw value). For commands that add to the flags before resolving
    (`infer profiles show NAME`, `infer gate`, `infer bench`); most commands want `with_settings`."""

    def command(*args: Any, **kwargs: Any) -> Any:
        flags = _given_flags(kwargs)
        return func(*args, flags=flags, **kwargs)

    return _add_flag_parameters(command, func, "flags")


def resolve_or_fail(flags: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Settings:
    """`resolve_settings`, exiting with the one-line error (code 2) on a bad setting."""
    with settings_errors():
        return resolve_settings(flags, env=env)
    raise AssertionError("unreachable")  # pragma: no cover


def with_settings(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a Typer command taking `settings: Settings`: adds every shared flag (grouped in
    `--help`: Model & profile, Engine, Sampling, Speculative decoding), hands the raw values the user
    gave to `resolve_settings` (flag > env > profile > default), and calls `func(settings=..., **its own
    params)`. A bad setting (or a `SamplingParamsError` raised by the command) exits 2 with one line
    `infer: error: ...` on stderr, no traceback."""
    if "settings" not in inspect.signature(func).parameters:
        raise TypeError(f"{func.__name__}: a @with_settings command needs a `settings` parameter")

    def command(*args: Any, **kwargs: Any) -> Any:
        flags = _given_flags(kwargs)
        for line in unknown_variable_warnings(os.environ):
            typer.echo(line, err=True)
        with settings_errors():
            return func(*args, settings=resolve_settings(flags), **kwargs)

    return _add_flag_parameters(command, func, "settings")


def option(default: Any, *decls: str, **typer_kwargs: Any) -> Any:
    """A field of a command's options dataclass: its default, and the Typer option that sets it
    (`decls` its spellings; `help`, `min`, ... as `typer.Option` takes them). See `takes_options`."""
    return dataclasses.field(default=default, metadata={"typer": (decls, typer_kwargs)})


def takes_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for a Typer command `func(..., options: SomeOptions, ...)`: each field of the options
    dataclass (made with `option(...)`) becomes the command-line option its metadata describes, and
    `func` is called with one `SomeOptions` built from them, so the command body, and a test, take
    the options as one validated value instead of a long signature."""
    signature = inspect.signature(func, eval_str=True)
    options_type = signature.parameters["options"].annotation
    hints = typing.get_type_hints(options_type)
    fields = dataclasses.fields(options_type)
    parameters = []
    for spec in fields:
        decls, typer_kwargs = spec.metadata["typer"]
        default = typer.Option(spec.default, *decls, **typer_kwargs)
        parameters.append(
            inspect.Parameter(
                spec.name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=hints[spec.name]
            )
        )
    names = list(signature.parameters)
    at = names.index("options")  # the options take its place: --help lists them there
    leading = [signature.parameters[name] for name in names[:at]]
    trailing = [signature.parameters[name] for name in names[at + 1 :]]

    def command(*args: Any, **kwargs: Any) -> Any:
        values = {spec.name: kwargs.pop(spec.name) for spec in fields}
        return func(*args, options=options_type(**values), **kwargs)

    functools.update_wrapper(command, func)
    everything = [*leading, *parameters, *trailing]
    command.__signature__ = signature.replace(parameters=everything)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in everything}
    del command.__wrapped__  # type: ignore[attr-defined]
    return command
