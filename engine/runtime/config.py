"""The engine's limits, validated once where they are defined (the settings layer hands them over raw)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from infer.engine.backends.kv_cache import KV_CACHE_DTYPES

if TYPE_CHECKING:
    from infer.engine.runtime.request import FaultHook


class EngineConfigError(ValueError):
    """An engine limit out of range; `parameter` names the field (`ctx_size`, `max_num_seqs`, ...)."""

    def __init__(self, message: str, parameter: str) -> None:
        super().__init__(message)
        self.parameter = parameter


_LOWEST: dict[str, int] = {
    "ctx_size": 0,
    "max_num_seqs": 1,
    "max_batched_tokens": 1,
    "batch_size": 1,
    "max_queue": 0,
    "kv_cache_bytes": 0,
}
"""Each whole-number limit's smallest allowed value (0 = off, or the model's own, where the field says)."""


@dataclass(frozen=True)
class EngineConfig:
    """Engine limits (from the resolved settings)."""

    ctx_size: int = 4096
    """Positions per sequence (0 = the model's trained context); a prompt must be shorter, and
    generation stops with `length` at the end."""
    max_num_seqs: int = 16
    """Sequences holding a KV slot at once; more requests queue."""
    max_batched_tokens: int = 2048
    """Rows in one forward pass."""
    batch_size: int = 512
    """Largest prefill chunk of one sequence per step."""
    max_queue: int = 0
    """Requests that may wait for a KV slot at once (0 = no bound); one more is refused with
    EngineBusy, so a burst is shed instead of queueing without limit."""
    kv_cache_bytes: int = 0
    """KV memory the running sequences and kept prefixes may hold (0 = no bound beyond
    max_num_seqs x ctx_size): a sequence waits until its prompt and token limit fit."""
    kv_cache_dtype: str = "f32"
    """How the KV cache stores keys and values: f32 (the compute dtype; what the reference tests and
    gates use) or f16 (IEEE halves rounded to nearest even, widened to float32 before any
    arithmetic: half the memory and half the bytes attention reads per step). Either way a row's
    logits are the same bits alone, batched or verifying drafts; f16 and f32 logits differ."""
    prefix_caching: bool = False
    """Keep finished prompts' whole prefill chunks in the KV cache and start a request that shares
    them from there (see runtime.prefix_cache); the tokens are the same either way."""
    fault_hook: FaultHook | None = None
    """Test-only failure injection (see request.FaultHook)."""

    def __post_init__(self) -> None:
        for name, lowest in _LOWEST.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise EngineConfigError(f"{name} must be a whole number, got {value!r}.", name)
            if value < lowest:
                raise EngineConfigError(f"{name} must be at least {lowest}, got {value}.", name)
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            allowed = ", ".join(KV_CACHE_DTYPES)
            raise EngineConfigError(
                f"kv_cache_dtype must be one of {allowed}, got {self.kv_cache_dtype!r}.", "kv_cache_dtype"
            )
