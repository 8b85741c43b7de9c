"""The llama family (Llama 2/3, SmolLM2, Mistral, Qwen2): its config mapping, tensor names and shapes,
and the model, written once against the Backend protocol.

The family's checkpoint quirks live here and nowhere else: llama.cpp's converter permutes llama and
mistral q/k into interleaved RoPE pairs (qwen2 keeps Hugging Face's half-split layout), and Qwen2's
q/k/v projections carry a bias.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.base import Array, Backend, Weight
from infer.engine.backends.kv_cache import KVCache
from infer.engine.batch import ForwardBatch
from infer.engine.models.base import (
    Checkpoint,
    DecoderModel,
    ModelConfig,
    ModelLoadError,
    QuantizedTensor,
    Tensor,
    check_no_stray_layers,
    check_shapes,
    config_fields,
    gguf_number,
    gguf_rope_scaling,
    hf_rope,
)

ROPE_FREQS = "rope_freqs.weight"
"""GGUF's per-frequency RoPE divisors (llama3 scaling); kept under this name, it has no HF twin."""

# GGUF tensor names -> Hugging Face names (blk.N.* handled by the per-layer table).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    ROPE_FREQS: ROPE_FREQS,
}
_LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")


class LlamaFamily:
    """The llama family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("llama", "mistral", "qwen2")
    hf_architectures: Mapping[str, str] = {
        "LlamaForCausalLM": "llama",
        "MistralForCausalLM": "mistral",
        "Qwen2ForCausalLM": "qwen2",
    }

    def gguf_tensor_name(self, name: str) -> str | None:
        """Hugging Face name of a GGUF tensor (None for tensors the model does not use)."""
        canonical = _GLOBAL_NAMES.get(name)
        if canonical is None and (match := _LAYER_RE.match(name)):
            suffix = _LAYER_NAMES.get(match.group(2))
            canonical = f"model.layers.{match.group(1)}.{suffix}" if suffix else None
        return canonical

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        """`<arch>.*` GGUF metadata as a ModelConfig (HF field names)."""

        def number(key: str, kind: type, default: Any = None, positive: bool = True) -> Any:
            return gguf_number(meta, f"{architecture}.{key}", source, kind, default, positive=positive)

        hidden = number("embedding_length", int)
        heads = number("attention.head_count", int)
        vocab = meta.get(f"{architecture}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        rope_scaling = gguf_rope_scaling(meta, architecture, source)
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=number("feed_forward_length", int),
            num_hidden_layers=number("block_count", int),
            num_attention_heads=heads,
            num_key_value_heads=number("attention.head_count_kv", int, heads),
            head_dim=number("attention.key_length", int, hidden // heads),
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", float),
            rope_theta=number("rope.freq_base", float, 10000.0),
            max_position_embeddings=number("context_length", int, 2048),
            tie_word_embeddings="lm_head.weight" not in weights,
            attention_bias="model.layers.0.self_attn.q_proj.bias" in weights,
            # llama.cpp's converter permutes llama-family q/k into pairwise (interleaved) RoPE;
            # qwen2 keeps neox.
            rope_layout="half" if architecture == "qwen2" else "interleaved",
            rope_scaling=rope_scaling,
        )

    def config_from_hf(
        self, raw: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        """config.json as a ModelConfig; a missing lm_head means tied embeddings."""
        with config_fields(source):
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            rope_theta, rope_scaling = hf_rope(raw, 10000.0)
            return ModelConfig(
                architecture=architecture,
                vocab_size=int(raw["vocab_size"]),
                hidden_size=hidden,
                intermediate_size=int(raw["intermediate_size"]),
                num_hidden_layers=int(raw["num_hidden_layers"]),
                num_attention_heads=heads,
                num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
                head_dim=int(raw.get("head_dim") or hidden // heads),
                rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
                rope_theta=rope_theta,
                max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
                tie_word_embeddings=bool(raw.get("tie_word_embeddings", False))
                or "lm_head.weight" not in weights,
                attention_bias=bool(raw.get("attention_bias", architecture == "qwen2")),
                rope_layout="half",
                rope_scaling=rope_scaling,
            )

    def expected_shapes(self, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The shape every required weight must have for `config`, keyed by HF name."""
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

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        """Shapes against the config; a tied head's stored lm_head is dropped."""
        if config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        expected = self.expected_shapes(config)
        check_shapes(expected, weights, source)
        check_no_stray_layers(expected, weights, config.num_hidden_layers, source)
        factors = weights.get(ROPE_FREQS)
        if factors is not None and factors.shape != (config.head_dim // 2,):
            raise ModelLoadError(
                f"{source}: tensor {ROPE_FREQS} has shape {factors.shape}, expected ({config.head_dim // 2},)"
            )

    def build(self, checkpoint: Checkpoint, backend: Backend) -> LlamaModel:
        """A LlamaModel on `backend`."""
        return LlamaModel(checkpoint, backend)


LLAMA_FAMILY = LlamaFamily()
"""The instance the registry holds."""


def inverse_frequencies(config: ModelConfig, freq_factors: np.ndarray | None) -> np.ndarray:
    """RoPE inverse frequencies (float64) with llama3 / linear scaling applied."""
    dim = config.head_dim
    inv = 1.0 / (config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    scaling = config.rope_scaling
    kind = scaling.get("rope_type") or scaling.get("type")
    if freq_factors is not None:
        inv = inv / freq_factors.astype(np.float64)
    elif kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling.get("low_freq_factor", 1.0)), float(scaling.get("high_freq_factor", 4.0))
        original = float(scaling.get("original_max_position_embeddings", 8192))
        wavelen = 2 * np.pi / inv
        low_wavelen, high_wavelen = original / low, original / high
        smooth = (original / wavelen - low) / (high - low)
        scaled = np.where(wavelen > low_wavelen, inv / factor, inv)
        mid = (wavelen <= low_wavelen) & (wavelen >= high_wavelen)
        inv = np.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)
    elif kind == "linear":
        inv = inv / float(scaling["factor"])
    return inv


def half_to_interleaved(weight: np.ndarray, heads: int) -> np.ndarray:
    """Reorder each head's output rows from half-split RoPE pairs (i, i + d/2) to adjacent pairs
    (2i, 2i + 1), the permutation llama.cpp's converter applies to llama-family q/k.

    Attention only uses q.k dot products, so permuting q and k alike leaves the scores unchanged,
    while adjacent pairs let RoPE run as one complex multiplication for every layout.
    """
    rows = weight.shape[0]
    head_dim = rows // heads
    rest = weight.shape[1:]
    return weight.reshape(heads, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(rows, *rest)


@dataclass
class _Layer:
    # Output-major ([out, in], as Hugging Face stores them) for Backend.linear. Nothing is folded into
    # the matrices (they may be quantized blocks, which cannot be rescaled): the RMSNorm weights scale
    # the normalised input, and 1/sqrt(head_dim) is folded into q's RoPE rotations.
    attn_norm: Weight  # [hidden]
    qkv: Weight  # [q + 2 kv, hidden]
    qkv_bias: Weight | None
    out: Weight  # [hidden, q]
    mlp_norm: Weight  # [hidden]
    gate_up: Weight  # [2 * intermediate, hidden]
    down: Weight  # [hidden, intermediate]


class LlamaModel(DecoderModel):
    """Decoder-only llama-family transformer over a ragged batch and a slot-based KV cache."""

    def __init__(self, checkpoint: Checkpoint, backend: Backend) -> None:
        self.config = config = checkpoint.config
        self.backend = backend
        self.float_copies: set[str] = set()
        """GGUF types of matrices held as float32 copies because the backend has no kernels for them."""
        weights = checkpoint.weights
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads

        def q_k_rows(name: str, count: int) -> Tensor:
            w = weights.pop(name)
            if config.rope_layout != "half":
                return w
            if isinstance(w, QuantizedTensor):  # whole rows of blocks move, as the floats would
                return w.with_rows(half_to_interleaved(np.arange(w.shape[0]), count))
            return half_to_interleaved(w, count)

        self.layers: list[_Layer] = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            q = q_k_rows(p + "self_attn.q_proj.weight", heads)
            k = q_k_rows(p + "self_attn.k_proj.weight", kv_heads)
            v = weights.pop(p + "self_attn.v_proj.weight")
            bias = None
            if config.attention_bias:
                qb = q_k_rows(p + "self_attn.q_proj.bias", heads)
                kb = q_k_rows(p + "self_attn.k_proj.bias", kv_heads)
                bias = backend.weight(np.concatenate([qb, kb, weights.pop(p + "self_attn.v_proj.bias")]))
            gate = weights.pop(p + "mlp.gate_proj.weight")
            up = weights.pop(p + "mlp.up_proj.weight")
            self.layers.append(
                _Layer(
                    attn_norm=backend.weight(weights.pop(p + "input_layernorm.weight")),
                    qkv=self._matrix(q, k, v),
                    qkv_bias=bias,
                    out=self._matrix(weights.pop(p + "self_attn.o_proj.weight")),
                    mlp_norm=backend.weight(weights.pop(p + "post_attention_layernorm.weight")),
                    gate_up=self._matrix(gate, up),
                    down=self._matrix(weights.pop(p + "mlp.down_proj.weight")),
                )
            )
        self.embed = self._matrix(weights["model.embed_tokens.weight"])
        # [vocab, hidden], shared with the embedding when tied; Backend.logits reads it transposed.
        self.lm_head = self.embed if config.tie_word_embeddings else self._matrix(weights["lm_head.weight"])
        self.final_norm = backend.weight(weights["model.norm.weight"])
        self._inv_freq = inverse_frequencies(config, weights.get(ROPE_FREQS))
        self._score_scale = np.float32(1.0 / np.sqrt(config.head_dim))
        self._rotations = np.zeros((0, config.head_dim // 2), dtype=np.complex64)
        self._q_rotations = self._rotations

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection."""
        return int(self.lm_head.shape[0])

    def _rope_rotations(self, positions: np.ndarray) -> tuple[Array, Array]:
        """(q's, k's) cos + i sin of every (position, frequency), complex64 [rows, head_dim / 2], on the
        device; q's carry the attention score scale 1/sqrt(head_dim) (RoPE is linear), so scores need
        no scaling pass."""
        needed = int(positions.max()) + 1
        if needed > self._rotations.shape[0]:
            size = max(needed, 2 * self._rotations.shape[0], 256)
            angles = np.outer(np.arange(size, dtype=np.float64), self._inv_freq)
            rotations = np.exp(1j * angles)
            self._rotations = rotations.astype(np.complex64)
            self._q_rotations = (rotations * float(self._score_scale)).astype(np.complex64)
        return self.backend.asarray(self._q_rotations[positions]), self.backend.asarray(
            self._rotations[positions]
        )

    def forward_logits(self, batch: ForwardBatch, cache: KVCache) -> Array:
        """`forward`, with the logits left where the backend computed them (for device sampling)."""
        backend, c = self.backend, self.config
        rows = batch.token_ids.shape[0]
        # Host-side plan: each row's position and slot, and how attention splits the rows.
        starts = np.asarray([s.start for s in batch.segments], dtype=np.int64)
        lengths = np.asarray([s.length for s in batch.segments], dtype=np.int64)
        slots = np.asarray([s.slot for s in batch.segments], dtype=np.int64)
        plan = AttentionPlan.build(slots, starts, lengths)
        slots_per_row, positions = plan.row_slots, plan.row_visible - 1  # a row sees up to its own position
        q_rotations, k_rotations = self._rope_rotations(positions)
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim

        hidden = backend.embed(self.embed, batch.token_ids)
        for index, layer in enumerate(self.layers):
            normed = backend.rms_norm(hidden, layer.attn_norm, c.rms_norm_eps)
            qkv = backend.linear(normed, layer.qkv, layer.qkv_bias)
            q = backend.rope(qkv[:, :q_width].reshape(rows, heads, head_dim), q_rotations)
            k = backend.rope(
                qkv[:, q_width : q_width + kv_width].reshape(rows, kv_heads, head_dim), k_rotations
            )
            v = qkv[:, q_width + kv_width :].reshape(rows, kv_heads, head_dim)
            backend.write_kv(cache, index, slots_per_row, positions, k, v)
            attn = backend.attention(q, cache, index, plan)
            hidden += backend.linear(attn.reshape(rows, q_width), layer.out)
            gate_up = backend.linear(backend.rms_norm(hidden, layer.mlp_norm, c.rms_norm_eps), layer.gate_up)
            hidden += backend.linear(backend.silu_mul(gate_up, c.intermediate_size), layer.down)

        last = backend.rms_norm(hidden[backend.asarray(batch.logit_rows)], self.final_norm, c.rms_norm_eps)
        return backend.logits(last, self.lm_head)
