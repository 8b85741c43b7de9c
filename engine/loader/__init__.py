"""Model loaders: GGUF files and Hugging Face safetensors folders, both to one Checkpoint."""

from __future__ import annotations

from pathlib import Path

from infer.engine.models.base import Checkpoint, ModelConfig, ModelLoadError

__all__ = ["Checkpoint", "ModelConfig", "ModelLoadError", "load_checkpoint", "model_architecture"]


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


def model_architecture(path: Path | str) -> tuple[str, bool]:
    """(architecture, supported) of a GGUF file (`general.architecture`) or a safetensors folder
    (config.json's `architectures`), read from the metadata alone; ModelLoadError when neither can
    be read. `supported`: a registered family runs it."""
    import json

    from infer.engine.models import REGISTRY

    path = Path(path).expanduser()
    if path.is_dir():
        try:
            names = json.loads((path / "config.json").read_text()).get("architectures") or []
        except (OSError, ValueError, AttributeError) as exc:
            raise ModelLoadError(f"{path}: cannot read config.json ({exc})") from None
        names = names if isinstance(names, list) else [names]
        try:
            return REGISTRY.for_hf_classes(names, str(path))[1], True
        except ModelLoadError:
            return ", ".join(str(n) for n in names) or "unknown", False
    from infer.engine.loader.gguf import open_reader

    field = open_reader(path).fields.get("general.architecture")
    architecture = str(field.contents()) if field is not None else "unknown"
    return architecture, architecture in REGISTRY.architectures
