"""Hugging Face model folders: config.json, tokenizer files and one or several *.safetensors.

The loader reads files only; the family registered for config.json's `architectures`
(infer.engine.models) builds the config and checks the tensors."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

import numpy as np
from safetensors import safe_open

from infer.engine.models import family_for_hf
from infer.engine.models.base import Checkpoint, ModelLoadError


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
    config_path = folder / "config.json"
    raw_config = _read_json(config_path)
    family, architecture = family_for_hf(raw_config, str(config_path))
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
    config = family.config_from_hf(raw_config, architecture, weights, str(config_path))
    family.check_weights(config, weights, str(folder))
    tokenizer_config_path = folder / "tokenizer_config.json"
    tokenizer_config = _read_json(tokenizer_config_path) if tokenizer_config_path.exists() else None
    try:
        tokenizer = Tokenizer.from_hf_files(folder / "tokenizer.json", tokenizer_config)
    except TokenizerError as exc:
        raise ModelLoadError(f"{folder}: {exc}") from None
    return Checkpoint(config, weights, tokenizer, str(folder))
