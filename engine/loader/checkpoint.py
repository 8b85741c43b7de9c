"""The in-memory checkpoint both loaders produce: config, float32 weights, tokenizer.

Defined with the model interfaces (infer.engine.models.base), which the families fill in; what a
family's weights look like lives in its own module."""

from infer.engine.models.base import Checkpoint, ModelConfig, RopeLayout

__all__ = ["Checkpoint", "ModelConfig", "RopeLayout"]
