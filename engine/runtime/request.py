"""What a caller asks the engine for."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

from infer.engine.grammar import GrammarSpec
from infer.engine.sampling import SamplingParams, resolve_seed
from infer.engine.speculative.config import SpecConfig

_SEED_LIMIT = 1 << 64

MAX_STOP_STRINGS = 16
"""The most stop strings one request may give (OpenAI takes 4). Each is checked after every token."""

MAX_STOP_CHARS = 256
"""The longest stop string, in characters (text that could start one is held back until it cannot)."""


class RequestError(ValueError):
    """A request the engine cannot take (prompt too long, bad limits); `parameter` names the field."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


class EngineBusy(RuntimeError):
    """The engine's waiting queue is full (`EngineConfig.max_queue`): try again later. Distinct
    from RequestError: the request itself is fine, the server is overloaded (HTTP 503)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
        """A hint for the client (HTTP Retry-After), in whole seconds."""


def new_request_id() -> str:
    """A unique request id (random, so no module-level counter is shared between engines)."""
    return f"req-{uuid.uuid4().hex[:16]}"


@dataclass(frozen=True)
class Request:
    """Prompt ids plus how to continue them."""

    prompt_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    max_tokens: int | None = None
    """Most tokens to generate; None = until a stop token or the end of the context."""
    stop: tuple[str, ...] = ()
    """Stop strings: generation ends when the text contains one; the stop text is never emitted. At
    most 16, of at most 256 characters each."""
    ignore_eos: bool = False
    """Keep generating past EOS/EOT (benchmarks, references)."""
    skip_special: bool = True
    """Special tokens render no text."""
    shown_special_ids: tuple[int, ...] = ()
    """Control tokens that render their text all the same: the markers a tool-calling reply is read
    by (Mistral's `[TOOL_CALLS]`, Llama's `<|python_tag|>`), which are control tokens in their
    vocabularies."""
    request_id: str = field(default_factory=new_request_id)
    seed: int | None = None
    """The seed of this request's draws, an int once the request exists: None takes `sampling.seed`,
    or a fresh random seed when that is None too. Resolved here, once; the engine draws with it and
    reports it (`DoneEvent.seed`) so the run can be repeated."""
    grammar: GrammarSpec | None = None
    """Constrain the output (JSON schema, any JSON object, regex, Lark grammar, choices): every
    token is drawn from the tokens the grammar allows, and the request ends with `stop` when the
    grammar is complete. None = free text."""
    spec: SpecConfig | None = None
    """Speculative decoding for this request (None = off). Changes speed only: the tokens are those
    of plain decoding whatever it says."""

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise RequestError("the prompt is empty: at least one token is needed", "prompt")
        seed = self.seed
        if seed is None:
            object.__setattr__(self, "seed", resolve_seed(self.sampling.seed))
        elif isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < _SEED_LIMIT:
            raise RequestError(f"seed must be an integer in [0, 2**64), got {self.seed!r}.", "seed")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise RequestError(f"max_tokens must be at least 1, got {self.max_tokens}.", "max_tokens")
        if len(self.stop) > MAX_STOP_STRINGS:
            raise RequestError(
                f"stop has {len(self.stop)} strings; at most {MAX_STOP_STRINGS} are accepted", "stop"
            )
        if any(not s for s in self.stop):
            raise RequestError("stop strings must not be empty", "stop")
        longest = max((len(s) for s in self.stop), default=0)
        if longest > MAX_STOP_CHARS:
            raise RequestError(
                f"stop strings may be at most {MAX_STOP_CHARS} characters, got one of {longest}", "stop"
            )


FaultHook = Callable[[str, str, int], None]
"""Test-only: called as (request_id, phase, index) before each step of a request, phase "prefill"
(index = chunk number), "decode" or "verify" (a decode step carrying drafts; index = number of
tokens already generated); raising makes that step fail exactly as a real failure would."""
