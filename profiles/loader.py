"""Find, read, validate and merge profile files (`extends:` chains), remembering the line of every key.

A profile is named either by a shipped name (`cpu`, `cuda`, ...: `profiles/<name>.yaml` in this package)
or by a path to any YAML file. `extends:` in a file names its parent the same way; a relative path there
is relative to the file that contains it. A child's keys override its parent's, key by key (also inside
`sampler:` and `speculative:`).
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from infer.profiles.schema import META_KEYS, SECTION_MODELS, ProfileFile

PROFILES_DIR = Path(__file__).resolve().parent
"""Where the shipped profiles live (package data)."""

DEFAULT_PROFILE = "cpu"


class ProfileError(Exception):
    """A profile cannot be found, read or validated. The message is one line naming the file, the key
    path and what is allowed. (`infer.profiles.settings.SettingsError` subclasses this.)"""


@dataclass(frozen=True)
class ProfileValue:
    """One value a profile file sets: the value, the file that set it and the line of its key."""

    value: Any
    path: Path
    line: int

    @property
    def location(self) -> str:
        """`profiles/cpu.yaml:12`-style label."""
        return f"{display_path(self.path)}:{self.line}"


@dataclass(frozen=True)
class LoadedProfile:
    """A profile with its `extends:` chain merged.

    `values` maps a key path (`backend`, `sampler.top_k`, `speculative.method`) to the value set by the
    nearest file in the chain; keys no file sets are absent (they take the built-in default).
    """

    name: str
    path: Path
    description: str | None
    chain: tuple[Path, ...]
    values: Mapping[str, ProfileValue]


def display_path(path: Path) -> str:
    """A short label for a profile file: `profiles/cpu.yaml` for shipped ones, else relative to the
    working directory when under it, else absolute."""
    path = Path(path)
    if path.parent == PROFILES_DIR:
        return f"profiles/{path.name}"
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except (OSError, ValueError):
        return str(path)


def shipped_profiles() -> list[Path]:
    """The profile files that ship with infer, sorted by name."""
    return sorted(PROFILES_DIR.glob("*.yaml"), key=lambda path: path.stem)


def _looks_like_path(ref: str) -> bool:
    return os.sep in ref or "/" in ref or ref.endswith((".yaml", ".yml"))


def find_profile(ref: str, *, relative_to: Path | None = None) -> Path:
    """The file for a profile reference: a shipped name (`cuda`) or a path (`./my.yaml`).

    A reference that looks like a path (has a slash or a .yaml/.yml suffix) is a path, relative to
    `relative_to` (default: the working directory); a bare name is a shipped profile, or a file of that
    name if one exists. Raises `ProfileError` naming the reference and the shipped names.
    """
    base = relative_to if relative_to is not None else Path.cwd()
    if _looks_like_path(ref):
        candidate = (base / Path(ref).expanduser()).resolve()
        if candidate.is_file():
            return candidate
        raise ProfileError(f"profile file {ref!r} not found (looked at {candidate})")
    shipped = PROFILES_DIR / f"{ref}.yaml"
    if shipped.is_file():
        return shipped
    local = (base / ref).resolve()
    if local.is_file():
        return local
    names = [p.stem for p in shipped_profiles()]
    hint = difflib.get_close_matches(ref, names, n=1)
    did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
    raise ProfileError(
        f"profile {ref!r} not found{did_you_mean}: "
        f"give a shipped name ({', '.join(names)}) or a path to a YAML file"
    )


def _key_lines(node: yaml.Node, label: str, prefix: str = "") -> dict[str, int]:
    """Line (1-based) of every mapping key, by dotted key path; rejects duplicate keys."""
    lines: dict[str, int] = {}
    if not isinstance(node, yaml.MappingNode):
        return lines
    for key_node, value_node in node.value:
        key = f"{prefix}{key_node.value}"
        line = key_node.start_mark.line + 1
        if key in lines:
            raise ProfileError(f"{label}:{line}: {key}: duplicate key (first set on line {lines[key]})")
        lines[key] = line
        if prefix == "" and key_node.value in SECTION_MODELS:
            lines.update(_key_lines(value_node, label, f"{key}."))
    return lines


def read_profile_file(path: Path) -> tuple[dict[str, Any], dict[str, int]]:
    """Parse one YAML file: (its mapping, the line of each key path). Raises `ProfileError`."""
    label = display_path(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ProfileError(f"{label}: cannot read profile: {exc.strerror or exc}") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{label}:{mark.line + 1}" if mark is not None else label
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ProfileError(f"{where}: YAML syntax error: {problem}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ProfileError(f"{label}:1: a profile must be a mapping of settings, got {type(data).__name__}")
    return data, _key_lines(node, label)


def _model_for(loc: tuple[Any, ...]) -> type[BaseModel]:
    if len(loc) > 1 and loc[0] in SECTION_MODELS:
        return SECTION_MODELS[loc[0]]
    return ProfileFile


def _allowed_keys(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def describe_validation_error(error: Mapping[str, Any], model: type[BaseModel] | None = None) -> str:
    """One pydantic error as 'key must be ... (got ...)' / 'unknown key ...; allowed: ...' text."""
    loc = tuple(str(part) for part in error.get("loc", ()))
    key = ".".join(loc)
    if error["type"] == "extra_forbidden":
        model = model or _model_for(loc)
        allowed = _allowed_keys(model)
        hint = difflib.get_close_matches(loc[-1], allowed, n=1)
        did_you_mean = f" (did you mean {hint[0]!r}?)" if hint else ""
        return f"unknown key {key!r}{did_you_mean}; allowed: {', '.join(allowed)}"
    message = str(error["msg"])
    if message.startswith("Input should be"):
        message = "must be" + message[len("Input should be") :]
    elif message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    got = f"(got {error.get('input')!r})"
    return f"{key} {message} {got}" if key else f"{message} {got}"


def _validate_file(path: Path, data: dict[str, Any], lines: dict[str, int]) -> ProfileFile:
    label = display_path(path)
    for section in SECTION_MODELS:
        if section in data and data[section] is None:
            data[section] = {}  # an empty `sampler:` section is fine
    try:
        return ProfileFile.model_validate(data, strict=True)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(str(part) for part in error["loc"])
        line = lines.get(".".join(loc[:2])) or lines.get(loc[0] if loc else "", 1)
        raise ProfileError(f"{label}:{line}: {describe_validation_error(error)}") from None


def _set_values(model: ProfileFile, path: Path, lines: dict[str, int]) -> dict[str, ProfileValue]:
    """The values a file sets itself (not defaults), by key path."""
    values: dict[str, ProfileValue] = {}
    for key in model.model_fields_set:
        if key in META_KEYS:
            continue
        if key in SECTION_MODELS:
            section = getattr(model, key)
            for sub in section.model_fields_set:
                dotted = f"{key}.{sub}"
                values[dotted] = ProfileValue(getattr(section, sub), path, lines.get(dotted, 1))
        else:
            values[key] = ProfileValue(getattr(model, key), path, lines.get(key, 1))
    return values


def load_profile(ref: str | Path, *, relative_to: Path | None = None) -> LoadedProfile:
    """Find, read, validate and merge a profile and everything it `extends:`.

    Raises `ProfileError` (one line: file:line, key path, what is allowed) for a missing file, a YAML
    syntax error, an unknown key, a wrong type, an out-of-range engine value or an `extends` cycle.
    """
    path = ref if isinstance(ref, Path) else find_profile(str(ref), relative_to=relative_to)
    path = Path(path).resolve()
    chain: list[Path] = []
    layers: list[dict[str, ProfileValue]] = []
    description: str | None = None
    current: Path | None = path
    while current is not None:
        if current in chain:
            cycle = " -> ".join(display_path(p) for p in [*chain[chain.index(current) :], current])
            raise ProfileError(
                f"{display_path(chain[-1])}: extends: cycle {cycle}; a profile cannot extend itself"
            )
        chain.append(current)
        data, lines = read_profile_file(current)
        model = _validate_file(current, data, lines)
        if current == path:
            description = model.description
        layers.append(_set_values(model, current, lines))
        if model.extends is None:
            current = None
        else:
            try:
                current = find_profile(model.extends, relative_to=current.parent)
            except ProfileError as exc:
                line = lines.get("extends", 1)
                raise ProfileError(f"{display_path(chain[-1])}:{line}: extends: {exc}") from None
    merged: dict[str, ProfileValue] = {}
    for layer in reversed(layers):
        merged.update(layer)
    name = path.stem
    return LoadedProfile(name=name, path=path, description=description, chain=tuple(chain), values=merged)
