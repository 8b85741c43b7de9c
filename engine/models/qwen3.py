"""Qwen3 (dense): the llama block with RMSNorm of q and k per head before RoPE, no q/k/v bias, and
Hugging Face's half-split RoPE pairs in GGUF files too (llama.cpp runs it with NEOX RoPE)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.models.decoder import DecoderFamily, GgufNumber, LayerNames

QWEN3_LAYER_NAMES = LayerNames(q_norm="self_attn.q_norm.weight", k_norm="self_attn.k_norm.weight")
"""Llama's names plus the per-head q/k norms."""


class Qwen3Family(DecoderFamily):
    """The Qwen3 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("qwen3",)
    hf_architectures: Mapping[str, str] = {"Qwen3ForCausalLM": "qwen3"}
    layer_names: LayerNames = QWEN3_LAYER_NAMES
    gguf_rope_layout: Mapping[str, str] = {"qwen3": "half"}
    default_rope_theta: float = 1_000_000.0

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """q/k norm per head."""
        return {"qk_norm": "head"}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """q/k norm per head; the sliding layers transformers 5 lists when `use_sliding_window` is on."""
        fields: dict[str, Any] = {"qk_norm": "head"}
        types = raw.get("layer_types")
        if types and "sliding_window" in base:
            fields["layer_types"] = tuple(str(t) for t in types)
        return fields


QWEN3_FAMILY = Qwen3Family()
"""The instance the registry holds."""
