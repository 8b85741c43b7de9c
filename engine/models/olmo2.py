"""OLMo 2: no norm before attention or the feed-forward layer; instead an RMSNorm on each branch's
output before the residual add, and RMSNorm of q and k over the whole projection (not per head)
before RoPE. llama.cpp runs it with NEOX RoPE, so its GGUF q/k rows stay half-split."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.models.decoder import LLAMA_GGUF_LAYER_NAMES, DecoderFamily, GgufNumber, LayerNames

OLMO2_LAYER_NAMES = LayerNames(
    attn_norm=None,
    mlp_norm=None,
    post_attn_norm="post_attention_layernorm.weight",
    post_mlp_norm="post_feedforward_layernorm.weight",
    q_norm="self_attn.q_norm.weight",
    k_norm="self_attn.k_norm.weight",
)
"""OLMo 2's norms by role (Hugging Face names)."""
_GGUF_LAYER_NAMES = {
    **{k: v for k, v in LLAMA_GGUF_LAYER_NAMES.items() if k not in ("attn_norm.weight", "ffn_norm.weight")},
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}


class Olmo2Family(DecoderFamily):
    """The OLMo 2 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("olmo2",)
    hf_architectures: Mapping[str, str] = {"Olmo2ForCausalLM": "olmo2"}
    gguf_layer_names: Mapping[str, str] = _GGUF_LAYER_NAMES
    layer_names: LayerNames = OLMO2_LAYER_NAMES
    gguf_rope_layout: Mapping[str, str] = {"olmo2": "half"}

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """q/k norm over the whole projection (the post-norms are its layer names)."""
        return {"qk_norm": "full"}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """q/k norm over the whole projection."""
        return {"qk_norm": "full"}


OLMO2_FAMILY = Olmo2Family()
"""The instance the registry holds."""
