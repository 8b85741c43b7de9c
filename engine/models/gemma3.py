"""The Gemma 3 family (text decoder): its config mapping, tensor names and shapes, and the model,
written once against the Backend protocol.

What sets it apart from the llama family, all here: sliding-window and global attention layers
interleaved by a pattern, each kind with its own RoPE base; RMSNorm of q and k per head (QK-norm);
GeGLU with the tanh gelu; the (1 + weight) RMSNorm convention with extra norms after attention and
after the feed-forward layer; embeddings scaled by sqrt(hidden) in the model's dtype; optional final
logit soft-capping; tied embeddings.

Canonical tensors use Hugging Face's names. llama.cpp's converter stores every Gemma norm weight as
1 + w; the config says so (`norm_weights_hold_one`) and the model takes the 1 off before adding it back
as Hugging Face does, so a GGUF and its safetensors twin give the same numbers.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from infer.engine.backends.base import Backend
from infer.engine.models.base import (
    Checkpoint,
    ModelConfig,
    ModelLoadError,
    Tensor,
    config_fields,
    gguf_number,
    gguf_rope_scaling,
    hf_rope,
)
from infer.engine.models.decoder import (
    FORGET_STRIDE,
    FULL,
    SLIDING,
    Activation,
    DecoderConfig,
    DecoderFamily,
    DecoderStack,
    LayerNames,
    QkNorm,
    RopeTable,
    inverse_frequencies,
)

__all__ = ["FORGET_STRIDE", "FULL", "GEMMA3_FAMILY", "SLIDING", "Gemma3Config", "Gemma3Family", "Gemma3Model"]

GEMMA_GGUF_LAYER_NAMES: Mapping[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
GEMMA_LAYER_NAMES = LayerNames(
    attn_norm="input_layernorm.weight",
    mlp_norm="pre_feedforward_layernorm.weight",
    post_attn_norm="post_attention_layernorm.weight",
    post_mlp_norm="post_feedforward_layernorm.weight",
    q_norm="self_attn.q_norm.weight",
    k_norm="self_attn.k_norm.weight",
)
"""Gemma's sandwich norms by role (Hugging Face names)."""

DEFAULT_SLIDING_PATTERN = 6
"""Every 6th layer is global (Gemma 3's `sliding_window_pattern`; llama.cpp hard-codes it for GGUF)."""
DEFAULT_LOCAL_ROPE_BASE = 10000.0
"""RoPE base of the sliding layers (`rope_local_base_freq`; llama.cpp's gemma3 default)."""


@dataclass(frozen=True)
class Gemma3Config(DecoderConfig):
    """DecoderConfig plus Gemma 3's fields (Hugging Face names); `rope_theta` and `rope_scaling` are the
    global layers'."""

    qk_norm: QkNorm = "head"
    activation: Activation = "gelu_tanh"
    layer_types: tuple[str, ...] = ()
    """Per layer: sliding_attention or full_attention."""
    sliding_window: int | None = 512
    """Positions a sliding layer's row sees, its own included."""
    rope_local_base_freq: float = DEFAULT_LOCAL_ROPE_BASE
    """RoPE base of the sliding layers (no scaling there)."""
    query_pre_attn_scalar: float = 256.0
    """Attention scores are scaled by query_pre_attn_scalar ** -0.5."""


def one_plus_weight(weight: np.ndarray, config: DecoderConfig) -> np.ndarray:
    """A Gemma RMSNorm weight as the model multiplies by it: 1 + w. Where the file stores 1 + w
    (`norm_weights_hold_one`: llama.cpp's converters) the 1 is taken off first (float32, as
    transformers' GGUF loader does) and added back, so a GGUF and its safetensors twin give the same
    numbers; Hugging Face computes (1 + w) in float32 on every call, the sum is the same bits once."""
    one = np.float32(1.0)
    if config.norm_weights_hold_one:
        weight = weight - one
    return one + weight


def _layer_types(pattern: Any, layers: int, source: str) -> tuple[str, ...]:
    """Layer kinds from a sliding-window pattern: an int n (every n-th layer global, as Gemma 3) or a
    list of booleans (True = sliding, llama.cpp's `attention.sliding_window_pattern` array)."""
    if isinstance(pattern, list):
        if len(pattern) != layers:
            raise ModelLoadError(f"{source}: sliding_window_pattern has {len(pattern)} entries, not {layers}")
        return tuple(SLIDING if bool(flag) else FULL for flag in pattern)
    if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
        raise ModelLoadError(f"{source}: sliding_window_pattern must be a positive integer, got {pattern!r}")
    return tuple(SLIDING if (i + 1) % pattern else FULL for i in range(layers))


class Gemma3Family(DecoderFamily):
    """The Gemma 3 family's declaration for the model registry: its own config reading (the
    sliding pattern, two RoPE bases), Gemma's norm names and (1 + w) weights."""

    architectures: tuple[str, ...] = ("gemma3",)
    hf_architectures: Mapping[str, str] = {"Gemma3ForCausalLM": "gemma3"}
    gguf_layer_names: Mapping[str, str] = GEMMA_GGUF_LAYER_NAMES
    layer_names: LayerNames = GEMMA_LAYER_NAMES

    def norm_weight(self, weight: np.ndarray, config: DecoderConfig) -> np.ndarray:
        """Gemma's 1 + w (see `one_plus_weight`)."""
        return one_plus_weight(weight, config)

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> Gemma3Config:
        """`gemma3.*` GGUF metadata as a Gemma3Config; fields llama.cpp hard-codes for the family
        (pattern 6, local RoPE base 10000, score scale 1/sqrt(head_dim)) take the same defaults."""

        def number(key: str, kind: type, default: Any = None) -> Any:
            return gguf_number(meta, f"{architecture}.{key}", source, kind, default)

        def optional(key: str) -> float | None:
            return number(key, float) if f"{architecture}.{key}" in meta else None

        hidden = number("embedding_length", int)
        heads = number("attention.head_count", int)
        head_dim = number("attention.key_length", int, hidden // heads)
        layers = number("block_count", int)
        vocab = meta.get(f"{architecture}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        rope_scaling = gguf_rope_scaling(meta, architecture, source)
        pattern = meta.get(f"{architecture}.attention.sliding_window_pattern", DEFAULT_SLIDING_PATTERN)
        return Gemma3Config(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=number("feed_forward_length", int),
            num_hidden_layers=layers,
            num_attention_heads=heads,
            num_key_value_heads=number("attention.head_count_kv", int, heads),
            head_dim=head_dim,
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", float),
            rope_theta=number("rope.freq_base", float, 1_000_000.0),
            max_position_embeddings=number("context_length", int, 32768),
            tie_word_embeddings=True,
            rope_layout="half",
            # Hugging Face scales the embedding rows by sqrt(hidden) cast to the weights' dtype.
            embedding_multiplier=math.sqrt(hidden),
            rope_scaling=rope_scaling,
            layer_types=_layer_types(pattern, layers, source),
            sliding_window=number("attention.sliding_window", int, 512),
            rope_local_base_freq=number("rope.freq_base_swa", float, DEFAULT_LOCAL_ROPE_BASE),
            query_pre_attn_scalar=float(head_dim),
            final_logit_softcapping=optional("final_logit_softcapping"),
            attn_logit_softcapping=optional("attn_logit_softcapping"),
            norm_weights_hold_one=True,
        )

    def config_from_hf(
        self, raw: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> Gemma3Config:
        """config.json (Gemma3ForCausalLM's text config) as a Gemma3Config."""
        with config_fields(source):
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            layers = int(raw["num_hidden_layers"])
            head_dim = int(raw.get("head_dim") or hidden // heads)
            types = raw.get("layer_types")
            if types is None:
                layer_types = _layer_types(
                    int(raw.get("sliding_window_pattern", DEFAULT_SLIDING_PATTERN)), layers, source
                )
            else:
                layer_types = tuple(str(t) for t in types)
            rope_theta, rope_scaling = hf_rope(raw, 1_000_000.0, "full_attention")
            # The sliding layers' RoPE: transformers 5 gives it under rope_parameters; transformers 4
            # only its base (rope_local_base_freq), and its rope_scaling is the global layers' alone,
            # so that must not reach this call.
            local = {"rope_theta": raw.get("rope_local_base_freq", DEFAULT_LOCAL_ROPE_BASE)}
            if "rope_parameters" in raw:
                local["rope_parameters"] = raw["rope_parameters"]
            local_base, local_scaling = hf_rope(local, DEFAULT_LOCAL_ROPE_BASE, "sliding_attention")
            if local_scaling:  # the model scales the global layers only
                raise ValueError(f"RoPE scaling on the sliding layers is not supported: {local_scaling}")
            caps = {
                key: (float(raw[key]) if raw.get(key) is not None else None)
                for key in ("final_logit_softcapping", "attn_logit_softcapping")
            }
            return Gemma3Config(
                architecture=architecture,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=layers,
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=head_dim,
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                max_position_embeddings=int(raw.get("max_position_embeddings", 32768)),
                tie_word_embeddings=True,
                rope_layout="half",
                embedding_multiplier=math.sqrt(hidden),
                rope_scaling=rope_scaling,
                layer_types=layer_types,
                sliding_window=int(raw.get("sliding_window", 512)),
                rope_local_base_freq=local_base,
                query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", head_dim)),
                **caps,
            )

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        """Shapes against the config; a stored lm_head (always tied in Gemma 3) is dropped; settings no
        backend implements are refused here rather than ignored."""
        weights.pop("lm_head.weight", None)
        if not isinstance(config, Gemma3Config):
            raise ModelLoadError(f"{source}: the gemma3 family needs a Gemma3Config")
        if len(config.layer_types) != config.num_hidden_layers:
            raise ModelLoadError(
                f"{source}: layer_types must name {config.num_hidden_layers} layers as "
                f"{SLIDING} or {FULL}, got {list(config.layer_types)}"
            )
        super().check_weights(config, weights, source)

    def build(self, checkpoint: Checkpoint, backend: Backend) -> Gemma3Model:
        """A Gemma3Model on `backend`."""
        if not isinstance(checkpoint.config, Gemma3Config):
            raise ModelLoadError(f"{checkpoint.source}: the gemma3 family needs a Gemma3Config")
        return Gemma3Model(checkpoint, backend, self.layer_names, self.norm_weight)


GEMMA3_FAMILY = Gemma3Family()
"""The instance the registry holds."""


class Gemma3Model(DecoderStack):
    """The shared block with Gemma 3's two RoPE kinds: the sliding layers' own base without
    scaling, and the score scale query_pre_attn_scalar ** -0.5 on both."""

    config: Gemma3Config

    def _rope_table(self, rotated: bool, sliding: bool, weights: Mapping[str, Tensor]) -> RopeTable:
        """The global layers' rotations, or the sliding layers' (their own base, no scaling)."""
        c = self.config
        score_scale = float(np.float32(c.query_pre_attn_scalar**-0.5))
        if sliding:
            c = replace(c, rope_theta=c.rope_local_base_freq, rope_scaling={})
        return RopeTable(inverse_frequencies(c, None), c.head_dim // 2, score_scale)
