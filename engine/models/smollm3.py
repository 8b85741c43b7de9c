"""SmolLM3: the llama block with some layers that apply no RoPE (NoPE): every fourth by default.
config.json lists them (`no_rope_layers`: 1 = RoPE, 0 = none) or gives the interval; llama.cpp
hard-codes the interval 4 for GGUF files, which carry no list (read `attention.rope_pattern` when one
does)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infer.engine.models.base import ModelLoadError
from infer.engine.models.decoder import DecoderFamily, GgufNumber

DEFAULT_NO_ROPE_INTERVAL = 4
"""Every 4th layer has no RoPE (SmolLM3's `no_rope_layer_interval`; llama.cpp's n_no_rope_layer_step)."""


def _no_rope(flags: list[Any], layers: int, what: str) -> tuple[int, ...]:
    """Indices of the layers whose flag says no RoPE (falsy), from a list of one flag per layer."""
    if len(flags) != layers:
        raise ModelLoadError(f"{what} has {len(flags)} entries, the model {layers} layers")
    return tuple(i for i, flag in enumerate(flags) if not flag)


class SmolLM3Family(DecoderFamily):
    """The SmolLM3 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("smollm3",)
    hf_architectures: Mapping[str, str] = {"SmolLM3ForCausalLM": "smollm3"}

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """The NoPE layers: the file's rope pattern, else every fourth."""
        layers, pattern = (
            base["num_hidden_layers"],
            meta.get(f"{base['architecture']}.attention.rope_pattern"),
        )
        if pattern is not None:
            return {"no_rope_layers": _no_rope(list(pattern), layers, "attention.rope_pattern")}
        return {"no_rope_layers": tuple(i for i in range(layers) if (i + 1) % DEFAULT_NO_ROPE_INTERVAL == 0)}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """The NoPE layers from `no_rope_layers`, else from `no_rope_layer_interval`."""
        layers = base["num_hidden_layers"]
        if raw.get("no_rope_layers") is not None:
            return {"no_rope_layers": _no_rope(list(raw["no_rope_layers"]), layers, "no_rope_layers")}
        interval = int(raw.get("no_rope_layer_interval") or DEFAULT_NO_ROPE_INTERVAL)
        return {"no_rope_layers": tuple(i for i in range(layers) if (i + 1) % interval == 0)}


SMOLLM3_FAMILY = SmolLM3Family()
"""The instance the registry holds."""
