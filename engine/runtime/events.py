"""What the engine emits for a request: TokenEvent per token, then exactly one DoneEvent."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

FinishReason = Literal["stop", "length", "cancelled", "error"]
"""stop: EOS/EOT or a stop string; length: n-predict or context full; cancelled; error: a step failed."""


@dataclass(frozen=True)
class TokenEvent:
    """One sampled token.

    `text` is the new text this token completes (after stop-string hold-back). It is empty when the
    token adds no complete text yet (half a UTF-8 character, a special token, text held back because
    it may begin a stop string); text sinks skip empty deltas, token sinks still see the id.
    """

    request_id: str
    index: int
    """0-based position of the token in the completion."""
    token_id: int
    text: str
    logprob: float | None
    """log p(token) under the model's raw distribution (log_softmax of the logits, before the chain);
    None unless the request's sampling params ask for logprobs."""
    top_logprobs: tuple[tuple[int, float], ...]
    """The n_probs most likely tokens under that same distribution, best first."""
    step: int
    """The engine step that produced the token (lets tests prove streaming order)."""


@dataclass(frozen=True)
class Usage:
    """Token counts in OpenAI's terms."""

    prompt_tokens: int
    completion_tokens: int
    cached_prompt_tokens: int = 0
    """Prompt tokens whose KV came from the prefix cache instead of being computed."""

    @property
    def total_tokens(self) -> int:
        """Prompt plus completion."""
        return self.prompt_tokens + self.completion_tokens


@dataclass(frozen=True)
class Timings:
    """Seconds spent in each phase of a request (perf_counter differences)."""

    queue_s: float = 0.0
    """From submit to the first scheduled step."""
    prefill_s: float = 0.0
    """From the first scheduled step to the first token (time to first token minus queueing)."""
    decode_s: float = 0.0
    """From the first token to the last."""
    ttft_s: float = 0.0
    """From submit to the first token."""

    def prefill_tokens_per_s(self, prompt_tokens: int) -> float:
        """Prompt tokens per second of prefill (0 when unmeasured)."""
        return prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    def decode_tokens_per_s(self, completion_tokens: int) -> float:
        """Tokens per second after the first one (0 when fewer than two tokens)."""
        return (completion_tokens - 1) / self.decode_s if completion_tokens > 1 and self.decode_s > 0 else 0.0


@dataclass(frozen=True)
class DoneEvent:
    """The last event of every request, whatever happened."""

    request_id: str
    finish_reason: FinishReason
    error: str | None
    """What failed and where ("decode step 5 failed after 5 tokens: ..."); None unless an error."""
    usage: Usage
    timings: Timings
    seed: int
    """The seed the request's sampler used (random when none was given), so the run can be repeated."""
    token_ids: tuple[int, ...]
    """Every generated token, including ones that rendered no text."""
    text: str
    """The whole completion text (the concatenation of the TokenEvent texts)."""
    counters: dict[str, int] = field(default_factory=dict)
    """Mode-specific counters, e.g. speculative drafted/accepted."""
    sampled_on_device: int = 0
    """Draws made on the device (a GPU backend, inside the sampling envelope); every other draw of
    the request, greedy, outside the envelope or constrained, ran on the host."""
    error_param: str | None = None
    """The request setting an error is due to (``logit_bias``, ``temperature``, ...), when the step
    failed because of it rather than the model or the engine; None otherwise."""


Event = TokenEvent | DoneEvent
