"""The list bounds of SamplingParams (sampler stages, DRY breakers) and the error every field check
raises: a list a request carries is capped where it is parsed, so its length never reaches the step
loop, where every stage and breaker would cost every request batched with it."""

from __future__ import annotations

from typing import Any


class SamplingParamsError(ValueError):
    """A sampling parameter is invalid; ``parameter`` names the field, ``value`` is what was given."""

    def __init__(self, parameter: str, value: Any, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


MAX_SAMPLER_STAGES = 32
"""The most stages ``samplers`` may list (llama.cpp's default chain has 9; a stage may repeat). Every
stage runs at every step, so an unbounded list would slow every request batched with this one."""

MAX_DRY_BREAKERS = 64
"""The most ``dry_sequence_breakers`` one request may give (llama.cpp's default has 4)."""

MAX_DRY_BREAKER_CHARS = 40
"""The longest DRY sequence breaker, in characters (llama.cpp truncates longer ones to 40)."""


def too_many(name: str, count: int, limit: int, what: str) -> SamplingParamsError:
    """The error for a list of `count` `what` where at most `limit` are accepted."""
    return SamplingParamsError(
        name, f"<{count} {what}>", f"{name} has {count} {what}; at most {limit} are accepted."
    )


def parse_breakers(value: Any) -> tuple[str, ...]:
    """`dry_sequence_breakers` as a tuple: non-empty strings, at most MAX_DRY_BREAKERS of at most
    MAX_DRY_BREAKER_CHARS characters."""
    name = "dry_sequence_breakers"
    if not isinstance(value, (list, tuple)) or not all(isinstance(b, str) and b for b in value):
        shown = value if len(str(value)) < 200 else "<list>"
        raise SamplingParamsError(name, shown, f"{name} must be a list of non-empty strings, got {shown!r}.")
    if len(value) > MAX_DRY_BREAKERS:
        raise too_many(name, len(value), MAX_DRY_BREAKERS, "strings")
    long = next((b for b in value if len(b) > MAX_DRY_BREAKER_CHARS), None)
    if long is not None:
        raise SamplingParamsError(
            name,
            long[:20] + "...",
            f"{name} entries may be at most {MAX_DRY_BREAKER_CHARS} characters, got one of {len(long)}.",
        )
    return tuple(value)
