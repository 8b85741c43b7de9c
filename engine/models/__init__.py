"""The model registry, keyed by architecture: a family module declares how its checkpoints map onto a
config and canonical tensor names, the shapes they must have, and the model class that runs them.

Loaders find the family here (`family_for_gguf`, `family_for_hf`) and hand it what they read; the
engine builds the model with `build_model`. A new family is one module plus one `register` call.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from infer.engine.models.base import Checkpoint, Model, ModelConfig, ModelFamily, ModelLoadError
from infer.engine.models.gemma2 import GEMMA2_FAMILY
from infer.engine.models.gemma3 import GEMMA3_FAMILY
from infer.engine.models.granite import GRANITE_FAMILY
from infer.engine.models.llama import LLAMA_FAMILY
from infer.engine.models.olmo2 import OLMO2_FAMILY
from infer.engine.models.phi3 import PHI3_FAMILY
from infer.engine.models.qwen3 import QWEN3_FAMILY
from infer.engine.models.qwen3moe import QWEN3MOE_FAMILY
from infer.engine.models.smollm3 import SMOLLM3_FAMILY

if TYPE_CHECKING:
    from infer.engine.backends.base import Backend


class FamilyRegistry:
    """Families by architecture name (and by Hugging Face class name)."""

    def __init__(self, families: Iterable[ModelFamily] = ()) -> None:
        self._by_architecture: dict[str, ModelFamily] = {}
        self._by_hf_class: dict[str, str] = {}
        for family in families:
            self.register(family)

    def register(self, family: ModelFamily) -> ModelFamily:
        """Add `family` under each of its architectures (replacing any family registered for them)."""
        for architecture in family.architectures:
            self._by_architecture[architecture] = family
        self._by_hf_class.update(family.hf_architectures)
        return family

    def unregister(self, family: ModelFamily) -> None:
        """Remove `family` (its architectures and Hugging Face class names)."""
        for architecture in family.architectures:
            if self._by_architecture.get(architecture) is family:
                del self._by_architecture[architecture]
        for hf_class in family.hf_architectures:
            self._by_hf_class.pop(hf_class, None)

    @property
    def architectures(self) -> tuple[str, ...]:
        """Every registered architecture name, sorted."""
        return tuple(sorted(self._by_architecture))

    def for_architecture(self, architecture: object, source: str, field: str) -> ModelFamily:
        """The family of `architecture`, or ModelLoadError naming `source`, `field` and what is registered."""
        family = self._by_architecture.get(architecture) if isinstance(architecture, str) else None
        if family is None:
            raise ModelLoadError(
                f"{source}: unsupported architecture {architecture!r} ({field}); "
                f"supported: {', '.join(self.architectures)}"
            )
        return family

    def for_hf_classes(self, class_names: Iterable[str], source: str) -> tuple[ModelFamily, str]:
        """(family, architecture) of the first registered name in config.json's `architectures`."""
        names = list(class_names)
        for name in names:
            architecture = self._by_hf_class.get(name)
            if architecture is not None and architecture in self._by_architecture:
                return self._by_architecture[architecture], architecture
        raise ModelLoadError(
            f"{source}: unsupported architectures {names} (supported: {', '.join(sorted(self._by_hf_class))})"
        )


REGISTRY = FamilyRegistry(
    [
        LLAMA_FAMILY,
        GEMMA2_FAMILY,
        GEMMA3_FAMILY,
        QWEN3_FAMILY,
        OLMO2_FAMILY,
        GRANITE_FAMILY,
        SMOLLM3_FAMILY,
        PHI3_FAMILY,
        QWEN3MOE_FAMILY,
    ]
)
"""The families this build knows; tests and plug-ins add theirs with `register`."""


def register(family: ModelFamily) -> ModelFamily:
    """Register a family in the default registry (returns it, so it can decorate an instance)."""
    return REGISTRY.register(family)


def unregister(family: ModelFamily) -> None:
    """Remove a family from the default registry."""
    REGISTRY.unregister(family)


def registered_architectures() -> tuple[str, ...]:
    """Every architecture name the default registry runs."""
    return REGISTRY.architectures


def family_for_gguf(meta: Mapping[str, object], source: str) -> ModelFamily:
    """The family of a GGUF file from its `general.architecture`."""
    return REGISTRY.for_architecture(meta.get("general.architecture"), source, "general.architecture")


def family_for_hf(raw: Mapping[str, object], source: str) -> tuple[ModelFamily, str]:
    """(family, architecture) of a Hugging Face folder from config.json's `architectures`."""
    names = raw.get("architectures") or []
    return REGISTRY.for_hf_classes(names if isinstance(names, list) else [names], source)


def build_model(checkpoint: Checkpoint, backend: Backend) -> Model:
    """The model of `checkpoint`'s architecture on `backend`, built by its family."""
    family = REGISTRY.for_architecture(checkpoint.config.architecture, checkpoint.source, "architecture")
    return family.build(checkpoint, backend)


__all__ = [
    "REGISTRY",
    "Checkpoint",
    "FamilyRegistry",
    "Model",
    "ModelConfig",
    "ModelFamily",
    "ModelLoadError",
    "build_model",
    "family_for_gguf",
    "family_for_hf",
    "register",
    "registered_architectures",
    "unregister",
]
