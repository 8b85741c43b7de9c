"""Phi-3 and Phi-4-mini: the llama block with q/k/v fused into one projection and gate/up into
another, half-split RoPE pairs (llama.cpp's NEOX RoPE), partial rotary (Phi-4-mini rotates 3/4 of
each head) and LongRoPE scaling.

LongRoPE divides each frequency by a factor from one of two lists and scales cos and sin by an
attention factor. Which list applies is decided once per context, as llama.cpp decides it: the long
factors when the context the cache is made for exceeds `original_max_position_embeddings`, else the
short ones. (transformers switches by the current sequence length, which for any sequence that stays
within the original length is the same choice.)
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

import numpy as np

from infer.engine.backends.base import Backend
from infer.engine.backends.kv_cache import KVCache
from infer.engine.models.base import (
    SUPPORTED_ROPE_TYPES,
    Checkpoint,
    ModelConfig,
    ModelLoadError,
    Tensor,
    gguf_number,
)
from infer.engine.models.decoder import (
    LLAMA_GGUF_LAYER_NAMES,
    DecoderConfig,
    DecoderFamily,
    DecoderStack,
    LayerNames,
    RopeTable,
    inverse_frequencies,
    rotary_pairs,
)

LONG_FACTORS, SHORT_FACTORS = "rope_factors_long.weight", "rope_factors_short.weight"
"""LongRoPE's per-frequency divisors, as GGUF names them (the safetensors path builds them from
config.json under the same names)."""
PHI3_LAYER_NAMES = LayerNames(qkv=("self_attn.qkv_proj.weight",), gate_up=("mlp.gate_up_proj.weight",))
"""The fused projections (Hugging Face names)."""
_GGUF_LAYER_NAMES = {
    **LLAMA_GGUF_LAYER_NAMES,
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_up.weight": "mlp.gate_up_proj.weight",  # llama.cpp keeps gate and up fused under ffn_up
}


class Phi3Family(DecoderFamily):
    """The Phi-3 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("phi3",)
    hf_architectures: Mapping[str, str] = {"Phi3ForCausalLM": "phi3"}
    gguf_layer_names: Mapping[str, str] = _GGUF_LAYER_NAMES
    layer_names: LayerNames = PHI3_LAYER_NAMES
    gguf_rope_layout: Mapping[str, str] = {"phi3": "half"}
    rope_types: frozenset[str] = SUPPORTED_ROPE_TYPES | {"longrope"}

    def gguf_tensor_name(self, name: str) -> str | None:
        """Hugging Face name of a GGUF tensor; LongRoPE's factor tensors keep their GGUF names."""
        return name if name in (LONG_FACTORS, SHORT_FACTORS) else super().gguf_tensor_name(name)

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, Any], source: str
    ) -> DecoderConfig:
        """The shared reading; a file with LongRoPE's factor tensors (llama.cpp writes no scaling
        type for them) gets longrope with the file's original context and attention factor."""
        config = super().config_from_gguf(meta, architecture, weights, source)
        if LONG_FACTORS not in weights and SHORT_FACTORS not in weights:
            return config
        original = gguf_number(
            meta,
            f"{architecture}.rope.scaling.original_context_length",
            source,
            int,
            config.max_position_embeddings,
        )
        attention = gguf_number(meta, f"{architecture}.rope.scaling.attn_factor", source, float, 1.0)
        scaling = {
            "rope_type": "longrope",
            "original_max_position_embeddings": original,
            "attention_factor": attention,
        }
        return replace(config, rope_scaling=scaling)

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """LongRoPE's original context and attention factor (transformers' default formula)."""
        scaling = dict(base["rope_scaling"])
        if (scaling.get("rope_type") or scaling.get("type")) != "longrope":
            return {}
        original = int(
            scaling.get("original_max_position_embeddings") or raw["original_max_position_embeddings"]
        )
        factor = scaling.get("factor") or base["max_position_embeddings"] / original
        attention = scaling.get("attention_factor")
        if attention is None:
            attention = math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1.0 else 1.0
        scaling |= {"original_max_position_embeddings": original, "attention_factor": float(attention)}
        return {"rope_scaling": scaling}

    def check_weights(self, config: ModelConfig, weights: dict[str, Any], source: str) -> None:
        """The shared checks, plus LongRoPE's two factor lists (from the file, or config.json's)."""
        scaling = config.rope_scaling
        if (scaling.get("rope_type") or scaling.get("type")) == "longrope":
            pairs = rotary_pairs(config)
            for name, key in ((LONG_FACTORS, "long_factor"), (SHORT_FACTORS, "short_factor")):
                if name not in weights and key in scaling:
                    weights[name] = np.asarray(scaling[key], dtype=np.float32)
                if np.asarray(weights.get(name, ())).shape != (pairs,):
                    raise ModelLoadError(f"{source}: LongRoPE needs {name} ({key}) of {pairs} factors")
        elif LONG_FACTORS in weights or SHORT_FACTORS in weights:
            raise ModelLoadError(f"{source}: LongRoPE factor tensors without LongRoPE settings ({scaling})")
        super().check_weights(config, weights, source)

    def build(self, checkpoint: Checkpoint, backend: Backend) -> Phi3Model:
        """A Phi3Model on `backend`."""
        return Phi3Model(checkpoint, backend, self.layer_names, self.norm_weight)


PHI3_FAMILY = Phi3Family()
"""The instance the registry holds."""


class Phi3Model(DecoderStack):
    """The shared block with LongRoPE: the factor list is chosen by the context a cache is made for."""

    def __init__(self, checkpoint: Checkpoint, backend: Backend, names: LayerNames, norm_weight: Any) -> None:
        weights = checkpoint.weights
        self._factors = {
            long: np.asarray(weights.pop(name))
            for long, name in ((True, LONG_FACTORS), (False, SHORT_FACTORS))
            if name in weights
        }
        self._use_long = False
        super().__init__(checkpoint, backend, names, norm_weight)

    def _rope_table(self, rotated: bool, sliding: bool, weights: Mapping[str, Tensor]) -> RopeTable:
        """Plain RoPE, or LongRoPE with the factor list of the current context."""
        c = self.config
        if not self._factors:
            return super()._rope_table(rotated, sliding, weights)
        inv = inverse_frequencies(c, self._factors[self._use_long], c.rotary_dim)
        attention_factor = float(c.rope_scaling["attention_factor"])
        return RopeTable(inv, c.head_dim // 2, self._score_scale(), attention_factor)

    def make_cache(self, slots: int, capacity: int, dtype: str = "f32") -> KVCache:
        """A KV cache; with LongRoPE, the long factors apply when `capacity` exceeds the original
        context (llama.cpp's rule), and the rotations are rebuilt for that choice."""
        if self._factors:
            use_long = capacity > int(self.config.rope_scaling["original_max_position_embeddings"])
            if use_long != self._use_long:
                self._use_long = use_long
                self._rope_tables = [self._rope_table(True, False, {}) for _ in self._rope_tables]
        return super().make_cache(slots, capacity, dtype)
