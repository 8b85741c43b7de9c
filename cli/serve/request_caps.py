"""The request caps: how many items each list in a request body may hold, checked when the body is
validated (a longer list is a 400 naming the field, before any of it is rendered, tokenized or
compiled) and written into the OpenAPI document as `maxItems`. The engine's own caps (sampler stages,
DRY breakers, stop strings, `logit_bias` entries, grammar size) are checked again by `SamplingParams`
and `Request`. The HTTP bounds (body size, header deadline, connections) are in limits.py.
"""

from __future__ import annotations

from infer.engine import (
    MAX_DRY_BREAKER_CHARS,
    MAX_DRY_BREAKERS,
    MAX_SAMPLER_STAGES,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
)

MAX_MESSAGES = 2048
"""Chat messages, or Responses input items, per request (OpenAI's own limit)."""
MAX_CONTENT_PARTS = 64
"""Content parts per message."""
MAX_TOOLS = 128
"""`tools` entries (OpenAI's own limit); each tool's schema is size-checked before it joins the prompt."""
MAX_PROMPTS = 128
"""Prompts in one /v1/completions request; with `n`, at most this many choices in all."""
MAX_PROMPT_TOKEN_IDS = 1 << 20
"""Token ids in one prompt given as ids (any prompt longer than the context is refused anyway)."""
MAX_INCLUDE = 16
"""`include` entries on /v1/responses."""
MAX_METADATA = 16
"""`metadata` keys on /v1/responses (OpenAI's own limit)."""

LIST_CAPS: dict[str, int] = {
    "samplers": MAX_SAMPLER_STAGES,
    "dry_sequence_breakers": MAX_DRY_BREAKERS,
    "stop": MAX_STOP_STRINGS,
}
"""The sampler and stop fields whose lists the API body caps (the engine checks them again)."""
STRING_CAPS: dict[str, int] = {"dry_sequence_breakers": MAX_DRY_BREAKER_CHARS, "stop": MAX_STOP_CHARS}
"""The longest string each of those lists may hold."""

__all__ = [
    "LIST_CAPS",
    "MAX_CONTENT_PARTS",
    "MAX_INCLUDE",
    "MAX_MESSAGES",
    "MAX_METADATA",
    "MAX_PROMPTS",
    "MAX_PROMPT_TOKEN_IDS",
    "MAX_TOOLS",
    "STRING_CAPS",
]
