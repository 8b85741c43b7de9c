"""The sampler: validated parameters (params), the stage functions (stages), the chain of bound stages
built once per request (links), the token history it reads (history), the per-request sampler (chain)
and its seeded draws (draws)."""

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
from infer.engine.sampling.links import Chain, Stage, build_chain, make_stage

__all__ = [
    "DEFAULT_SAMPLERS",
    "SAMPLER_STAGES",
    "Chain",
    "FrozenLogitBias",
    "NoFiniteLogitsError",
    "SampledToken",
    "SamplingParams",
    "SamplingParamsError",
    "SequenceSampler",
    "Stage",
    "build_chain",
    "draw_uniforms",
    "make_stage",
    "resolve_seed",
]
