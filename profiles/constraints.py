"""The output constraint a command runs with, from the resolved settings (`--json-schema FILE|JSON`,
`--json-object`, `--regex`, `--grammar FILE`, `--choice a,b,c`, their `INFER_*` twins and profile
keys), turned into the engine's `GrammarSpec` once: a bad one is a `SettingsError` naming where it
came from, before any model is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from infer.engine.grammar import GrammarError, GrammarSpec
from infer.profiles.settings import Settings, SettingsError

GRAMMAR_SETTINGS: tuple[str, ...] = ("json_schema", "json_object", "regex", "grammar", "choice")
"""The settings that constrain the output; at most one may be set."""


def _read(value: str, what: str, origin: str) -> str:
    try:
        return Path(value).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"{origin}: cannot read the {what} file {value!r} ({exc})") from None


def _choices(settings: Settings) -> tuple[str, ...]:
    """`--choice a,b,c` (each flag value split on commas, unless it is a JSON array); a profile or
    env list is taken item by item."""
    values = settings.choice
    if settings.source("choice").kind != "flag":
        return tuple(values)
    choices: list[str] = []
    for value in values:
        if value.lstrip().startswith("["):
            try:
                items = json.loads(value)
            except json.JSONDecodeError as exc:
                raise SettingsError(f"--choice: not a JSON array ({exc}): {value!r}") from None
            if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
                raise SettingsError(f"--choice: a JSON array of strings is needed, got {value!r}")
            choices += items
        else:
            choices += value.split(",")
    return tuple(choices)


def grammar_from_settings(settings: Settings) -> GrammarSpec | None:
    """The constraint the settings ask for, or None. Raises SettingsError (two set at once, an
    unreadable file, an invalid schema, regex or grammar), naming the flag, variable or file."""
    given = [
        name for name in GRAMMAR_SETTINGS if settings.value(name) and settings.source(name).kind != "default"
    ]
    if not given:
        return None
    if len(given) > 1:
        where = ", ".join(f"{name} ({settings.source(name)})" for name in given)
        raise SettingsError(f"only one output constraint can be given, got {where}")
    (name,) = given
    value = settings.value(name)
    origin = str(settings.source(name))
    try:
        if name == "json_schema":
            text = value if value.lstrip().startswith("{") else _read(value, "JSON schema", origin)
            return GrammarSpec.json_schema(text, parameter=name)
        if name == "json_object":
            return GrammarSpec("json_object", parameter=name)
        if name == "regex":
            return GrammarSpec("regex", value, parameter=name)
        if name == "grammar":
            inline = "\n" in value or (
                not Path(value).expanduser().is_file() and ("::=" in value or ":" in value.split("|")[0])
            )  # a file path normally; a grammar written out in full is taken as it is
            text = value if inline else _read(value, "grammar", origin)
            return GrammarSpec.lark_or_gbnf(text, parameter=name)
        return GrammarSpec("choice", choices=_choices(settings), parameter=name)
    except GrammarError as exc:
        raise SettingsError(f"{origin}: {name}: {exc}") from None


__all__ = ["GRAMMAR_SETTINGS", "grammar_from_settings"]
