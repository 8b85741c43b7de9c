"""What a request asks of speculative decoding: the method and its limits, validated once."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

SpecMethod = Literal["prompt_lookup", "draft_model"]
"""How drafts are proposed: n-gram lookup in the sequence's own tokens, or a smaller model."""

SPEC_METHODS: tuple[str, ...] = ("prompt_lookup", "draft_model")


class SpecConfigError(ValueError):
    """A speculative setting out of range; `parameter` names the setting (`spec_num_tokens`, ...)."""

    def __init__(self, message: str, parameter: str, compared_with: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.compared_with = compared_with
        """The other setting the refused value was checked against (`spec_num_tokens`, ...), if any."""


@dataclass(frozen=True)
class SpecConfig:
    """Speculative decoding for one request (None on a request = off).

    Every field changes only how fast tokens come, never which: drafts are verified by
    sample-and-compare, so the tokens equal plain decoding's whatever these values are.
    """

    method: SpecMethod
    num_tokens: int = 5
    """Most drafts per step (llama.cpp's --draft-max); the adaptive length stays within 1..this."""
    draft_min: int = 0
    """A proposal shorter than this is dropped rather than verified (llama.cpp's --draft-min)."""
    p_min: float = 0.75
    """Draft model: drafting stops when its top-1 probability falls below this (--draft-p-min)."""
    ngram_min: int = 1
    """Prompt lookup: the shortest suffix n-gram matched."""
    ngram_max: int = 3
    """Prompt lookup: the longest suffix n-gram matched (tried first)."""
    adaptive: bool = True
    """Shrink the draft length after rejections (and pause drafting after repeated misses), grow it
    after full acceptance; False drafts `num_tokens` every step (tests, measurements)."""

    def __post_init__(self) -> None:
        if self.method not in SPEC_METHODS:
            raise SpecConfigError(
                f"spec_method must be one of {', '.join(SPEC_METHODS)}, got {self.method!r}.", "spec_method"
            )
        check_spec_limits(self.num_tokens, self.draft_min, self.p_min, self.ngram_min, self.ngram_max)


def check_spec_limits(num_tokens: int, draft_min: int, p_min: float, ngram_min: int, ngram_max: int) -> None:
    """The one check of the speculative limits (`SpecConfig`'s fields but the method), for a
    `SpecConfig` and for the resolved settings (checked even when the method is none, so a profile's
    bad value is found before a request turns speculation on). Raises `SpecConfigError`."""
    if num_tokens < 1:
        raise SpecConfigError(f"spec_num_tokens must be at least 1, got {num_tokens}.", "spec_num_tokens")
    if not 0 <= draft_min <= num_tokens:
        raise SpecConfigError(
            f"spec_draft_min must be in [0, spec_num_tokens = {num_tokens}], got {draft_min}.",
            "spec_draft_min",
            "spec_num_tokens",
        )
    if not 0.0 <= p_min <= 1.0:
        raise SpecConfigError(f"spec_p_min must be in [0, 1], got {p_min}.", "spec_p_min")
    if ngram_max < 1:
        raise SpecConfigError(f"spec_ngram_max must be at least 1, got {ngram_max}.", "spec_ngram_max")
    if not 1 <= ngram_min <= ngram_max:
        raise SpecConfigError(
            f"spec_ngram_min must be in [1, spec_ngram_max = {ngram_max}], got {ngram_min}.",
            "spec_ngram_min",
            "spec_ngram_max",
        )
