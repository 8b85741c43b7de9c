"""The decoder block every built-in family runs, and the family declaration it is configured by.

A family says only how it differs (`DecoderFamily` attributes and two small hooks): which norms sit
where (its `layer_names`: a norm it lacks is None), RMSNorm of q and k (`qk_norm`), the activation,
sliding-window layers, layers without RoPE, partial rotary dimensions, RoPE scaling, and the scalar
multipliers some families put on the embeddings, the residual branches, the attention scores and the
logits. `DecoderStack` runs any
combination of them, written once against the Backend protocol; its op order for each combination is
the one transformers computes, so a family's numbers match transformers in float32.

RoPE always runs as adjacent pairs (2i, 2i + 1) rotated by complex numbers (`Backend.rope`): q/k rows
stored with Hugging Face's half-split pairs (i, i + d/2) are permuted into adjacent pairs at load
(`rope_row_order`), which leaves q.k unchanged. The score scale is folded into q's rotations (RoPE is
linear), dimensions without rotation (partial rotary) get the rotation 1 (q's: the score scale), and a
layer without RoPE rotates by those alone, so every layer takes the same path.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.base import Array, Backend, RowDecoder, RowLayer, RowShape, Weight
from infer.engine.backends.kv_cache import KVCache
from infer.engine.batch import ForwardBatch
from infer.engine.models.base import (
    SUPPORTED_ROPE_TYPES,
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
SLIDING = "sliding_attention"
FULL = "full_attention"
FORGET_STRIDE = 256
"""Positions a sliding layer's cache gives back at a time, once they fell out of every window."""

QkNorm = Literal["none", "head", "full"]
"""RMSNorm of q and k before RoPE: per head over head_dim (Qwen3, Gemma 3) or over the whole
projection (OLMo 2)."""
Activation = Literal["silu", "gelu_tanh"]
"""The gated feed-forward layer's activation: SwiGLU or GeGLU with the tanh gelu."""


@dataclass(frozen=True)
class DecoderConfig(ModelConfig):
    """ModelConfig plus the ways the built-in families differ (Hugging Face names where they have
    one); the defaults are Llama's."""

    qk_norm: QkNorm = "none"
    """RMSNorm of q and k before RoPE (see QkNorm)."""
    activation: Activation = "silu"
    """The feed-forward layer's gate activation."""
    layer_types: tuple[str, ...] = ()
    """Per layer: sliding_attention or full_attention; empty means every layer is full."""
    sliding_window: int | None = None
    """Positions a sliding layer's row sees, its own included."""
    no_rope_layers: tuple[int, ...] = ()
    """Layers whose q and k are not rotated (SmolLM3's NoPE layers)."""
    partial_rotary_factor: float = 1.0
    """Share of each head's dimensions RoPE rotates (the first ones; Phi-4-mini: 0.75)."""
    attention_multiplier: float | None = None
    """Attention score scale instead of 1/sqrt(head_dim) (Granite)."""
    embedding_multiplier: float | None = None
    """The embedding rows are multiplied by it (Granite)."""
    residual_multiplier: float | None = None
    """Each branch's output is multiplied by it before the residual add (Granite)."""
    logits_scaling: float | None = None
    """The logits are divided by it (Granite)."""
    final_logit_softcapping: float | None = None
    """logits = cap * tanh(logits / cap) when set."""
    attn_logit_softcapping: float | None = None
    """Attention scores = cap * tanh(scores / cap) before the softmax when set (Gemma 2)."""
    norm_weights_hold_one: bool = False
    """The checkpoint's norm weights are stored as 1 + w for a family that applies 1 + w (llama.cpp's
    Gemma converters add the 1; Hugging Face stores w)."""

    @property
    def rotary_dim(self) -> int:
        """Dimensions of each head RoPE rotates (even)."""
        return int(self.head_dim * self.partial_rotary_factor) // 2 * 2


def rotary_pairs(config: ModelConfig) -> int:
    """Pairs of each head RoPE rotates: the rotary dimensions of a DecoderConfig, all of a plain one."""
    return (config.rotary_dim if isinstance(config, DecoderConfig) else config.head_dim) // 2


def rope_row_order(head_dim: int, rotary_dim: int) -> np.ndarray:
    """The order that takes one head's dimensions from Hugging Face's half-split RoPE pairs
    (i, i + rotary_dim/2) over the first `rotary_dim` dimensions to adjacent pairs (2i, 2i + 1), the
    permutation llama.cpp's converter applies to llama-family q/k; the unrotated rest keeps its place."""
    half = rotary_dim // 2
    rotated = np.stack([np.arange(half), np.arange(half, rotary_dim)], axis=1).reshape(-1)
    return np.concatenate([rotated, np.arange(rotary_dim, head_dim)]).astype(np.int64)


def half_to_interleaved(weight: np.ndarray, heads: int) -> np.ndarray:
    """Reorder each head's output rows from half-split RoPE pairs (i, i + d/2) to adjacent pairs
    (2i, 2i + 1) (the whole head rotated): :func:`rope_row_order` applied to every head's rows."""
    head_dim = weight.shape[0] // heads
    order = rope_row_order(head_dim, head_dim)
    return weight[(np.arange(heads)[:, None] * head_dim + order[None, :]).reshape(-1)]


def inverse_frequencies(
    config: ModelConfig, freq_factors: np.ndarray | None, dim: int | None = None
) -> np.ndarray:
    """RoPE inverse frequencies (float64, `dim` / 2 of them; `dim` defaults to head_dim) with llama3 /
    linear scaling or per-frequency divisors (`freq_factors`: llama3's rope_freqs, longrope's
    factors) applied."""
    dim = config.head_dim if dim is None else dim
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


class RopeTable:
    """cos + i sin of every (position, pair) of one RoPE kind, grown on demand, complex64: k's, and
    q's that also carry the score scale. Pairs past the rotated ones (partial rotary, or a layer
    without RoPE: no pair rotated) have frequency 0, so they rotate by exactly 1 (q's: the scale);
    `magnitude` scales the rotated pairs' cos and sin (longrope's attention factor)."""

    def __init__(self, inv_freq: np.ndarray, pairs: int, score_scale: float, magnitude: float = 1.0) -> None:
        self._inv_freq = np.concatenate([inv_freq, np.zeros(pairs - inv_freq.size)])
        self._magnitude = np.where(np.arange(pairs) < inv_freq.size, magnitude, 1.0)
        self._score_scale = score_scale
        self._k = np.zeros((0, pairs), dtype=np.complex64)
        self._q = self._k

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(q's, k's) rotations of `positions`, complex64 [rows, head_dim / 2] on the host."""
        needed = int(positions.max()) + 1
        if needed > self._k.shape[0]:
            size = max(needed, 2 * self._k.shape[0], 256)
            rotations = np.exp(1j * np.outer(np.arange(size, dtype=np.float64), self._inv_freq))
            if (self._magnitude != 1.0).any():
                rotations = rotations * self._magnitude
            self._k = rotations.astype(np.complex64)
            self._q = (rotations * self._score_scale).astype(np.complex64)
        return self._q[positions], self._k[positions]


@dataclass(frozen=True)
class LayerNames:
    """Each role's Hugging Face tensor name inside `model.layers.N.` (None: the family has none).

    The norms present say where a block normalises: before attention and the feed-forward layer
    (Llama), those plus one on each branch's output (Gemma's sandwich), or on the outputs only (OLMo 2)."""

    attn_norm: str | None = "input_layernorm.weight"
    mlp_norm: str | None = "post_attention_layernorm.weight"
    post_attn_norm: str | None = None
    post_mlp_norm: str | None = None
    q_norm: str | None = None
    k_norm: str | None = None
    qkv: tuple[str, ...] = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
    """One fused [q + 2 kv, hidden] tensor (Phi-3) or q, k and v."""
    qkv_bias: tuple[str, ...] = ("self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias")
    out: str = "self_attn.o_proj.weight"
    gate_up: tuple[str, ...] = ("mlp.gate_proj.weight", "mlp.up_proj.weight")
    """One fused [2 intermediate, hidden] tensor (Phi-3) or gate and up."""
    down: str = "mlp.down_proj.weight"


LLAMA_GGUF_LAYER_NAMES: Mapping[str, str] = {
    "attn_norm.weight": "input_layernorm.weight",
    "ffn_norm.weight": "post_attention_layernorm.weight",
    "attn_q.weight": "self_attn.q_proj.weight",
    "attn_k.weight": "self_attn.k_proj.weight",
    "attn_v.weight": "self_attn.v_proj.weight",
    "attn_q.bias": "self_attn.q_proj.bias",
    "attn_k.bias": "self_attn.k_proj.bias",
    "attn_v.bias": "self_attn.v_proj.bias",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_output.weight": "self_attn.o_proj.weight",
    "ffn_gate.weight": "mlp.gate_proj.weight",
    "ffn_up.weight": "mlp.up_proj.weight",
    "ffn_down.weight": "mlp.down_proj.weight",
}
"""GGUF layer tensor suffixes -> Hugging Face's, as llama.cpp names them for the llama family; a
family whose norms mean something else overrides entries (`DecoderFamily.gguf_layer_names`)."""
GGUF_GLOBAL_NAMES: Mapping[str, str] = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
    ROPE_FREQS: ROPE_FREQS,
}
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")

GgufNumber = Callable[..., Any]
"""`number(key, kind, default=None, positive=True)`: the `<arch>.<key>` GGUF field (gguf_number)."""


class DecoderFamily:
    """A family of the shared decoder block: the Llama reading of GGUF metadata and config.json, the
    tensor names and shapes, and the model, with hooks for what a family adds. A subclass sets the
    class attributes and, where it has settings of its own, `gguf_fields` / `hf_fields`."""

    architectures: tuple[str, ...] = ()
    hf_architectures: Mapping[str, str] = {}
    gguf_layer_names: Mapping[str, str] = LLAMA_GGUF_LAYER_NAMES
    """GGUF layer tensor suffixes -> Hugging Face's."""
    layer_names: LayerNames = LayerNames()
    """Each role's Hugging Face tensor name."""
    gguf_rope_layout: Mapping[str, str] = {}
    """Architectures whose GGUF q/k rows llama.cpp's converter leaves half-split (its NEOX RoPE);
    the others it permutes into adjacent pairs."""
    default_rope_theta: float = 10000.0
    config_class: type[DecoderConfig] = DecoderConfig
    """The config type the readings build (a family with fields of its own subclasses DecoderConfig)."""
    rope_types: frozenset[str] = SUPPORTED_ROPE_TYPES
    """RoPE scaling kinds of config.json the family computes (Phi-3 adds longrope)."""

    # -- hooks -----------------------------------------------------------------------------------
    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """DecoderConfig fields of the family's own, read from GGUF metadata (`base`: the fields read
        so far, which this may change)."""
        return {}

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """DecoderConfig fields of the family's own, read from config.json."""
        return {}

    def norm_weight(self, weight: np.ndarray, config: DecoderConfig) -> np.ndarray:
        """A stored RMSNorm weight as the model multiplies by it (Gemma's are 1 + w)."""
        return weight

    # -- the registry's interface ----------------------------------------------------------------
    def gguf_tensor_name(self, name: str) -> str | None:
        """Hugging Face name of a GGUF tensor (None for tensors the model does not use)."""
        canonical = GGUF_GLOBAL_NAMES.get(name)
        if canonical is None and (match := _LAYER_RE.match(name)):
            suffix = self.gguf_layer_names.get(match.group(2))
            canonical = f"model.layers.{match.group(1)}.{suffix}" if suffix else None
        return canonical

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> DecoderConfig:
        """`<arch>.*` GGUF metadata as a DecoderConfig (HF field names)."""

        def number(key: str, kind: type, default: Any = None, positive: bool = True) -> Any:
            return gguf_number(meta, f"{architecture}.{key}", source, kind, default, positive=positive)

        hidden = number("embedding_length", int)
        heads = number("attention.head_count", int)
        head_dim = number("attention.key_length", int, hidden // heads)
        vocab = meta.get(f"{architecture}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
        base: dict[str, Any] = dict(
            architecture=architecture,
            vocab_size=int(vocab),
            hidden_size=hidden,
            intermediate_size=number("feed_forward_length", int),
            num_hidden_layers=number("block_count", int),
            num_attention_heads=heads,
            num_key_value_heads=number("attention.head_count_kv", int, heads),
            head_dim=head_dim,
            rms_norm_eps=number("attention.layer_norm_rms_epsilon", float),
            rope_theta=number("rope.freq_base", float, self.default_rope_theta),
            max_position_embeddings=number("context_length", int, 2048),
            tie_word_embeddings="lm_head.weight" not in weights,
            attention_bias="model.layers.0.self_attn.q_proj.bias" in weights,
            rope_layout=self.gguf_rope_layout.get(architecture, "interleaved"),
            rope_scaling=gguf_rope_scaling(meta, architecture, source),
        )
        rope_dims = number("rope.dimension_count", int, head_dim)
        if rope_dims != head_dim:
            base["partial_rotary_factor"] = rope_dims / head_dim
        window = number("attention.sliding_window", int, 0, positive=False)
        if window > 0:
            base["sliding_window"] = window
        base |= self.gguf_fields(meta, number, base)
        return self.config_class(**base)

    def config_from_hf(
        self, raw: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> DecoderConfig:
        """config.json as a DecoderConfig; a missing lm_head means tied embeddings."""
        with config_fields(source):
            hidden = int(raw["hidden_size"])
            heads = int(raw["num_attention_heads"])
            rope_theta, rope_scaling = hf_rope(raw, self.default_rope_theta, supported=self.rope_types)
            base: dict[str, Any] = dict(
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
                attention_bias=bool(raw.get("attention_bias", False)),
                rope_layout="half",
                rope_scaling=rope_scaling,
            )
            # transformers 5 keeps partial_rotary_factor among the rope parameters, 4 beside them.
            params = raw.get("rope_parameters")
            partial = rope_scaling.pop("partial_rotary_factor", None) or raw.get("partial_rotary_factor")
            if partial is None and isinstance(params, Mapping):
                partial = params.get("partial_rotary_factor")
            if partial is not None and float(partial) != 1.0:
                base["partial_rotary_factor"] = float(partial)
            if raw.get("use_sliding_window", True) and raw.get("sliding_window"):
                base["sliding_window"] = int(raw["sliding_window"])
            base |= self.hf_fields(raw, base)
            return self.config_class(**base)

    def expected_shapes(self, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The shape every required weight must have for `config`, keyed by HF name."""
        names = self.layer_names
        hidden, inter, head = config.hidden_size, config.intermediate_size, config.head_dim
        q_out = config.num_attention_heads * head
        kv_out = config.num_key_value_heads * head
        shapes: dict[str, tuple[int, ...]] = {
            "model.embed_tokens.weight": (config.vocab_size, hidden),
            "model.norm.weight": (hidden,),
        }
        if not config.tie_word_embeddings:
            shapes["lm_head.weight"] = (config.vocab_size, hidden)
        qk_norm = getattr(config, "qk_norm", "none")
        norm_widths = {"head": (head, head), "full": (q_out, kv_out)}.get(qk_norm)
        qkv_rows = (q_out, kv_out, kv_out) if len(names.qkv) == 3 else (q_out + 2 * kv_out,)
        gate_up_rows = (inter, inter) if len(names.gate_up) == 2 else (2 * inter,)
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            for name in (names.attn_norm, names.mlp_norm, names.post_attn_norm, names.post_mlp_norm):
                if name is not None:
                    shapes[p + name] = (hidden,)
            shapes |= {p + n: (rows, hidden) for n, rows in zip(names.qkv, qkv_rows, strict=True)}
            shapes |= {p + n: (rows, hidden) for n, rows in zip(names.gate_up, gate_up_rows, strict=True)}
            shapes[p + names.out] = (hidden, q_out)
            shapes[p + names.down] = (hidden, inter)
            if config.attention_bias:
                shapes |= {
                    p + n: (rows,) for n, rows in zip(names.qkv_bias, (q_out, kv_out, kv_out), strict=True)
                }
            if norm_widths is not None and names.q_norm and names.k_norm:
                shapes[p + names.q_norm], shapes[p + names.k_norm] = ((norm_widths[0],), (norm_widths[1],))
        return shapes

    def stored_shapes(self, config: ModelConfig, weights: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """The shapes `check_weights` holds the checkpoint's tensors to: `expected_shapes`, unless a
        family's checkpoints may store a tensor in more than one form (Qwen3-MoE's experts)."""
        return self.expected_shapes(config)

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        """Shapes against the config; a tied head's stored lm_head is dropped; the config's own
        values checked."""
        if config.tie_word_embeddings:
            weights.pop("lm_head.weight", None)
        expected = self.stored_shapes(config, weights)
        check_shapes(expected, weights, source)
        check_no_stray_layers(expected, weights, config.num_hidden_layers, source)
        factors = weights.get(ROPE_FREQS)
        pairs = rotary_pairs(config)
        if factors is not None and factors.shape != (pairs,):
            raise ModelLoadError(
                f"{source}: tensor {ROPE_FREQS} has shape {factors.shape}, expected ({pairs},)"
            )
        if isinstance(config, DecoderConfig):
            check_decoder_config(config, source)

    def build(self, checkpoint: Checkpoint, backend: Backend) -> DecoderStack:
        """The model on `backend`."""
        return DecoderStack(checkpoint, backend, self.layer_names, self.norm_weight)


def check_decoder_config(config: DecoderConfig, source: str) -> None:
    """ModelLoadError for a DecoderConfig value the block cannot run as asked."""
    unknown = sorted(set(config.layer_types) - {SLIDING, FULL})
    if config.layer_types and (unknown or len(config.layer_types) != config.num_hidden_layers):
        raise ModelLoadError(
            f"{source}: layer_types must name {config.num_hidden_layers} layers as {SLIDING} or {FULL}, "
            f"got {list(config.layer_types)}"
        )
    if SLIDING in config.layer_types and not config.sliding_window:
        raise ModelLoadError(f"{source}: sliding_attention layers need a sliding_window")
    if config.sliding_window is not None and config.sliding_window < 1:
        raise ModelLoadError(f"{source}: sliding_window must be at least 1, got {config.sliding_window}")
    stray = [i for i in config.no_rope_layers if not 0 <= i < config.num_hidden_layers]
    if stray:
        raise ModelLoadError(f"{source}: no_rope_layers names layers {stray} of {config.num_hidden_layers}")
    if not 0 < config.rotary_dim <= config.head_dim:
        raise ModelLoadError(
            f"{source}: partial_rotary_factor {config.partial_rotary_factor} leaves {config.rotary_dim} "
            f"of {config.head_dim} dimensions rotated"
        )
    for name in (
        "attention_multiplier",
        "embedding_multiplier",
        "residual_multiplier",
        "logits_scaling",
        "attn_logit_softcapping",
        "final_logit_softcapping",
    ):
        value = getattr(config, name)
        if value is not None and not (np.isfinite(value) and value > 0):
            raise ModelLoadError(f"{source}: {name} must be a positive number, got {value}")


@dataclass
class DecoderLayer:
    """One block's weights, output-major ([out, in], as Hugging Face stores them) for Backend.linear.
    Nothing is folded into the matrices (they may be quantized blocks, which cannot be rescaled): the
    RMSNorm weights scale the normalised input, the score scale rides on q's RoPE rotations."""

    attn_norm: Weight | None  # [hidden]
    qkv: Weight  # [q + 2 kv, hidden]
    qkv_bias: Weight | None
    q_norm: Weight | None  # [head_dim] or [q]
    k_norm: Weight | None  # [head_dim] or [kv]
    out: Weight  # [hidden, q]
    post_attn_norm: Weight | None
    mlp_norm: Weight | None
    post_mlp_norm: Weight | None
    gate_up: Weight | None = None  # [2 * intermediate, hidden]; None in a mixture-of-experts layer
    down: Weight | None = None  # [hidden, intermediate]
    experts: Any = None
    """A mixture-of-experts layer's weights (the family's own type), None in a dense layer."""
    rope: int = 0
    """Index of the layer's RopeTable."""
    sliding: bool = False
    """The layer attends within the sliding window."""


def _rows(tensor: Tensor, order: np.ndarray) -> Tensor:
    """`tensor` with its rows taken in `order` (whole rows of blocks move, as the floats would)."""
    if isinstance(tensor, QuantizedTensor):
        return tensor.with_rows(order)
    return np.asarray(tensor)[order]


class DecoderStack(DecoderModel):
    """The shared decoder-only transformer over a ragged batch and a slot-based KV cache.

    Sliding layers attend through a window view of the cache (`AttentionPlan.with_window`), and their
    positions that fell out of every future window are given back to the system
    (`KVCache.forget_before`), so their resident memory follows the window, as a ring's would.
    """

    def __init__(
        self,
        checkpoint: Checkpoint,
        backend: Backend,
        names: LayerNames = LayerNames(),
        norm_weight: Callable[[np.ndarray, DecoderConfig], np.ndarray] = lambda w, c: w,
    ) -> None:
        config = checkpoint.config
        if not isinstance(config, DecoderConfig):  # a plain ModelConfig runs as Llama
            config = DecoderConfig(**{f: getattr(config, f) for f in ModelConfig.__dataclass_fields__})
        self.config: DecoderConfig = config
        self.backend = backend
        self.float_copies: set[str] = set()
        """GGUF types of matrices held as float32 copies because the backend has no kernels for them."""
        weights = checkpoint.weights
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        # Where each head's dimensions go so that RoPE pairs are adjacent.
        pair_order = (
            rope_row_order(head_dim, config.rotary_dim)
            if config.rope_layout == "half"
            else np.arange(head_dim, dtype=np.int64)
        )
        q_order = (np.arange(heads)[:, None] * head_dim + pair_order).reshape(-1)
        k_order = (np.arange(kv_heads)[:, None] * head_dim + pair_order).reshape(-1)
        qkv_order = np.concatenate([q_order, q_width + k_order, q_width + kv_width + np.arange(kv_width)])
        # q/k norm weights follow their rows' order; a family without q/k norms has none to read.
        norm_order = {"head": (pair_order, pair_order), "full": (q_order, k_order)}.get(config.qk_norm)
        if not (names.q_norm and names.k_norm):
            norm_order = None

        def norm(name: str | None, order: np.ndarray | None = None) -> Weight | None:
            if name is None:
                return None
            w = norm_weight(np.asarray(weights.pop(name), dtype=np.float32), config)
            return backend.weight(w if order is None else w[order])

        rope_kinds: dict[tuple[bool, bool], int] = {}
        self.layers: list[DecoderLayer] = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            qkv_parts = [weights.pop(p + n) for n in names.qkv]
            if len(qkv_parts) == 1:
                qkv_parts = [_rows(qkv_parts[0], qkv_order)]
            else:
                qkv_parts = [_rows(qkv_parts[0], q_order), _rows(qkv_parts[1], k_order), qkv_parts[2]]
            bias = None
            if config.attention_bias:
                qb, kb, vb = (np.asarray(weights.pop(p + n)) for n in names.qkv_bias)
                bias = backend.weight(np.concatenate([qb[q_order], kb[k_order], vb]))
            sliding = (
                config.layer_types[i] == SLIDING if config.layer_types else config.sliding_window is not None
            )
            kind = (i not in config.no_rope_layers, sliding)
            self.layers.append(
                DecoderLayer(
                    attn_norm=norm(names.attn_norm and p + names.attn_norm),
                    qkv=self._matrix(*qkv_parts),
                    qkv_bias=bias,
                    q_norm=norm(p + names.q_norm, norm_order[0]) if norm_order else None,
                    k_norm=norm(p + names.k_norm, norm_order[1]) if norm_order else None,
                    out=self._matrix(weights.pop(p + names.out)),
                    post_attn_norm=norm(names.post_attn_norm and p + names.post_attn_norm),
                    mlp_norm=norm(names.mlp_norm and p + names.mlp_norm),
                    post_mlp_norm=norm(names.post_mlp_norm and p + names.post_mlp_norm),
                    **self._mlp_weights(i, weights, names),
                    rope=rope_kinds.setdefault(kind, len(rope_kinds)),
                    sliding=sliding,
                )
            )
        self.embed = self._matrix(weights["model.embed_tokens.weight"])
        # [vocab, hidden], shared with the embedding when tied; Backend.logits reads it transposed.
        self.lm_head = self.embed if config.tie_word_embeddings else self._matrix(weights["lm_head.weight"])
        self.final_norm = norm("model.norm.weight")
        self._rope_tables: list[RopeTable] = [
            self._rope_table(rotated, sliding, weights) for rotated, sliding in rope_kinds
        ]
        self._sliding_layers = tuple(i for i, layer in enumerate(self.layers) if layer.sliding)
        multiplier = config.embedding_multiplier
        self._embed_scale = None if multiplier is None else np.float32(multiplier)
        self._row_decoder = self._one_call_row_decoder()

    def _one_call_row_decoder(self) -> RowDecoder | None:
        """The backend's one-call path for a decode row (Backend.row_decoder) when every layer is dense
        (this block's gated MLP, no experts); None otherwise, or where the backend has no such path for
        the layers' weights: a one-row batch then runs op by op like any other."""
        c = self.config
        if type(self)._mlp is not DecoderStack._mlp or any(
            layer.gate_up is None or layer.down is None or layer.experts is not None for layer in self.layers
        ):
            return None
        return self.backend.row_decoder(
            [
                RowLayer(
                    w.attn_norm,
                    w.qkv,
                    w.out,
                    w.mlp_norm,
                    w.gate_up,
                    w.down,
                    qkv_bias=w.qkv_bias,
                    q_norm=w.q_norm,
                    k_norm=w.k_norm,
                    post_attn_norm=w.post_attn_norm,
                    post_mlp_norm=w.post_mlp_norm,
                )
                for w in self.layers
            ],
            RowShape(
                heads=c.num_attention_heads,
                kv_heads=c.num_key_value_heads,
                head_dim=c.head_dim,
                intermediate=c.intermediate_size,
                eps=c.rms_norm_eps,
                gelu=c.activation != "silu",
                rope_of=tuple(layer.rope for layer in self.layers),
                sliding=tuple(layer.sliding for layer in self.layers),
                window=c.sliding_window,
                softcap=c.attn_logit_softcapping,
                residual_multiplier=c.residual_multiplier,
            ),
        )

    def _mlp_weights(self, index: int, weights: dict[str, Tensor], names: LayerNames) -> dict[str, Any]:
        """Layer `index`'s feed-forward weights as DecoderLayer fields (taken from `weights`): the
        gated layer's; a mixture-of-experts family returns `experts` instead."""
        p = f"model.layers.{index}."
        return {
            "gate_up": self._matrix(*(weights.pop(p + n) for n in names.gate_up)),
            "down": self._matrix(weights.pop(p + names.down)),
        }

    def _mlp(self, x: Array, layer: DecoderLayer) -> Array:
        """The feed-forward branch of normalised `x`: act(gate) * up, projected down."""
        act = self.backend.silu_mul if self.config.activation == "silu" else self.backend.gelu_mul
        gate_up = self.backend.linear(x, layer.gate_up)
        return self.backend.linear(act(gate_up, self.config.intermediate_size), layer.down)

    def _rope_table(self, rotated: bool, sliding: bool, weights: Mapping[str, Tensor]) -> RopeTable:
        """The rotations of layers with (`rotated`) or without RoPE; `sliding` for families whose
        sliding layers have their own base (none here; Gemma 3 overrides)."""
        c = self.config
        pairs = c.head_dim // 2
        if not rotated:
            return RopeTable(np.zeros(0), pairs, self._score_scale())
        factors = weights.get(ROPE_FREQS)
        inv = inverse_frequencies(c, None if factors is None else np.asarray(factors), c.rotary_dim)
        return RopeTable(inv, pairs, self._score_scale())

    def _score_scale(self) -> float:
        """What attention scores are multiplied by (folded into q's rotations): the family's
        attention_multiplier, else 1/sqrt(head_dim) in float32."""
        scale = self.config.attention_multiplier
        return float(np.float32(1.0 / np.sqrt(self.config.head_dim))) if scale is None else float(scale)

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection."""
        return int(self.lm_head.shape[0])

    def _qk_norm(self, x: Array, weight: Weight | None, rows: int, heads: int) -> Array:
        """q or k [rows, heads * head_dim] as [rows, heads, head_dim], RMS-normalised as the family
        asks: per head, over the whole projection, or not at all."""
        head_dim, eps = self.config.head_dim, self.config.rms_norm_eps
        if weight is None:
            return x.reshape(rows, heads, head_dim)
        if self.config.qk_norm == "full":
            return self.backend.rms_norm(x, weight, eps).reshape(rows, heads, head_dim)
        return self.backend.rms_norm(x.reshape(rows * heads, head_dim), weight, eps).reshape(
            rows, heads, head_dim
        )

    def _branch(self, out: Array, norm: Weight | None) -> Array:
        """A branch's output as it is added to the residual stream: its post-norm, its multiplier."""
        if norm is not None:
            out = self.backend.rms_norm(out, norm, self.config.rms_norm_eps)
        if self.config.residual_multiplier is not None:
            out = out * np.float32(self.config.residual_multiplier)
        return out

    def _forget_past_windows(self, batch: ForwardBatch, cache: KVCache) -> None:
        """Sliding layers keep only their window resident. Every later row of a sequence sits after
        this batch's first row of it (a step keeps at least one token, or the sequence ends), so it
        sees no position before start + 2 - window: those go back to the system, a stride at a
        time to keep the madvise calls few."""
        window = self.config.sliding_window
        if not self._sliding_layers or window is None:
            return
        for segment in batch.segments:
            cache.forget_before(self._sliding_layers, segment.slot, segment.start + 1 - window, FORGET_STRIDE)

    def forward_logits(self, batch: ForwardBatch, cache: KVCache) -> Array:
        """`forward`, with the logits left where the backend computed them (for device sampling)."""
        backend, c = self.backend, self.config
        rows = batch.token_ids.shape[0]
        # Host-side plan: each row's position and slot, and how attention splits the rows.
        starts = np.asarray([s.start for s in batch.segments], dtype=np.int64)
        lengths = np.asarray([s.length for s in batch.segments], dtype=np.int64)
        slots = np.asarray([s.slot for s in batch.segments], dtype=np.int64)
        full_plan = AttentionPlan.build(slots, starts, lengths)
        if c.attn_logit_softcapping is not None:
            full_plan = full_plan.with_softcap(c.attn_logit_softcapping)
        window_plan = full_plan.with_window(c.sliding_window) if self._sliding_layers else full_plan
        slots_per_row, positions = full_plan.row_slots, full_plan.row_visible - 1  # a row sees up to itself
        rotations = []
        for table in self._rope_tables:
            q_rot, k_rot = table.at(positions)
            rotations.append((backend.asarray(q_rot), backend.asarray(k_rot)))
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        eps = c.rms_norm_eps

        hidden = backend.embed(self.embed, batch.token_ids)
        if self._embed_scale is not None:
            hidden *= self._embed_scale
        if rows == 1 and self._row_decoder is not None:  # a decode row: every layer in one call
            hidden = self._row_decoder.run(
                hidden,
                cache,
                int(slots_per_row[0]),
                int(positions[0]),
                np.concatenate([q for q, _ in rotations]),
                np.concatenate([k for _, k in rotations]),
            )
        else:
            for index, layer in enumerate(self.layers):
                q_rot, k_rot = rotations[layer.rope]
                x = hidden if layer.attn_norm is None else backend.rms_norm(hidden, layer.attn_norm, eps)
                qkv = backend.linear(x, layer.qkv, layer.qkv_bias)
                q = backend.rope(self._qk_norm(qkv[:, :q_width], layer.q_norm, rows, heads), q_rot)
                k = backend.rope(
                    self._qk_norm(qkv[:, q_width : q_width + kv_width], layer.k_norm, rows, kv_heads), k_rot
                )
                v = qkv[:, q_width + kv_width :].reshape(rows, kv_heads, head_dim)
                backend.write_kv(cache, index, slots_per_row, positions, k, v)
                attn = backend.attention(q, cache, index, window_plan if layer.sliding else full_plan)
                hidden += self._branch(
                    backend.linear(attn.reshape(rows, q_width), layer.out), layer.post_attn_norm
                )
                x = hidden if layer.mlp_norm is None else backend.rms_norm(hidden, layer.mlp_norm, eps)
                hidden += self._branch(self._mlp(x, layer), layer.post_mlp_norm)

        self._forget_past_windows(batch, cache)
        last = backend.rms_norm(hidden[backend.asarray(batch.logit_rows)], self.final_norm, eps)
        logits = backend.logits(last, self.lm_head)
        if c.logits_scaling is not None:  # Granite divides, in float32
            logits = logits / np.float32(c.logits_scaling)
        if c.final_logit_softcapping is not None:  # in float32, as Hugging Face computes it
            logits = backend.softcap(logits, c.final_logit_softcapping)
        return logits
