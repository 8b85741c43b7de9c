"""Text as a typed field value: how `SamplingParams.parse` reads a flag's or an environment variable's
text by the field's own annotation, so the settings layer hands text over unparsed."""

from __future__ import annotations

import json
import typing
from typing import Any

_TRUE_WORDS = frozenset({"1", "true", "yes", "on"})
_FALSE_WORDS = frozenset({"0", "false", "no", "off"})


def parse_text(value: Any, hint: Any) -> Any:
    """`value` parsed as a field of type `hint` when it is text ("0.5" -> 0.5, "none" -> None for an
    optional field, a JSON array or ';'-separated items for a tuple), else `value` itself. Raises
    ValueError saying what the field must be."""
    if not isinstance(value, str) or hint is str:
        return value
    text = value.strip()
    if type(None) in typing.get_args(hint):
        if text.lower() in ("none", "null"):
            return None
        hint = next(a for a in typing.get_args(hint) if a is not type(None))
    if hint is bool:
        if text.lower() not in _TRUE_WORDS | _FALSE_WORDS:
            raise ValueError("must be true or false")
        return text.lower() in _TRUE_WORDS
    if hint in (int, float):
        try:
            return hint(text)
        except ValueError:
            raise ValueError("must be an integer" if hint is int else "must be a number") from None
    if typing.get_origin(hint) is tuple:
        return split_list(text)
    return value


def split_list(text: str) -> list[Any]:
    """A list from text: a JSON array, or items separated by ';' (llama.cpp's --samplers form)."""
    if not text.startswith("["):
        return [item.strip() for item in text.split(";") if item.strip()]
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise ValueError(f"must be a JSON array or ';'-separated items ({exc})") from None
    if not isinstance(parsed, list):
        raise ValueError("must be a JSON array or ';'-separated items")
    return parsed
