"""A tiny random Gemma 3 model written as GGUF the way llama.cpp's converter writes one, and a float64
numpy forward of the Hugging Face Gemma 3 text decoder to check the engine against.

The GGUF: architecture `gemma3`, norm weights stored as 1 + w (the converter's shift), q/k in Hugging
Face's half-split RoPE layout (no permutation), 2-D weights as `quant`, the synthetic byte-level
vocabulary of tests/synthetic.py. `sliding_window` and `pattern` are small so a short prompt already
runs past the window.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from synthetic import BOS_ID, ENDOFTEXT_ID, EOS_ID, tiny_vocabulary

__all__ = ["TinyGemma3", "reference_logits", "write_tiny_gemma3"]


class TinyGemma3(NamedTuple):
    """The GGUF and what the reference forward needs."""

    gguf_path: Path
    weights: dict[str, np.ndarray]
    """Hugging Face names and values (norms as w, not 1 + w), the GGUF's weights dequantized."""
    layer_types: tuple[str, ...]
    window: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    theta_global: float
    theta_local: float
    softcap: float | None


_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
}


def write_tiny_gemma3(
    folder: Path,
    *,
    quant: str = "Q8_0",
    layers: int = 3,
    pattern: int = 3,
    window: int = 5,
    hidden: int = 64,
    heads: int = 4,
    kv_heads: int = 2,
    head_dim: int = 32,
    intermediate: int = 128,
    softcap: float | None = None,
    seed: int = 0,
) -> TinyGemma3:
    """Write `folder/gemma3.gguf`: every `pattern`-th layer global, the others sliding over `window`."""
    rng = np.random.default_rng(seed)
    tokens, token_types, merges = tiny_vocabulary()
    vocab = len(tokens)
    eps, theta_global, theta_local = 1e-6, 1_000_000.0, 10_000.0

    def matrix(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (scale * rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(width: int) -> np.ndarray:  # Hugging Face's w (applied as 1 + w)
        return (0.1 * rng.standard_normal(width)).astype(np.float32)

    hf: dict[str, np.ndarray] = {"model.embed_tokens.weight": matrix(vocab, hidden, 0.3)}
    for i in range(layers):
        p = f"model.layers.{i}."
        hf |= {
            p + "input_layernorm.weight": norm(hidden),
            p + "self_attn.q_proj.weight": matrix(heads * head_dim, hidden, 2.0),
            p + "self_attn.k_proj.weight": matrix(kv_heads * head_dim, hidden, 2.0),
            p + "self_attn.v_proj.weight": matrix(kv_heads * head_dim, hidden),
            p + "self_attn.q_norm.weight": norm(head_dim),
            p + "self_attn.k_norm.weight": norm(head_dim),
            p + "self_attn.o_proj.weight": matrix(hidden, heads * head_dim),
            p + "post_attention_layernorm.weight": norm(hidden),
            p + "pre_feedforward_layernorm.weight": norm(hidden),
            p + "mlp.gate_proj.weight": matrix(intermediate, hidden),
            p + "mlp.up_proj.weight": matrix(intermediate, hidden),
            p + "mlp.down_proj.weight": matrix(hidden, intermediate),
            p + "post_feedforward_layernorm.weight": norm(hidden),
        }
    hf["model.norm.weight"] = norm(hidden)

    path = Path(folder) / "gemma3.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_name("tiny-gemma3")
    writer.add_context_length(256)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_key_length(head_dim)
    writer.add_value_length(head_dim)
    writer.add_rope_freq_base(theta_global)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_sliding_window(window)
    writer.add_uint32("gemma3.attention.sliding_window_pattern", pattern)
    if softcap is not None:
        writer.add_float32("gemma3.final_logit_softcapping", softcap)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(ENDOFTEXT_ID)
    writer.add_add_bos_token(True)
    final: dict[str, np.ndarray] = {}
    for name, weight in hf.items():
        if name == "model.embed_tokens.weight":
            gname = "token_embd.weight"
        elif name == "model.norm.weight":
            gname = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            gname = f"blk.{layer}.{_NAMES[rest]}"
        if weight.ndim == 1:  # llama.cpp's converter stores Gemma norms as 1 + w
            stored = weight + np.float32(1.0)
            writer.add_tensor(gname, stored)
            final[name] = stored - np.float32(1.0)
            continue
        kind = GGMLQuantizationType[quant]
        data = quantize(np.ascontiguousarray(weight), kind)
        writer.add_tensor(gname, data, raw_dtype=kind)
        final[name] = np.asarray(dequantize(data, kind), dtype=np.float32).reshape(weight.shape)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    layer_types = tuple("sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(layers))
    return TinyGemma3(
        path, final, layer_types, window, hidden, heads, kv_heads, head_dim, eps, theta_global,
        theta_local, softcap,
    )  # fmt: skip


def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * (1.0 + w)


def _rope(x: np.ndarray, theta: float) -> np.ndarray:
    """Hugging Face rotate_half RoPE over x [T, heads, d] at positions 0..T-1."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (np.arange(0, d, 2) / d)
    angles = np.outer(np.arange(x.shape[0]), inv)
    cos = np.cos(np.concatenate([angles, angles], -1))[:, None]
    sin = np.sin(np.concatenate([angles, angles], -1))[:, None]
    rotated = np.concatenate([-x[..., d // 2 :], x[..., : d // 2]], -1)
    return x * cos + rotated * sin


def reference_logits(
    model: TinyGemma3, ids: list[int], *, window: bool = True, attn_softcap: float | None = None
) -> np.ndarray:
    """Logits [len(ids), vocab] of Hugging Face's Gemma 3 text decoder in float64 (window off: every
    layer sees the whole prefix; `attn_softcap`: attention scores soft-capped, as Gemma 2 does)."""
    w = {k: v.astype(np.float64) for k, v in model.weights.items()}
    n, heads, kv, d, eps = len(ids), model.heads, model.kv_heads, model.head_dim, model.eps
    x = w["model.embed_tokens.weight"][ids] * np.float64(np.float32(np.sqrt(model.hidden)))
    rows, cols = np.arange(n)[:, None], np.arange(n)[None, :]
    for i, kind in enumerate(model.layer_types):
        p = f"model.layers.{i}."
        sliding = kind == "sliding_attention"
        h = _rms(x, w[p + "input_layernorm.weight"], eps)
        q = _rms(
            (h @ w[p + "self_attn.q_proj.weight"].T).reshape(n, heads, d),
            w[p + "self_attn.q_norm.weight"],
            eps,
        )
        k = _rms(
            (h @ w[p + "self_attn.k_proj.weight"].T).reshape(n, kv, d), w[p + "self_attn.k_norm.weight"], eps
        )
        v = (h @ w[p + "self_attn.v_proj.weight"].T).reshape(n, kv, d)
        theta = model.theta_local if sliding else model.theta_global
        q, k = _rope(q, theta), _rope(k, theta)
        seen = cols <= rows
        if sliding and window:
            seen &= cols > rows - model.window
        out = np.empty((n, heads, d))
        for head in range(heads):
            g = head // (heads // kv)
            scores = q[:, head] @ k[:, g].T / np.sqrt(d)
            if attn_softcap is not None:
                scores = np.tanh(scores / attn_softcap) * attn_softcap
            scores = np.where(seen, scores, -np.inf)
            probs = np.exp(scores - scores.max(-1, keepdims=True))
            probs /= probs.sum(-1, keepdims=True)
            out[:, head] = probs @ v[:, g]
        attn = out.reshape(n, heads * d) @ w[p + "self_attn.o_proj.weight"].T
        x = x + _rms(attn, w[p + "post_attention_layernorm.weight"], eps)
        h = _rms(x, w[p + "pre_feedforward_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate**3)))
        x = x + _rms(
            (gelu * up) @ w[p + "mlp.down_proj.weight"].T, w[p + "post_feedforward_layernorm.weight"], eps
        )
    logits = _rms(x, w["model.norm.weight"], eps) @ w["model.embed_tokens.weight"].T
    if model.softcap is not None:
        logits = np.tanh(logits / model.softcap) * model.softcap
    return logits
