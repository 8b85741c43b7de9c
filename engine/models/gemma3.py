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
import re
from collections.abc import Mapping
from dataclasses import dataclass, replace
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
    check_shapes,
    config_fields,
    gguf_number,
    gguf_rope_scaling,
    hf_rope,
)
from infer.engine.models.llama import half_to_interleaved, inverse_frequencies

SLIDING = "sliding_attention"
FORGET_STRIDE = 256
"""Positions a sliding layer's cache gives back at a time, once they fell out of every window."""
FULL = "full_attention"

_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
}
_LAYER_NAMES = {
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
_LAYER_RE = re.compile(r"^blk\.(\d+)\.(.+)$")

DEFAULT_SLIDING_PATTERN = 6
"""Every 6th layer is global (Gemma 3's `sliding_window_pattern`; llama.cpp hard-codes it for GGUF)."""
DEFAULT_LOCAL_ROPE_BASE = 10000.0
"""RoPE base of the sliding layers (`rope_local_base_freq`; llama.cpp's gemma3 default)."""


@dataclass(frozen=True)
class Gemma3Config(ModelConfig):
    """ModelConfig plus Gemma 3's fields (Hugging Face names); `rope_theta` and `rope_scaling` are the
    global layers'."""

    layer_types: tuple[str, ...] = ()
    """Per layer: sliding_attention or full_attention."""
    sliding_window: int = 512
    """Positions a sliding layer's row sees, its own included."""
    rope_local_base_freq: float = DEFAULT_LOCAL_ROPE_BASE
    """RoPE base of the sliding layers (no scaling there)."""
    query_pre_attn_scalar: float = 256.0
    """Attention scores are scaled by query_pre_attn_scalar ** -0.5."""
    final_logit_softcapping: float | None = None
    """logits = cap * tanh(logits / cap) when set."""
    attn_logit_softcapping: float | None = None
    """Attention-score soft-capping (Gemma 2); refused at load, no backend implements it."""
    norm_weights_hold_one: bool = False
    """The checkpoint's norm weights are stored as 1 + w (llama.cpp's converter adds the 1; Hugging Face
    stores w). The model takes the 1 off first (float32, as transformers' GGUF loader does) and adds it
    back, so both sources reach the same numbers."""


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


class Gemma3Family:
    """The Gemma 3 family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("gemma3",)
    hf_architectures: Mapping[str, str] = {"Gemma3ForCausalLM": "gemma3"}

    def gguf_tensor_name(self, name: str) -> str | None:
        """Hugging Face name of a GGUF tensor (None for tensors the model does not use)."""
        canonical = _GLOBAL_NAMES.get(name)
        if canonical is None and (match := _LAYER_RE.match(name)):
            suffix = _LAYER_NAMES.get(match.group(2))
            canonical = f"model.layers.{match.group(1)}.{suffix}" if suffix else None
        return canonical

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
                rope_scaling=rope_scaling,
                layer_types=layer_types,
                sliding_window=int(raw.get("sliding_window", 512)),
                rope_local_base_freq=local_base,
                query_pre_attn_scalar=float(raw.get("query_pre_attn_scalar", head_dim)),
                **caps,
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
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            shapes |= {
                p + "input_layernorm.weight": (hidden,),
                p + "self_attn.q_proj.weight": (q_out, hidden),
                p + "self_attn.k_proj.weight": (kv_out, hidden),
                p + "self_attn.v_proj.weight": (kv_out, hidden),
                p + "self_attn.q_norm.weight": (head,),
                p + "self_attn.k_norm.weight": (head,),
                p + "self_attn.o_proj.weight": (hidden, q_out),
                p + "post_attention_layernorm.weight": (hidden,),
                p + "pre_feedforward_layernorm.weight": (hidden,),
                p + "mlp.gate_proj.weight": (inter, hidden),
                p + "mlp.up_proj.weight": (inter, hidden),
                p + "mlp.down_proj.weight": (hidden, inter),
                p + "post_feedforward_layernorm.weight": (hidden,),
            }
        return shapes

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        """Shapes against the config; a stored lm_head (always tied in Gemma 3) is dropped; settings no
        backend implements are refused here rather than ignored."""
        weights.pop("lm_head.weight", None)
        check_shapes(self.expected_shapes(config), weights, source)
        if not isinstance(config, Gemma3Config):
            raise ModelLoadError(f"{source}: the gemma3 family needs a Gemma3Config")
        if config.attn_logit_softcapping is not None:
            raise ModelLoadError(
                f"{source}: attention logit soft-capping ({config.attn_logit_softcapping}) is not supported"
            )
        unknown = sorted(set(config.layer_types) - {SLIDING, FULL})
        if unknown or len(config.layer_types) != config.num_hidden_layers:
            raise ModelLoadError(
                f"{source}: layer_types must name {config.num_hidden_layers} layers as "
                f"{SLIDING} or {FULL}, got {list(config.layer_types)}"
            )

    def build(self, checkpoint: Checkpoint, backend: Backend) -> Gemma3Model:
        """A Gemma3Model on `backend`."""
        return Gemma3Model(checkpoint, backend)


GEMMA3_FAMILY = Gemma3Family()
"""The instance the registry holds."""


class _Rotations:
    """cos + i sin tables of one RoPE base, grown on demand: q's carry the score scale (RoPE is
    linear, so scores need no scaling pass)."""

    def __init__(self, inv_freq: np.ndarray, score_scale: float) -> None:
        self._inv_freq = inv_freq
        self._score_scale = score_scale
        self._k = np.zeros((0, inv_freq.size), dtype=np.complex64)
        self._q = self._k

    def at(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(q's, k's) rotations of `positions`, complex64 [rows, head_dim / 2] on the host."""
        needed = int(positions.max()) + 1
        if needed > self._k.shape[0]:
            size = max(needed, 2 * self._k.shape[0], 256)
            rotations = np.exp(1j * np.outer(np.arange(size, dtype=np.float64), self._inv_freq))
            self._k = rotations.astype(np.complex64)
            self._q = (rotations * self._score_scale).astype(np.complex64)
        return self._q[positions], self._k[positions]


@dataclass
class _Layer:
    # Output-major ([out, in]) for Backend.linear; norm weights already hold 1 + w. q/k rows (and the
    # q/k norm weights) are permuted from half-split to interleaved RoPE pairs, as for the llama family.
    sliding: bool
    attn_norm: Weight  # [hidden]
    qkv: Weight  # [q + 2 kv, hidden]
    q_norm: Weight  # [head_dim]
    k_norm: Weight  # [head_dim]
    out: Weight  # [hidden, q]
    post_attn_norm: Weight  # [hidden]
    mlp_norm: Weight  # [hidden]
    gate_up: Weight  # [2 * intermediate, hidden]
    down: Weight  # [hidden, intermediate]
    post_mlp_norm: Weight  # [hidden]


class Gemma3Model(DecoderModel):
    """Gemma 3 text decoder over a ragged batch and a slot-based KV cache.

    Sliding layers attend through a window view of the cache (`AttentionPlan.with_window`): they read
    only the last `sliding_window` positions. The cache keeps one layout for every layer, but a
    sliding layer's positions that fell out of every future window are given back to the system
    (`KVCache.forget_before`), so its resident memory follows the window, as a ring's would.
    """

    def __init__(self, checkpoint: Checkpoint, backend: Backend) -> None:
        config = checkpoint.config
        if not isinstance(config, Gemma3Config):
            raise ModelLoadError(f"{checkpoint.source}: the gemma3 family needs a Gemma3Config")
        self.config: Gemma3Config = config
        self.backend = backend
        self.float_copies: set[str] = set()
        """GGUF types of matrices held as float32 copies because the backend has no kernels for them."""
        weights = checkpoint.weights
        heads, kv_heads, head_dim = config.num_attention_heads, config.num_key_value_heads, config.head_dim
        one = np.float32(1.0)
        pairs = half_to_interleaved(np.arange(head_dim), 1)  # RoPE pairs adjacent, per head

        def norm(name: str, order: np.ndarray | None = None) -> Weight:
            w = np.asarray(weights.pop(name), dtype=np.float32)
            if config.norm_weights_hold_one:
                w = w - one
            # Hugging Face computes (1 + w) in float32 on every call; the sum is the same bits once.
            w = one + w
            return backend.weight(w if order is None else w[order])

        def q_k_rows(name: str, count: int) -> Tensor:
            w = weights.pop(name)
            if isinstance(w, QuantizedTensor):  # whole rows of blocks move, as the floats would
                return w.with_rows(half_to_interleaved(np.arange(w.shape[0]), count))
            return half_to_interleaved(w, count)

        self.layers: list[_Layer] = []
        for i, kind in enumerate(config.layer_types):
            p = f"model.layers.{i}."
            q = q_k_rows(p + "self_attn.q_proj.weight", heads)
            k = q_k_rows(p + "self_attn.k_proj.weight", kv_heads)
            v = weights.pop(p + "self_attn.v_proj.weight")
            gate = weights.pop(p + "mlp.gate_proj.weight")
            up = weights.pop(p + "mlp.up_proj.weight")
            self.layers.append(
                _Layer(
                    sliding=kind == SLIDING,
                    attn_norm=norm(p + "input_layernorm.weight"),
                    qkv=self._matrix(q, k, v),
                    q_norm=norm(p + "self_attn.q_norm.weight", pairs),
                    k_norm=norm(p + "self_attn.k_norm.weight", pairs),
                    out=self._matrix(weights.pop(p + "self_attn.o_proj.weight")),
                    post_attn_norm=norm(p + "post_attention_layernorm.weight"),
                    mlp_norm=norm(p + "pre_feedforward_layernorm.weight"),
                    gate_up=self._matrix(gate, up),
                    down=self._matrix(weights.pop(p + "mlp.down_proj.weight")),
                    post_mlp_norm=norm(p + "post_feedforward_layernorm.weight"),
                )
            )
        self.embed = self._matrix(weights["model.embed_tokens.weight"])
        self.final_norm = norm("model.norm.weight")
        # Hugging Face scales the embedding rows by sqrt(hidden) cast to the weights' dtype.
        self._embed_scale = np.float32(math.sqrt(config.hidden_size))
        score_scale = float(np.float32(config.query_pre_attn_scalar**-0.5))
        self._global = _Rotations(inverse_frequencies(config, None), score_scale)
        local = replace(config, rope_theta=config.rope_local_base_freq, rope_scaling={})
        self._local = _Rotations(inverse_frequencies(local, None), score_scale)
        self._sliding_layers = tuple(i for i, layer in enumerate(self.layers) if layer.sliding)

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection (the tied embedding table)."""
        return int(self.embed.shape[0])

    def _forget_past_windows(self, batch: ForwardBatch, cache: KVCache) -> None:
        """Sliding layers keep only their window resident. Every later row of a sequence sits after
        this batch's first row of it (a step keeps at least one token, or the sequence ends), so it
        sees no position before start + 2 - window: those go back to the system, a stride at a
        time to keep the madvise calls few. The cache layout and the window view stay as they
        are, so every row reads exactly what it read before."""
        window = self.config.sliding_window
        for segment in batch.segments:
            cache.forget_before(self._sliding_layers, segment.slot, segment.start + 1 - window, FORGET_STRIDE)

    def _head_norm(self, x: Array, weight: Weight, rows: int, heads: int) -> Array:
        """RMSNorm of every head of x [rows, heads * head_dim] (QK-norm): [rows, heads, head_dim]."""
        head_dim = self.config.head_dim
        normed = self.backend.rms_norm(x.reshape(rows * heads, head_dim), weight, self.config.rms_norm_eps)
        return normed.reshape(rows, heads, head_dim)

    def forward_logits(self, batch: ForwardBatch, cache: KVCache) -> Array:
        """`forward`, with the logits left where the backend computed them (for device sampling)."""
        backend, c = self.backend, self.config
        rows = batch.token_ids.shape[0]
        starts = np.asarray([s.start for s in batch.segments], dtype=np.int64)
        lengths = np.asarray([s.length for s in batch.segments], dtype=np.int64)
        slots = np.asarray([s.slot for s in batch.segments], dtype=np.int64)
        full_plan = AttentionPlan.build(slots, starts, lengths)
        window_plan = full_plan.with_window(c.sliding_window)
        slots_per_row, positions = full_plan.row_slots, full_plan.row_visible - 1
        rotations = {}
        for sliding, table in ((True, self._local), (False, self._global)):
            q_rot, k_rot = table.at(positions)
            rotations[sliding] = (backend.asarray(q_rot), backend.asarray(k_rot))
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        eps = c.rms_norm_eps

        hidden = backend.embed(self.embed, batch.token_ids)
        hidden *= self._embed_scale
        for index, layer in enumerate(self.layers):
            q_rot, k_rot = rotations[layer.sliding]
            qkv = backend.linear(backend.rms_norm(hidden, layer.attn_norm, eps), layer.qkv)
            q = backend.rope(self._head_norm(qkv[:, :q_width], layer.q_norm, rows, heads), q_rot)
            k = backend.rope(
                self._head_norm(qkv[:, q_width : q_width + kv_width], layer.k_norm, rows, kv_heads), k_rot
            )
            v = qkv[:, q_width + kv_width :].reshape(rows, kv_heads, head_dim)
            backend.write_kv(cache, index, slots_per_row, positions, k, v)
            attn = backend.attention(q, cache, index, window_plan if layer.sliding else full_plan)
            attn_out = backend.linear(attn.reshape(rows, q_width), layer.out)
            hidden += backend.rms_norm(attn_out, layer.post_attn_norm, eps)
            gate_up = backend.linear(backend.rms_norm(hidden, layer.mlp_norm, eps), layer.gate_up)
            mlp_out = backend.linear(backend.gelu_mul(gate_up, c.intermediate_size), layer.down)
            hidden += backend.rms_norm(mlp_out, layer.post_mlp_norm, eps)

        self._forget_past_windows(batch, cache)
        last = backend.rms_norm(hidden[backend.asarray(batch.logit_rows)], self.final_norm, eps)
        logits = backend.logits(last, self.embed)
        cap = c.final_logit_softcapping
        if cap is not None:  # in float32, as Hugging Face computes it
            logits = backend.softcap(logits, cap)
        return logits
