"""Gemma 2: Gemma's sandwich norms with (1 + w) weights, GeGLU and sqrt(hidden)-scaled embeddings
(as Gemma 3), no q/k norm, soft-capping of the attention scores and of the final logits, sliding and
global layers alternating (even layers slide), one RoPE base, and scores scaled by
query_pre_attn_scalar ** -0.5.

GGUF files carry no query_pre_attn_scalar: llama.cpp takes hidden / heads for the 27B shape (46
layers) and head_dim otherwise, and so does this reading. Its converter stores norm weights as 1 + w.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from infer.engine.models.decoder import FULL, SLIDING, DecoderConfig, DecoderFamily, GgufNumber, LayerNames
from infer.engine.models.gemma3 import GEMMA_GGUF_LAYER_NAMES, one_plus_weight

GEMMA2_LAYER_NAMES = LayerNames(
    attn_norm="input_layernorm.weight",
    mlp_norm="pre_feedforward_layernorm.weight",
    post_attn_norm="post_attention_layernorm.weight",
    post_mlp_norm="post_feedforward_layernorm.weight",
)
"""Gemma's sandwich norms by role, without q/k norms."""
LLAMACPP_27B_LAYERS = 46
"""The layer count llama.cpp recognises Gemma 2 27B by (its score scale is hidden / heads)."""


def _alternating(layers: int) -> tuple[str, ...]:
    """Even layers slide, odd ones attend globally (Gemma 2; llama.cpp's swa pattern 2)."""
    return tuple(SLIDING if i % 2 == 0 else FULL for i in range(layers))


class Gemma2Family(DecoderFamily):
    """The Gemma 2 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("gemma2",)
    hf_architectures: Mapping[str, str] = {"Gemma2ForCausalLM": "gemma2"}
    gguf_layer_names: Mapping[str, str] = GEMMA_GGUF_LAYER_NAMES
    layer_names: LayerNames = GEMMA2_LAYER_NAMES
    gguf_rope_layout: Mapping[str, str] = {"gemma2": "half"}

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """Gemma 2's fields as llama.cpp reads them (window 4096 unless given, pattern 2)."""
        layers, heads = base["num_hidden_layers"], base["num_attention_heads"]
        scalar = base["hidden_size"] / heads if layers == LLAMACPP_27B_LAYERS else base["head_dim"]
        arch = base["architecture"]

        def optional(key: str) -> float | None:
            return number(key, float) if f"{arch}.{key}" in meta else None

        return self._common(base) | {
            "sliding_window": number("attention.sliding_window", int, 4096),
            "attention_multiplier": float(scalar) ** -0.5,
            "attn_logit_softcapping": optional("attn_logit_softcapping"),
            "final_logit_softcapping": optional("final_logit_softcapping"),
            "norm_weights_hold_one": True,
        }

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """Gemma 2's fields from config.json."""
        types = raw.get("layer_types")
        fields = self._common(base) | {
            "sliding_window": int(raw.get("sliding_window") or 4096),
            "attention_multiplier": float(raw.get("query_pre_attn_scalar", base["head_dim"])) ** -0.5,
            "attn_logit_softcapping": raw.get("attn_logit_softcapping"),
            "final_logit_softcapping": raw.get("final_logit_softcapping"),
        }
        if types:
            fields["layer_types"] = tuple(str(t) for t in types)
        return fields

    @staticmethod
    def _common(base: dict[str, Any]) -> dict[str, Any]:
        """What both readings share: the block's shape, tied embeddings, sqrt(hidden) on them."""
        return {
            "activation": "gelu_tanh",
            "layer_types": _alternating(base["num_hidden_layers"]),
            "embedding_multiplier": math.sqrt(base["hidden_size"]),
            "tie_word_embeddings": True,
        }

    def norm_weight(self, weight: np.ndarray, config: DecoderConfig) -> np.ndarray:
        """Gemma's 1 + w."""
        return one_plus_weight(weight, config)


GEMMA2_FAMILY = Gemma2Family()
"""The instance the registry holds."""
