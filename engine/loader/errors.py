"""The one error type the loaders raise (defined with the model interfaces, which raise it too)."""

from infer.engine.models.base import ModelLoadError

__all__ = ["ModelLoadError"]
