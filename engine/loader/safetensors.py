"""Hugging Face model folders: config.json, tokenizer files and one or several *.safetensors."""

from __future__ import annotations

import json
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from infer.engine.loader.checkpoint import Checkpoint, ModelConfig, check_weights
from infer.engine.loader.errors import ModelLoadError

_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
}


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ModelLoadError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: invalid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise ModelLoadError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _config_from_json(raw: dict[str, Any], path: Path) -> ModelConfig:
    names = raw.get("architectures") or []
    arch = next((_ARCHITECTURES[n] for n in names if n in _ARCHITECTURES), None)
    if arch is None:
        raise ModelLoadError(
            f"{path}: unsupported architectures {names} (supported: {', '.join(_ARCHITECTURES)})"
        )
    try:
        hidden = int(raw["hidden_size"])
        heads = int(raw["num_attention_heads"])
        return ModelConfig(
            architecture=arch,
            vocab_size=int(raw["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(raw.get("num_key_value_heads") or heads),
            head_dim=int(raw.get("head_dim") or hidden // heads),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope_theta=float(raw.get("rope_theta", 10000.0)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", arch == "qwen2")),
            rope_layout="half",
            rope_scaling=dict(raw.get("rope_scaling") or {}),
        )
    except KeyError as exc:
        raise ModelLoadError(f"{path}: missing field {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{path}: bad value ({exc})") from None


def _bf16_tensors(path: Path) -> dict[str, np.ndarray]:
    """BF16 tensors read straight from the file layout (numpy has no bfloat16 dtype)."""
    with path.open("rb") as handle:
        (header_len,) = struct.unpack("<Q", handle.read(8))
        header = json.loads(handle.read(header_len))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + header_len)
    out: dict[str, np.ndarray] = {}
    for name, info in header.items():
        if name == "__metadata__" or info["dtype"] != "BF16":
            continue
        start, end = info["data_offsets"]
        bits = data[start:end].view(np.uint16).astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(info["shape"])
    return out


def _read_shard(path: Path) -> dict[str, np.ndarray]:
    try:
        bf16 = _bf16_tensors(path)
        weights = dict(bf16)
        with safe_open(str(path), framework="np") as handle:
            for name in handle.keys():  # noqa: SIM118 -- safe_open handles are not iterable
                if name not in bf16:
                    weights[name] = np.asarray(handle.get_tensor(name), dtype=np.float32)
        return weights
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"{path}: cannot read safetensors ({type(exc).__name__}: {exc})") from None


def load_safetensors_dir(folder: Path) -> Checkpoint:
    """Read a Hugging Face model folder into a float32 Checkpoint."""
    from infer.engine.text.tokenizer import Tokenizer, TokenizerError

    if not folder.is_dir():
        raise ModelLoadError(f"{folder}: not a folder")
    config = _config_from_json(_read_json(folder / "config.json"), folder / "config.json")
    index = folder / "model.safetensors.index.json"
    if index.exists():
        shard_names = sorted(set(_read_json(index).get("weight_map", {}).values()))
        shards = [folder / name for name in shard_names]
    else:
        shards = sorted(folder.glob("*.safetensors"))
    if not shards:
        raise ModelLoadError(f"{folder}: no *.safetensors files")
    weights: dict[str, np.ndarray] = {}
    for shard in shards:
        if not shard.exists():
            raise ModelLoadError(f"{shard}: listed in the index but missing")
        weights.update(_read_shard(shard))
    if config.tie_word_embeddings:
        weights.pop("lm_head.weight", None)
    elif "lm_head.weight" not in weights:
        config = replace(config, tie_word_embeddings=True)
    check_weights(config, weights, str(folder))
    tokenizer_config_path = folder / "tokenizer_config.json"
    tokenizer_config = _read_json(tokenizer_config_path) if tokenizer_config_path.exists() else None
    try:
        tokenizer = Tokenizer.from_hf_files(folder / "tokenizer.json", tokenizer_config)
    except TokenizerError as exc:
        raise ModelLoadError(f"{folder}: {exc}") from None
    return Checkpoint(config, weights, tokenizer, str(folder))
