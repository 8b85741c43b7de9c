"""The sampler: validated parameters (params), the stage functions (stages), the per-request chain (chain)."""

from infer.engine.sampling.chain import (
    DEFAULT_SAMPLERS,
    SAMPLER_STAGES,
    FrozenLogitBias,
    NoFiniteLogitsError,
    SampledToken,
    SamplingParams,
    SamplingParamsError,
    SequenceSampler,
    draw_uniforms,
    resolve_seed,
)

__all__ = [
    "DEFAULT_SAMPLERS",
    "SAMPLER_STAGES",
    "FrozenLogitBias",
    "NoFiniteLogitsError",
    "SampledToken",
    "SamplingParams",
    "SamplingParamsError",
    "SequenceSampler",
    "draw_uniforms",
    "resolve_seed",
]
