"""Pydantic models of a profile file: which keys exist, their types, built-in defaults and descriptions.

This module is the one place a setting's type, default and description are written. The settings
resolver (`infer.engine.settings`) and the CLI flags (`infer.cli.options`) are derived from it.

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


def _sampler_field(name: str, description: str) -> Any:
    default = _sampling_default(name)
    if isinstance(default, list):
        return Field(default_factory=lambda: list(default), description=description)
    return Field(default, description=description)


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=False)


class SamplerSection(_Section):
    """The `sampler:` section: defaults for `SamplingParams`. Types are checked here; ranges, and the
    defaults themselves, come from `SamplingParams` (`infer.engine.sampling`)."""

    temperature: float = _sampler_field("temperature", "Sampling temperature; 0 = greedy (argmax).")
    top_k: int = _sampler_field("top_k", "Keep only the k most likely tokens; 0 = off.")
    top_p: float = _sampler_field(
        "top_p", "Nucleus sampling: keep the smallest set with this probability mass, in (0, 1]; 1 = off."
    )
    min_p: float = _sampler_field(
        "min_p", "Drop tokens below min_p x the top token's probability, in [0, 1]; 0 = off."
    )
    typical_p: float = _sampler_field("typical_p", "Locally typical sampling mass, in (0, 1]; 1 = off.")
    top_n_sigma: float = _sampler_field(
        "top_n_sigma", "Keep logits within n standard deviations of the max; -1 = off."
    )
    repeat_penalty: float = _sampler_field(
        "repeat_penalty", "Repetition penalty (> 0) on tokens in the last repeat_last_n; 1 = off."
    )
    repeat_last_n: int = _sampler_field(
        "repeat_last_n", "Tokens looked back at by the penalties; 0 = off, -1 = whole history."
    )
    presence_penalty: float = _sampler_field(
        "presence_penalty", "OpenAI-style presence penalty in [-2, 2]; 0 = off."
    )
    frequency_penalty: float = _sampler_field(
        "frequency_penalty", "OpenAI-style frequency penalty in [-2, 2]; 0 = off."
    )
    xtc_probability: float = _sampler_field(
        "xtc_probability", "XTC: chance in [0, 1] of removing the top choices at a step; 0 = off."
    )
    xtc_threshold: float = _sampler_field(
        "xtc_threshold", "XTC: probability threshold in [0, 1] for a choice to be removable."
    )
    dry_multiplier: float = _sampler_field(
        "dry_multiplier", "DRY repetition penalty multiplier (>= 0); 0 = off."
    )
    dry_base: float = _sampler_field("dry_base", "DRY exponential base (>= 1).")
    dry_allowed_length: int = _sampler_field(
        "dry_allowed_length", "DRY: repeats longer than this (>= 1 tokens) are penalized."
    )
    dry_penalty_last_n: int = _sampler_field(
        "dry_penalty_last_n", "DRY: tokens looked back at; 0 = off, -1 = whole history."
    )
    dry_sequence_breakers: list[str] = _sampler_field(
        "dry_sequence_breakers", "DRY: strings that end a repeated sequence (repeat the flag for several)."
    )
    mirostat: int = _sampler_field(
        "mirostat", "Mirostat sampling: 0 = off, 1 = Mirostat, 2 = Mirostat 2.0 (replaces the sampler chain)."
    )
    mirostat_tau: float = _sampler_field("mirostat_tau", "Mirostat target entropy (tau), >= 0.")
    mirostat_eta: float = _sampler_field("mirostat_eta", "Mirostat learning rate (eta), >= 0.")
    dynatemp_range: float = _sampler_field(
        "dynatemp_range", "Dynamic temperature range (>= 0): temperature +- range; 0 = off."
    )
    dynatemp_exponent: float = _sampler_field("dynatemp_exponent", "Dynamic temperature exponent (>= 0).")
    min_keep: int = _sampler_field(
        "min_keep", "Filtering stages keep at least this many tokens (>= 0); 0 = off."
    )
    seed: int | None = _sampler_field(
        "seed", "Random seed in [0, 2**64); null (or -1) = a random seed per request."
    )
    n_probs: int = _sampler_field("n_probs", "Report the top n_probs alternatives per token; 0 = off.")
    samplers: list[str] | str = _sampler_field(
        "samplers", "Sampler stages in order: a list, 'top_k;top_p;...', or llama.cpp letters ('kpt')."
    )


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
