"""The llama family (Llama 2/3, SmolLM2, Mistral, Qwen2) written once against the Backend protocol."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from infer.engine.backends.base import Array, Backend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader.checkpoint import Checkpoint, ModelConfig
from infer.engine.runtime.kv_cache import KVCache


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
    # Output-major ([out, in], as Hugging Face stores them) for Backend.linear. The RMSNorm weights
    # that precede qkv and gate_up are folded into their columns: (x_hat * w) @ W.T == x_hat @ (W * w).T.
    qkv: Array  # [q + 2 kv, hidden]
    qkv_bias: Array | None
    out: Array  # [hidden, q]
    gate_up: Array  # [2 * intermediate, hidden]
    down: Array  # [hidden, intermediate]


class LlamaModel:
    """Decoder-only llama-family transformer over a ragged batch and a slot-based KV cache."""

    def __init__(self, checkpoint: Checkpoint, backend: Backend) -> None:
        self.config = config = checkpoint.config
        self.backend = backend
        weights = checkpoint.weights
        heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
        score_scale = np.float32(1.0 / np.sqrt(config.head_dim))

        def q_k_rows(name: str, count: int) -> np.ndarray:
            w = weights.pop(name)
            return half_to_interleaved(w, count) if config.rope_layout == "half" else w

        self.layers: list[_Layer] = []
        for i in range(config.num_hidden_layers):
            p = f"model.layers.{i}."
            # 1/sqrt(head_dim) is folded into q (RoPE is linear), so scores need no scaling pass.
            q = q_k_rows(p + "self_attn.q_proj.weight", heads) * score_scale
            k = q_k_rows(p + "self_attn.k_proj.weight", kv_heads)
            v = weights.pop(p + "self_attn.v_proj.weight")
            bias = None
            if config.attention_bias:
                qb = q_k_rows(p + "self_attn.q_proj.bias", heads) * score_scale
                kb = q_k_rows(p + "self_attn.k_proj.bias", kv_heads)
                bias = backend.upload(np.concatenate([qb, kb, weights.pop(p + "self_attn.v_proj.bias")]))
            gate = weights.pop(p + "mlp.gate_proj.weight")
            up = weights.pop(p + "mlp.up_proj.weight")
            attn_norm = weights.pop(p + "input_layernorm.weight")
            mlp_norm = weights.pop(p + "post_attention_layernorm.weight")
            self.layers.append(
                _Layer(
                    qkv=backend.upload(np.concatenate([q, k, v]) * attn_norm),
                    qkv_bias=bias,
                    out=backend.upload(weights.pop(p + "self_attn.o_proj.weight")),
                    gate_up=backend.upload(np.concatenate([gate, up]) * mlp_norm),
                    down=backend.upload(weights.pop(p + "mlp.down_proj.weight")),
                )
            )
        self.embed = backend.upload(weights["model.embed_tokens.weight"])
        # [vocab, hidden], shared with the embedding when tied; Backend.logits reads it transposed.
        self.lm_head = self.embed if config.tie_word_embeddings else backend.upload(weights["lm_head.weight"])
        self.final_norm = backend.upload(weights["model.norm.weight"])
        self._inv_freq = inverse_frequencies(config, checkpoint.rope_freq_factors)
        self._rotations = np.zeros((0, config.head_dim // 2), dtype=np.complex64)

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection."""
        return int(self.lm_head.shape[0])

    def make_cache(self, slots: int, capacity: int) -> KVCache:
        """A KV cache for `slots` sequences of up to `capacity` tokens."""
        c = self.config
        return KVCache.allocate(
            self.backend, c.num_hidden_layers, slots, c.num_key_value_heads, capacity, c.head_dim
        )

    def _rope_rotations(self, positions: np.ndarray) -> Array:
        """cos + i sin of every (position, frequency), complex64 [rows, head_dim / 2]."""
        needed = int(positions.max()) + 1
        if needed > self._rotations.shape[0]:
            size = max(needed, 2 * self._rotations.shape[0], 256)
            angles = np.outer(np.arange(size, dtype=np.float64), self._inv_freq)
            self._rotations = np.exp(1j * angles).astype(np.complex64)
        return self.backend.xp.asarray(self._rotations[positions])

    def forward(self, batch: ForwardBatch, cache: KVCache) -> np.ndarray:
        """Run every row of `batch`, write its keys/values into `cache`, return logits [logit_rows, vocab].

        The caller updates `cache.lengths` afterwards; reads here use each segment's `start`.
        """
        backend, c = self.backend, self.config
        xp = backend.xp
        rows = batch.token_ids.shape[0]
        positions = np.concatenate([np.arange(s.start, s.start + s.length) for s in batch.segments])
        slots_per_row = np.repeat([s.slot for s in batch.segments], [s.length for s in batch.segments])
        rotations = self._rope_rotations(positions)
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        q_width, kv_width = heads * head_dim, kv_heads * head_dim
        plan = _AttentionPlan.build(batch.segments)

        # The residual stream is kept column-major, the layout Backend.linear returns on the cpu
        # backend: the two residual adds per layer then run over contiguous memory.
        hidden = xp.asfortranarray(self.embed[xp.asarray(batch.token_ids)])
        for index, layer in enumerate(self.layers):
            qkv = backend.linear(backend.rms_norm(hidden, None, c.rms_norm_eps), layer.qkv)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            # q and k sit side by side in qkv: one rotation covers both.
            qk = backend.rope(
                qkv[:, : q_width + kv_width].reshape(rows, heads + kv_heads, head_dim), rotations
            )
            q, k = qk[:, :heads], qk[:, heads:]
            v = qkv[:, q_width + kv_width :].reshape(rows, kv_heads, head_dim)
            layer_keys, layer_values = cache.keys[index], cache.values[index]
            layer_keys[slots_per_row, :, positions, :] = k
            layer_values[slots_per_row, :, positions, :] = v
            attn = self._attention(q, layer_keys, layer_values, plan)
            hidden += backend.linear(attn.reshape(rows, q_width), layer.out)
            gate_up = backend.linear(backend.rms_norm(hidden, None, c.rms_norm_eps), layer.gate_up)
            hidden += backend.linear(backend.silu_mul(gate_up, c.intermediate_size), layer.down)

        last = backend.rms_norm(hidden[xp.asarray(batch.logit_rows)], self.final_norm, c.rms_norm_eps)
        return backend.to_host(backend.logits(last, self.lm_head))

    def _attention(self, q: Array, keys: Array, values: Array, plan: _AttentionPlan) -> Array:
        """Grouped-query attention of every row against its own sequence's cached keys/values."""
        xp = self.backend.xp
        c = self.config
        heads, kv_heads, head_dim = c.num_attention_heads, c.num_key_value_heads, c.head_dim
        group = heads // kv_heads
        rows = q.shape[0]
        if plan.aligned and plan.decode_rows.size == rows:
            return self._decode_attention(q, keys, values, plan).reshape(rows, heads, head_dim)
        out = xp.empty_like(q)
        if plan.decode_rows.size:
            dense_out = self._decode_attention(q, keys, values, plan)
            if plan.aligned:
                out[: plan.decode_rows.size] = dense_out.reshape(-1, heads, head_dim)
            else:
                picked = dense_out[plan.decode_slots - plan.slot_lo]
                out[plan.decode_rows] = picked.reshape(-1, heads, head_dim)
        for row, seg in plan.prefill:
            total = seg.start + seg.length
            seg_q = (
                q[row : row + seg.length].reshape(seg.length, kv_heads, group, head_dim).transpose(1, 2, 0, 3)
            )
            scores = seg_q @ keys[seg.slot, :, :total].transpose(0, 2, 1)[:, None]
            scores += _causal_mask(seg.start, seg.length)
            self.backend.softmax_(scores)
            seg_out = scores @ values[seg.slot, :, :total][:, None]
            out[row : row + seg.length] = seg_out.transpose(2, 0, 1, 3).reshape(seg.length, heads, head_dim)
        return out

    def _decode_attention(self, q: Array, keys: Array, values: Array, plan: _AttentionPlan) -> Array:
        """Single-token rows of many sequences: one batched matmul over the dense run of slots
        [lo, hi); returns [hi - lo, kv_heads, group, head_dim] (slot-major)."""
        xp = self.backend.xp
        c = self.config
        kv_heads, head_dim = c.num_key_value_heads, c.head_dim
        group = c.num_attention_heads // kv_heads
        lo, hi, width = plan.slot_lo, plan.slot_hi, plan.decode_width
        count = plan.decode_rows.size
        if plan.aligned:  # rows 0..n-1 hold slots lo..lo+n-1 in order: no gather, no scatter
            dense_q = q[:count].reshape(count, kv_heads, group, head_dim)
        else:
            dense_q = xp.zeros((hi - lo, kv_heads, group, head_dim), dtype=q.dtype)
            dense_q[plan.decode_slots - lo] = q[plan.decode_rows].reshape(-1, kv_heads, group, head_dim)
        scores = dense_q @ keys[lo:hi, :, :width].transpose(0, 1, 3, 2)
        if plan.decode_mask is not None:
            scores += plan.decode_mask
        # Normalising the [.., group, head_dim] output instead of the scores saves a pass over them.
        weights, sums = self.backend.exp_rows(scores)
        out = weights @ values[lo:hi, :, :width]
        out /= sums
        return out


def _causal_mask(start: int, length: int) -> np.ndarray:
    """Additive mask [length, start + length]: row t sees positions <= start + t."""
    cols = np.arange(start + length)
    rows = np.arange(start, start + length)[:, None]
    return np.where(cols <= rows, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)


@dataclass(frozen=True)
class _AttentionPlan:
    """How one batch's rows split into batched single-token rows and per-sequence prefill runs."""

    decode_rows: np.ndarray
    decode_slots: np.ndarray
    slot_lo: int
    slot_hi: int
    decode_width: int
    decode_mask: np.ndarray | None  # [slots, 1, 1, width] additive; None when every row sees all `width`
    prefill: tuple[tuple[int, Segment], ...]
    aligned: bool = False
    """Decode rows are the batch's first rows and hold consecutive slots in order."""

    @classmethod
    def build(cls, segments: tuple[Segment, ...]) -> _AttentionPlan:
        decode_rows, decode_slots, decode_lengths, prefill = [], [], [], []
        row = 0
        for seg in segments:
            if seg.length == 1:
                decode_rows.append(row)
                decode_slots.append(seg.slot)
                decode_lengths.append(seg.start + 1)
            else:
                prefill.append((row, seg))
            row += seg.length
        if not decode_rows:
            empty = np.zeros(0, dtype=np.int64)
            return cls(empty, empty, 0, 0, 0, np.zeros((0, 1, 1, 0), np.float32), tuple(prefill))
        slots = np.asarray(decode_slots, dtype=np.int64)
        lo, hi = int(slots.min()), int(slots.max()) + 1
        width = max(decode_lengths)
        # Slots in [lo, hi) that hold no decode row keep a fully open mask over zeros; their
        # output is discarded, so only valid positions of real rows matter.
        lengths = np.full(hi - lo, width, dtype=np.int64)
        lengths[slots - lo] = decode_lengths
        mask = None
        if (lengths < width).any():
            visible = np.arange(width)[None, :] < lengths[:, None]
            mask = np.where(visible, np.float32(0.0), np.float32(-np.inf)).astype(np.float32)
            mask = mask[:, None, None, :]
        rows = np.asarray(decode_rows, dtype=np.int64)
        count = rows.size
        aligned = bool(
            hi - lo == count and np.array_equal(rows, np.arange(count)) and np.array_equal(slots - lo, rows)
        )
        return cls(rows, slots, lo, hi, width, mask, tuple(prefill), aligned)
