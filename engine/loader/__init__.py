"""Model loaders: GGUF files and Hugging Face safetensors folders, both to one Checkpoint."""

from __future__ import annotations

from pathlib import Path

from infer.engine.models.base import Checkpoint, ModelConfig, ModelLoadError

__all__ = ["Checkpoint", "ModelConfig", "ModelLoadError", "load_checkpoint"]


def load_checkpoint(path: Path | str) -> Checkpoint:
    """Load a GGUF file or a safetensors model folder."""
    from infer.engine.loader.gguf import load_gguf
    from infer.engine.loader.safetensors import load_safetensors_dir

    path = Path(path).expanduser()
    if path.is_dir():
        return load_safetensors_dir(path)
    if not path.exists():
        raise ModelLoadError(f"{path}: no such file or folder")
    return load_gguf(path)
