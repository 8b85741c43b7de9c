"""Granite (3.x dense): the llama block with four multipliers: on the embeddings, on each branch's
output before the residual add, as the attention score scale (instead of 1/sqrt(head_dim)), and a
divisor of the logits. llama.cpp's converter names them `*_scale` and permutes q/k as for llama."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.models.decoder import DecoderFamily, GgufNumber

_MULTIPLIERS = {  # DecoderConfig field (Hugging Face's name) -> GGUF key under the architecture
    "embedding_multiplier": "embedding_scale",
    "residual_multiplier": "residual_scale",
    "attention_multiplier": "attention.scale",
    "logits_scaling": "logit_scale",
}


class GraniteFamily(DecoderFamily):
    """The Granite family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("granite",)
    hf_architectures: Mapping[str, str] = {"GraniteForCausalLM": "granite"}

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """The multipliers the file carries (an absent one is 1, i.e. none)."""
        arch = base["architecture"]
        return {field: number(key, float) for field, key in _MULTIPLIERS.items() if f"{arch}.{key}" in meta}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """The multipliers config.json sets."""
        return {field: float(raw[field]) for field in _MULTIPLIERS if raw.get(field) is not None}


GRANITE_FAMILY = GraniteFamily()
"""The instance the registry holds."""
