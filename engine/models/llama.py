"""The llama family (Llama 2/3, SmolLM2, Mistral, Qwen2): the shared decoder block as it is, plus
Qwen2's q/k/v bias.

llama.cpp's converter permutes llama and mistral q/k into interleaved RoPE pairs; qwen2 keeps Hugging
Face's half-split layout (its NEOX RoPE), and Qwen2's q/k/v projections carry a bias.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.models.decoder import (
    ROPE_FREQS,
    DecoderFamily,
    DecoderStack,
    half_to_interleaved,
    inverse_frequencies,
)

__all__ = [
    "LLAMA_FAMILY",
    "ROPE_FREQS",
    "LlamaFamily",
    "LlamaModel",
    "half_to_interleaved",
    "inverse_frequencies",
]

LlamaModel = DecoderStack
"""The model the family builds (the shared block; the name scripts and older code use)."""


class LlamaFamily(DecoderFamily):
    """The llama family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("llama", "mistral", "qwen2")
    hf_architectures: Mapping[str, str] = {
        "LlamaForCausalLM": "llama",
        "MistralForCausalLM": "mistral",
        "Qwen2ForCausalLM": "qwen2",
    }
    gguf_rope_layout: Mapping[str, str] = {"qwen2": "half"}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """Qwen2's q/k/v carry a bias unless its config says otherwise."""
        return {"attention_bias": bool(raw.get("attention_bias", base["architecture"] == "qwen2"))}


LLAMA_FAMILY = LlamaFamily()
"""The instance the registry holds."""
