"""Speculative decoding: drafters that propose tokens, verified by the step loop.

The runtime asks the drafter of each generating sequence's method for drafts before scheduling
(`Drafter.propose`), feeds them as extra rows of that sequence, and keeps them while the target's
own draws equal them (sample-and-compare), so tokens are exactly those of plain decoding.
"""

from __future__ import annotations

from infer.engine.speculative.adaptive import AdaptiveLength
from infer.engine.speculative.base import DraftAsk, Drafter
from infer.engine.speculative.config import (
    SPEC_METHODS,
    SpecConfig,
    SpecConfigError,
    SpecMethod,
    check_spec_limits,
)
from infer.engine.speculative.counters import SpecCounters, merge, summary
from infer.engine.speculative.draft_model import (
    DraftModelDrafter,
    DraftModelError,
    load_draft_model,
    tokenizer_difference,
)
from infer.engine.speculative.prompt_lookup import PromptLookupDrafter, lookup

__all__ = [
    "SPEC_METHODS",
    "AdaptiveLength",
    "DraftAsk",
    "DraftModelDrafter",
    "DraftModelError",
    "Drafter",
    "PromptLookupDrafter",
    "SpecConfig",
    "SpecConfigError",
    "SpecCounters",
    "SpecMethod",
    "check_spec_limits",
    "load_draft_model",
    "lookup",
    "merge",
    "summary",
    "tokenizer_difference",
]
