"""Compute backends behind one protocol (see base.Backend), registered in one place: BACKEND_CLASSES.

Every other list of backend names (the probe's, the profile schema's) is derived from it.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Protocol

from infer.engine.backends.base import Backend, BackendOptions, Capabilities, CompileReport
from infer.engine.backends.cpu import CpuBackend
from infer.engine.backends.cuda import CudaBackend
from infer.engine.backends.errors import BackendError
from infer.engine.backends.kv_cache import KV_CACHE_DTYPES
from infer.engine.backends.metal import MetalBackend


class BackendClass(Protocol):
    """What the registry needs of a backend class: its name, probe, capabilities, a constructor, and
    the hooks that set up the process before it loads (see base.HostSetup for what each one does
    when a backend needs nothing)."""

    name: str
    capabilities: Capabilities
    implemented: bool
    """False while only the probe exists (the array library may work, the model ops do not yet)."""

    def from_options(self, options: BackendOptions) -> Backend:
        """The backend `options` ask for; raises BackendError for a dtype it cannot compute in."""
        ...

    def probe(self) -> str | None:
        """None when the backend can run here, else why not (imports its library, runs a tiny op)."""
        ...

    def prepare_process(self, options: BackendOptions, cache_home: Path) -> None:
        """Process-wide settings of the backend's libraries, before anything loads."""
        ...

    def watch_compiles(
        self, options: BackendOptions, on_first: Callable[[], None]
    ) -> AbstractContextManager[CompileReport]:
        """A block whose kernel compilations are counted and timed."""
        ...

    def threads_note(self, options: BackendOptions) -> str | None:
        """One line on the host threads its matmuls would run on, or None."""
        ...

    def threads_warning(self, options: BackendOptions) -> str | None:
        """One line when a fixed host thread count exceeds the free cores, or None."""
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


def backend_class(name: str) -> BackendClass:
    """The registered class called `name`; BackendError for an unknown or unimplemented one."""
    cls = BACKEND_CLASSES.get(name)
    if cls is None or not cls.implemented:
        raise BackendError(f"backend {name!r} has no implementation in this build; use cpu")
    return cls


def create_backend(
    name: str, dtype: str = "float32", *, kernels: str = "blas", threads: int | None = None, mmap: bool = True
) -> Backend:
    """The backend called `name` computing in `dtype`; callers probe first (probe.select_backend) and
    pass what it selected. `kernels` is the matmul mode of a backend that has several
    (capabilities.kernel_modes), `threads` its host threads, `mmap` where the cpu backend keeps the
    weights (see BackendOptions).
    Raises BackendError for an unknown or unimplemented backend or a dtype it does not support."""
    options = BackendOptions(name, dtype, kernels, threads, mmap)
    return backend_class(name).from_options(options)


def prepare_process(options: BackendOptions, cache_home: Path) -> None:
    """Set up this process for the backend `options` name, before its model loads: the cpu backend's
    numba cache folder (under `cache_home`, infer's cache folder), OpenMP wait policy and BLAS
    threads; BLAS threads for the others when a count is fixed."""
    backend_class(options.name).prepare_process(options, cache_home)


def watch_compiles(
    options: BackendOptions, on_first: Callable[[], None]
) -> AbstractContextManager[CompileReport]:
    """A block (the model's load and warm-up) whose kernel compilations are counted and timed;
    `on_first` runs before the first one starts. A backend that compiles nothing reports none."""
    return backend_class(options.name).watch_compiles(options, on_first)


def threads_note(options: BackendOptions) -> str | None:
    """One line on the host threads the backend `options` name would run its matmuls on (None: not
    on the host)."""
    return backend_class(options.name).threads_note(options)


def threads_warning(options: BackendOptions) -> str | None:
    """A warning when the fixed host thread count `options` asks for exceeds the cores other
    processes leave free now (None: it fits, is adaptive, or the matmuls are not on the host)."""
    return backend_class(options.name).threads_warning(options)


def kernel_modes(name: str) -> tuple[str, ...]:
    """The matmul modes backend `name` offers (capabilities.kernel_modes; empty: one way only)."""
    return BACKEND_CLASSES[name].capabilities.kernel_modes


__all__ = [
    "BACKEND_CLASSES",
    "BACKEND_NAMES",
    "IMPLEMENTED",
    "KV_CACHE_DTYPES",
    "Backend",
    "BackendError",
    "BackendOptions",
    "Capabilities",
    "CompileReport",
    "backend_class",
    "create_backend",
    "kernel_modes",
    "prepare_process",
    "threads_note",
    "threads_warning",
    "watch_compiles",
]
