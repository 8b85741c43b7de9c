"""Engine requests from resolved settings: the one function every surface builds its requests with.

`infer generate`, `infer stream`, `infer serve`, `infer bench` and `infer gate` all call
`build_request`, so a request's sampler, token limit and seed follow one rule on every surface:

- sampler: the settings' `SamplingParams`, built once when the settings were resolved; a caller with
  per-request sampler fields (an API body) passes the one it built from them, once.
- token limit: an explicit `max_tokens` wins (an API body's limit, a bench test's length); otherwise
  the `n_predict` setting, where -1 = until end of sequence or context (0 too, as before).
- output constraint: the caller's (an API body's `response_format`), else the settings' one.
- seed: `seed` when given (choice i of an API request), else the sampler's seed, else a fresh random
  one: `Request` resolves it once, when it is made, and the engine draws with it and reports it.
- speculation: the `speculative.*` settings as a `SpecConfig` (None for method none); a caller with
  per-request fields (an API body) passes the one it built with `spec_config(settings, overrides)`.

It lives in `profiles/` because it turns resolved settings into an engine request: it reads
`Settings` and builds the engine's `Request` (`cli -> profiles -> engine`), so both the CLI and the
server (`cli/serve/`) call it and the engine never sees `Settings`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal

from infer.engine.grammar import GrammarSpec
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams
from infer.engine.speculative import SpecConfig
from infer.profiles.constraints import grammar_from_settings
from infer.profiles.settings import Settings

FROM_SETTINGS: Literal["settings"] = "settings"
"""`build_request(grammar=..., spec=...)`'s default: the constraint / speculation the settings ask for."""


def spec_config(settings: Settings, overrides: Mapping[str, Any] | None = None) -> SpecConfig | None:
    """The `SpecConfig` of the `speculative.*` settings with `overrides` (profile keys: `method`,
    `num_tokens`, ...) on top; None when the method is none. Raises `SpecConfigError` (with
    `.parameter`) for an out-of-range combination."""
    values = {**settings.section("speculative"), **(overrides or {})}
    method = values.pop("method")
    if method == "none":
        return None
    values.pop("draft_model", None)  # the engine loaded it; a request only chooses the method
    return SpecConfig(method, **values)


def max_tokens_for(n_predict: int) -> int | None:
    """The engine's token limit for an `n_predict` setting: -1 (or 0) = None = until end of sequence
    or context."""
    return n_predict if n_predict > 0 else None


def build_request(
    prompt_ids: Sequence[int],
    settings: Settings,
    *,
    sampling: SamplingParams | None = None,
    max_tokens: int | None = None,
    stop: Iterable[str] = (),
    ignore_eos: bool = False,
    seed: int | None = None,
    request_id: str | None = None,
    grammar: GrammarSpec | Literal["settings"] | None = FROM_SETTINGS,
    spec: SpecConfig | Literal["settings"] | None = FROM_SETTINGS,
) -> Request:
    """The engine `Request` for `prompt_ids` under resolved `settings` (see the module docstring).

    `sampling` replaces the settings' sampler (per-request fields on top of it, built by the caller);
    `max_tokens` None = the `n_predict` setting; `seed` None = the sampler's seed or a random one;
    `request_id` None = a fresh id; `grammar` (default: the settings' output constraint,
    `--json-schema`, `--regex`, ...; none by default) None = free text, whatever the settings say;
    `spec` (default: from the settings) None = no speculation.
    Raises `RequestError` (a ValueError) for a bad limit or prompt, `SettingsError` for a bad
    constraint setting.
    """
    extra: dict[str, Any] = {} if request_id is None else {"request_id": request_id}
    return Request(
        tuple(prompt_ids),
        settings.sampling if sampling is None else sampling,
        max_tokens=max_tokens if max_tokens is not None else max_tokens_for(settings.n_predict),
        stop=tuple(stop),
        ignore_eos=ignore_eos,
        seed=seed,
        grammar=grammar_from_settings(settings) if grammar == FROM_SETTINGS else grammar,
        spec=spec_config(settings) if spec == FROM_SETTINGS else spec,
        **extra,
    )


__all__ = ["FROM_SETTINGS", "build_request", "max_tokens_for", "spec_config"]
