"""GGUF files through the `gguf` package: memory-mapped, dequantized once to float32."""

from __future__ import annotations

import os
import re
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, ReaderTensor
from gguf.quants import dequantize

from infer.engine.loader.checkpoint import Checkpoint, ModelConfig, check_weights
from infer.engine.loader.errors import ModelLoadError

SUPPORTED_ARCHITECTURES = ("llama", "mistral", "qwen2")

SUPPORTED_TYPES = frozenset(
    GGMLQuantizationType[name]
    for name in ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
)

# GGUF tensor names -> Hugging Face names (blk.N.* handled by the per-layer table).
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
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


class _PlainArrayReader(GGUFReader):
    """GGUFReader over a plain ndarray view of its memory map.

    The reader slices its buffer hundreds of thousands of times while parsing metadata (every
    token string); on a np.memmap each slice builds a memmap subclass, which makes opening a
    49k-token vocabulary take seconds. A plain view of the same mapping parses 3x faster and
    still reads the file lazily.
    """

    @property  # type: ignore[override]
    def data(self) -> np.ndarray:
        """The file's bytes (memory-mapped)."""
        return self._plain

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._plain = value.view(np.ndarray)


def open_reader(path: Path) -> GGUFReader:
    """Open a GGUF file, turning every failure into a ModelLoadError that names the file."""
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"{path}: not a GGUF file (magic {magic!r}, expected b'GGUF')")
    try:
        return _PlainArrayReader(path)
    except Exception as exc:  # the gguf package raises bare ValueError/IndexError on truncation
        raise ModelLoadError(f"{path}: corrupt or truncated GGUF ({type(exc).__name__}: {exc})") from None


def read_metadata(reader: GGUFReader) -> dict[str, Any]:
    """All key/value fields as plain Python values."""
    return {key: field.contents() for key, field in reader.fields.items()}


def _config_from_metadata(meta: dict[str, Any], path: Path, has_output: bool) -> ModelConfig:
    arch = meta.get("general.architecture")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ModelLoadError(
            f"{path}: unsupported architecture {arch!r} (general.architecture); "
            f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
        )

    def number(key: str, kind: type, default: Any = None, positive: bool = True) -> Any:
        full = f"{arch}.{key}"
        if full not in meta:
            if default is None:
                raise ModelLoadError(f"{path}: missing metadata field {full}")
            return default
        try:
            value = kind(meta[full])
        except (TypeError, ValueError):
            raise ModelLoadError(
                f"{path}: metadata field {full} must be a number, got {meta[full]!r}"
            ) from None
        if positive and value <= 0:
            raise ModelLoadError(f"{path}: metadata field {full} must be positive, got {value}")
        return value

    hidden = number("embedding_length", int)
    heads = number("attention.head_count", int)
    vocab = meta.get(f"{arch}.vocab_size") or len(meta.get("tokenizer.ggml.tokens", []))
    rope_scaling: dict[str, Any] = {}
    if meta.get(f"{arch}.rope.scaling.type") == "linear":
        rope_scaling = {"rope_type": "linear", "factor": number("rope.scaling.factor", float)}
    return ModelConfig(
        architecture=arch,
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
        tie_word_embeddings=not has_output,
        attention_bias=False,
        # llama.cpp's converter permutes llama-family q/k into pairwise (interleaved) RoPE; qwen2 keeps neox.
        rope_layout="half" if arch == "qwen2" else "interleaved",
        rope_scaling=rope_scaling,
    )


def load_gguf(path: Path) -> Checkpoint:
    """Read a GGUF file into a float32 Checkpoint (weights dequantized once, HF names)."""
    from infer.engine.text.tokenizer import Tokenizer, TokenizerError

    reader = open_reader(path)
    meta = read_metadata(reader)
    weights: dict[str, np.ndarray] = {}
    freq_factors: np.ndarray | None = None
    for tensor in reader.tensors:
        if tensor.tensor_type not in SUPPORTED_TYPES:
            raise ModelLoadError(
                f"{path}: tensor {tensor.name} has unsupported quant type {tensor.tensor_type.name}"
            )

    def read(tensor: ReaderTensor) -> np.ndarray:
        try:
            return np.asarray(dequantize(tensor.data, tensor.tensor_type), dtype=np.float32)
        except Exception as exc:
            raise ModelLoadError(f"{path}: cannot read tensor {tensor.name}: {exc}") from None

    # numpy releases the GIL inside the vectorised dequantisation, so threads use every core.
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        arrays = list(pool.map(read, reader.tensors))
    for tensor, array in zip(reader.tensors, arrays, strict=True):
        if tensor.name == "rope_freqs.weight":
            freq_factors = array
            continue
        name = _GLOBAL_NAMES.get(tensor.name)
        if name is None and (match := _LAYER_RE.match(tensor.name)):
            suffix = _LAYER_NAMES.get(match.group(2))
            name = f"model.layers.{match.group(1)}.{suffix}" if suffix else None
        if name is not None:
            weights[name] = array
    config = _config_from_metadata(meta, path, has_output="lm_head.weight" in weights)
    if "model.layers.0.self_attn.q_proj.bias" in weights:
        config = replace(config, attention_bias=True)
    check_weights(config, weights, str(path))
    if freq_factors is not None and freq_factors.shape != (config.head_dim // 2,):
        raise ModelLoadError(
            f"{path}: tensor rope_freqs.weight has shape {freq_factors.shape}, "
            f"expected ({config.head_dim // 2},)"
        )
    try:
        tokenizer = Tokenizer.from_gguf_metadata(meta)
    except TokenizerError as exc:
        raise ModelLoadError(f"{path}: {exc}") from None
    return Checkpoint(config, weights, tokenizer, str(path), freq_factors)
