"""Where a JSON schema's output may put whitespace: one fixed layout, or llama.cpp's bounded rule.

By default a generated JSON value has one layout, `{"a": 1, "b": [2, 3]}` (`", "` and `": "`, no
other whitespace): measured on the default model (SmolLM2-135M, temperature 0, `json_object`, "Write
a sentence about the sea."), the fixed layout gives `{"The sea": "The sea"}` and stops, while
llama.cpp's flexible rule lets it write a newline before every `:` and `,` until the token limit, and
even one optional space makes it repeat `"The sea" :"The sea" ,` until the limit. A small model does
better with no choice to make.

A schema may ask for more through llguidance's own top-level `"x-guidance"` key:
`{"whitespace_flexible": true}` accepts llama.cpp's `space` rule (:data:`WHITESPACE`: nothing, one
space, or one or two newlines then up to 20 spaces or tabs) around every token, so compact, spaced
and indented layouts all match and whitespace stays bounded; `item_separator`, `key_separator` and
`whitespace_pattern` may be given too. Any other `x-guidance` key (`lenient`, which would let
llguidance ignore keywords, `coerce_one_of`, ...) is refused: infer accepts no option it would not
honour as documented.
"""

from __future__ import annotations

from typing import Any

FIXED: dict[str, Any] = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
"""llguidance's JSON options for the default layout."""

WHITESPACE = r"(?: |\n{1,2}[ \t]{0,20})"
"""llama.cpp's `space` rule (`"" | " " | "\\n"{1,2} [ \\t]{0,20}`) as llguidance's whitespace
pattern (which it applies at most once between two tokens)."""

FLEXIBLE: dict[str, Any] = {
    "whitespace_flexible": True,
    "item_separator": ",",
    "key_separator": ":",
    "whitespace_pattern": WHITESPACE,
}
"""llguidance's JSON options for `"x-guidance": {"whitespace_flexible": true}`."""

LAYOUT_KEYS = ("whitespace_flexible", "item_separator", "key_separator", "whitespace_pattern")
"""The `x-guidance` keys a schema may set."""


class LayoutError(ValueError):
    """A schema's `x-guidance` that infer does not accept; the message is one line."""


def layout_options(schema: Any) -> dict[str, Any]:
    """llguidance's JSON compile options for `schema` (FIXED, or FLEXIBLE and what its
    `x-guidance` sets); LayoutError for an `x-guidance` key or value that is not accepted."""
    given = schema.get("x-guidance", {}) if isinstance(schema, dict) else {}
    if not isinstance(given, dict):
        raise LayoutError("x-guidance must be an object")
    unknown = sorted(set(given) - set(LAYOUT_KEYS))
    if unknown:
        raise LayoutError(
            f"x-guidance key(s) {', '.join(unknown)} not accepted; accepted: {', '.join(LAYOUT_KEYS)}"
        )
    if not isinstance(given.get("whitespace_flexible", False), bool):
        raise LayoutError("x-guidance.whitespace_flexible must be true or false")
    for key, mark in (("item_separator", ","), ("key_separator", ":")):
        value = given.get(key, mark)
        if not isinstance(value, str) or value.strip() != mark:
            raise LayoutError(f"x-guidance.{key} must be {mark!r} with optional whitespace around it")
    if not isinstance(given.get("whitespace_pattern", ""), str):
        raise LayoutError("x-guidance.whitespace_pattern must be a string (a regex)")
    options = dict(FLEXIBLE if given.get("whitespace_flexible") else FIXED)
    options.update(given)
    return options


__all__ = ["FIXED", "FLEXIBLE", "LAYOUT_KEYS", "WHITESPACE", "LayoutError", "layout_options"]
