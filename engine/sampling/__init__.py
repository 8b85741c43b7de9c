"""The sampler: validated parameters (params), the stage functions (stages), their bound links (links),
the per-request chain (chain) and its seeded draws (draws)."""

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
from infer.engine.sampling.links import Stage, make_stage

__all__ = [
    "DEFAULT_SAMPLERS",
    "SAMPLER_STAGES",
    "FrozenLogitBias",
    "NoFiniteLogitsError",
    "SampledToken",
    "SamplingParams",
    "SamplingParamsError",
    "SequenceSampler",
    "Stage",
    "draw_uniforms",
    "make_stage",
    "resolve_seed",
]
