"""The in-memory checkpoint both loaders produce: config, float32 weights, tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np

if TYPE_CHECKING:
    from infer.engine.text.tokenizer import Tokenizer

RopeLayout = Literal["interleaved", "half"]
"""How RoPE pairs the dimensions of a head.

`interleaved`: (0,1), (2,3), ... -- llama.cpp's "normal" mode; GGUF llama-family q/k weights are
permuted into it by the converter. `half`: (i, i + d/2) -- Hugging Face's rotate_half ("neox")."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, with Hugging Face field names."""

    architecture: str
    """Family name: llama, mistral, qwen2 (smollm2 is llama)."""
    vocab_size: int
    """Rows of the embedding table."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU feed-forward layer."""
    num_hidden_layers: int
    """Number of transformer blocks."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int
    """Key/value heads per layer (grouped-query attention when fewer than query heads)."""
    head_dim: int
    """Width of one attention head."""
    rms_norm_eps: float
    """Epsilon inside RMSNorm."""
    rope_theta: float
    """RoPE base frequency."""
    max_position_embeddings: int
    """Context length the model was trained for."""
    tie_word_embeddings: bool
    """The output projection reuses the embedding table."""
    attention_bias: bool = False
    """q/k/v projections carry a bias (Qwen2)."""
    rope_layout: RopeLayout = "half"
    """Pairing of RoPE dimensions in the stored q/k weights."""
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    """Hugging Face rope_scaling (llama3, linear), empty when none."""


@dataclass
class Checkpoint:
    """What a loader hands the model: config, named float32 weights (HF names, [out, in]) and tokenizer."""

    config: ModelConfig
    weights: dict[str, np.ndarray]
    tokenizer: Tokenizer
    source: str
    """The file or folder it came from (for messages and fingerprints)."""
    rope_freq_factors: np.ndarray | None = None
    """Per-frequency divisors from GGUF `rope_freqs.weight` (llama3 scaling); None when absent."""


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """The shape every weight must have for `config`, keyed by HF name."""
    hidden, inter, head = config.hidden_size, config.intermediate_size, config.head_dim
    q_out = config.num_attention_heads * head
    kv_out = config.num_key_value_heads * head
    shapes: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (config.vocab_size, hidden),
        "model.norm.weight": (hidden,),
    }
    if not config.tie_word_embeddings:
        shapes["lm_head.weight"] = (config.vocab_size, hidden)
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (hidden,),
            p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (q_out, hidden),
            p + "self_attn.k_proj.weight": (kv_out, hidden),
            p + "self_attn.v_proj.weight": (kv_out, hidden),
            p + "self_attn.o_proj.weight": (hidden, q_out),
            p + "mlp.gate_proj.weight": (inter, hidden),
            p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter),
        }
        if config.attention_bias:
            shapes |= {
                p + "self_attn.q_proj.bias": (q_out,),
                p + "self_attn.k_proj.bias": (kv_out,),
                p + "self_attn.v_proj.bias": (kv_out,),
            }
    return shapes


def check_weights(config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
    """Raise ModelLoadError naming the first missing weight or shape that disagrees with the config."""
    from infer.engine.loader.errors import ModelLoadError

    for name, shape in expected_shapes(config).items():
        if name not in weights:
            raise ModelLoadError(f"{source}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {tuple(weights[name].shape)}, the config implies {shape}"
            )
