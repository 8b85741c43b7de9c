"""A request in flight: its tokens, cache position, sampler, text assembly, stream and clocks."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from infer.engine.runtime.output import OutputProcessor
from infer.engine.runtime.request import Request
from infer.engine.runtime.scheduler import Phase
from infer.engine.sampling import SequenceSampler

if TYPE_CHECKING:
    from infer.engine.runtime.stream import RequestStream


@dataclass
class Sequence:
    """Mutable per-request state owned by the engine thread."""

    request: Request
    stream: RequestStream
    sampler: SequenceSampler
    output: OutputProcessor
    seed: int
    phase: Phase = Phase.WAITING
    slot: int | None = None
    num_cached: int = 0
    """Positions of this sequence already in the KV cache."""
    generated: list[int] = field(default_factory=list)
    prefill_chunks: int = 0
    submitted_at: float = field(default_factory=time.perf_counter)
    scheduled_at: float | None = None
    first_token_at: float | None = None

    @property
    def prompt_ids(self) -> tuple[int, ...]:
        """The prompt's token ids."""
        return self.request.prompt_ids

    @property
    def last_token(self) -> int:
        """The newest token (the next one a decode step feeds), without copying the history."""
        return self.generated[-1] if self.generated else self.request.prompt_ids[-1]

    def step_label(self) -> tuple[str, int]:
        """(phase, index) of the step this sequence is about to run, as fault hooks and errors name it."""
        if self.phase is Phase.PREFILL:
            return "prefill", self.prefill_chunks
        return "decode", len(self.generated)
