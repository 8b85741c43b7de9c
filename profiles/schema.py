"""Pydantic models of a profile file: which keys exist, their types, built-in defaults and descriptions.

This module is the one place a setting's type, default and description are written. The settings
resolver (`infer.profiles.settings`) and the CLI flags (`infer.cli.options`) are derived from it.

Range rules for sampler fields are *not* written here: `SamplingParams` (in `infer.engine.sampling`)
owns them, and the resolver builds one eagerly so a bad profile fails at load, not at the first token.
Range rules for engine and speculative fields live here (`ge=`, `Literal[...]`).

"Off" values, one per setting: `threads: 0` = all cores, `ctx_size: 0` = the model's trained context,
`n_predict: -1` = until end of sequence or context, `model: null` = the embedded default model,
`sampler.seed: null` = a random seed.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from infer.engine.sampling import SamplingParams

Backend = Literal["cpu", "cuda", "metal"]
DType = Literal["float32", "float16", "bfloat16"]
SpeculativeMethod = Literal["none", "prompt_lookup", "draft_model"]


def _sampling_default(name: str) -> Any:
    """The built-in default of a sampler field: `SamplingParams`' own default (llama.cpp's), so the two
    cannot drift. Tuples come back as lists (YAML and JSON have lists)."""
    for spec in dataclasses.fields(SamplingParams):
        if spec.name == name:
            value = spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
            return list(value) if isinstance(value, tuple) else value
    raise KeyError(f"SamplingParams has no field {name!r}")


def _sampler_field(name: str) -> Any:
    """A sampler setting whose default and description both come from `SamplingParams`."""
    description = SamplingParams.field_docs()[name]
    default = _sampling_default(name)
    if isinstance(default, list):
        return Field(default_factory=lambda: list(default), description=description)
    return Field(default, description=description)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=False)


class SamplerSection(_Section):
    """The `sampler:` section: defaults for `SamplingParams`. Types are checked here; ranges, and the
    defaults themselves, come from `SamplingParams` (`infer.engine.sampling`)."""

    temperature: float = _sampler_field("temperature")
    top_k: int = _sampler_field("top_k")
    top_p: float = _sampler_field("top_p")
    min_p: float = _sampler_field("min_p")
    typical_p: float = _sampler_field("typical_p")
    top_n_sigma: float = _sampler_field("top_n_sigma")
    repeat_penalty: float = _sampler_field("repeat_penalty")
    repeat_last_n: int = _sampler_field("repeat_last_n")
    presence_penalty: float = _sampler_field("presence_penalty")
    frequency_penalty: float = _sampler_field("frequency_penalty")
    xtc_probability: float = _sampler_field("xtc_probability")
    xtc_threshold: float = _sampler_field("xtc_threshold")
    dry_multiplier: float = _sampler_field("dry_multiplier")
    dry_base: float = _sampler_field("dry_base")
    dry_allowed_length: int = _sampler_field("dry_allowed_length")
    dry_penalty_last_n: int = _sampler_field("dry_penalty_last_n")
    dry_sequence_breakers: list[str] = _sampler_field("dry_sequence_breakers")
    mirostat: int = _sampler_field("mirostat")
    mirostat_tau: float = _sampler_field("mirostat_tau")
    mirostat_eta: float = _sampler_field("mirostat_eta")
    dynatemp_range: float = _sampler_field("dynatemp_range")
    dynatemp_exponent: float = _sampler_field("dynatemp_exponent")
    min_keep: int = _sampler_field("min_keep")
    seed: int | None = _sampler_field("seed")
    n_probs: int = _sampler_field("n_probs")
    samplers: list[str] | str = _sampler_field("samplers")


class SpeculativeSection(_Section):
    """The `speculative:` section: speculative decoding."""

    method: SpeculativeMethod = Field(
        "none", description="Speculative decoding: none, prompt_lookup (n-grams) or draft_model."
    )
    num_tokens: int = Field(5, ge=1, description="Tokens drafted per step.")
    draft_model: str | None = Field(None, description="Draft model path (method draft_model).")
    ngram_min: int = Field(1, ge=1, description="Prompt lookup: shortest n-gram matched.")
    ngram_max: int = Field(3, ge=1, description="Prompt lookup: longest n-gram matched.")


class ProfileFile(_Section):
    """One profile YAML file. Every key is optional; what a file leaves out comes from `extends:` or the
    built-in default (the defaults below)."""

    extends: str | None = Field(
        None, description="Profile to inherit from: a shipped name or a path relative to this file."
    )
    description: str | None = Field(None, description="One line shown by `infer profiles list`.")

    backend: Backend = Field("cpu", description="Compute backend: cpu (numpy), cuda (CuPy) or metal (MLX).")
    dtype: DType = Field("float32", description="Compute dtype for weights and activations.")
    threads: int = Field(0, ge=0, description="CPU threads for BLAS; 0 = all cores.")
    ctx_size: int = Field(4096, ge=0, description="Context size in tokens; 0 = the model's trained context.")
    batch_size: int = Field(512, ge=1, description="Prefill chunk: prompt tokens processed per step.")
    max_batched_tokens: int = Field(2048, ge=1, description="Scheduler: most tokens in one step.")
    max_num_seqs: int = Field(64, ge=1, description="Scheduler: most sequences running at once.")
    model: str | None = Field(None, description="Model path or known name; null = the embedded default.")
    n_predict: int = Field(
        -1, ge=-1, description="Tokens to generate; -1 = until end of sequence or context."
    )

    sampler: SamplerSection = Field(default_factory=SamplerSection, description="Sampler defaults.")
    speculative: SpeculativeSection = Field(
        default_factory=SpeculativeSection, description="Speculative decoding."
    )


SECTION_MODELS: dict[str, type[BaseModel]] = {
    "sampler": SamplerSection,
    "speculative": SpeculativeSection,
}
"""Profile sections that are nested mappings, by key."""

META_KEYS: tuple[str, ...] = ("extends", "description")
"""Top-level keys that describe the file rather than set a value."""
