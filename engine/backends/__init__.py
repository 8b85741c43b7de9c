"""Compute backends behind one protocol (see base.Backend), registered in one place: BACKEND_CLASSES.

Every other list of backend names (the probe's, the profile schema's) is derived from it.
"""

from __future__ import annotations

from typing import Protocol

from infer.engine.backends.base import Backend, Capabilities
from infer.engine.backends.cpu import CpuBackend
from infer.engine.backends.cuda import CudaBackend
from infer.engine.backends.errors import BackendError
from infer.engine.backends.metal import MetalBackend


class BackendClass(Protocol):
    """What the registry needs of a backend class: its name, probe, capabilities, and a constructor."""

    name: str
    capabilities: Capabilities
    implemented: bool
    """False while only the probe exists (the array library may work, the model ops do not yet)."""

    def __call__(self, dtype: str = "float32") -> Backend:
        """The backend computing in `dtype`; raises BackendError for a dtype it cannot compute in."""
        ...

    def probe(self) -> str | None:
        """None when the backend can run here, else why not (imports its library, runs a tiny op)."""
        ...


BACKEND_CLASSES: dict[str, BackendClass] = {
    cls.name: cls  # type: ignore[misc]
    for cls in (CpuBackend, CudaBackend, MetalBackend)
}
"""Every backend a profile may name, by name."""

BACKEND_NAMES: tuple[str, ...] = tuple(BACKEND_CLASSES)
"""Backend names as profiles spell them, in registry order."""

IMPLEMENTED: frozenset[str] = frozenset(name for name, cls in BACKEND_CLASSES.items() if cls.implemented)
"""Backends this build has a model implementation for (derived from the registry)."""


def create_backend(name: str, dtype: str = "float32", *, cpu_kernels: str = "blas") -> Backend:
    """The backend called `name` computing in `dtype`; callers probe first (probe.select_backend) and
    pass what it selected. `cpu_kernels` is the cpu backend's matmul mode (see cpu.KERNEL_MODES).
    Raises BackendError for an unknown or unimplemented backend or a dtype it does not support."""
    cls = BACKEND_CLASSES.get(name)
    if cls is None or not cls.implemented:
        raise BackendError(f"backend {name!r} has no implementation in this build; use cpu")
    if cls is CpuBackend:
        return CpuBackend(dtype, kernels=cpu_kernels)
    return cls(dtype)


__all__ = [
    "BACKEND_CLASSES",
    "BACKEND_NAMES",
    "IMPLEMENTED",
    "Backend",
    "BackendError",
    "Capabilities",
    "create_backend",
]
