"""Compute backends behind one protocol (see base.Backend)."""

from __future__ import annotations

from infer.engine.backends.base import Backend

IMPLEMENTED: frozenset[str] = frozenset({"cpu"})
"""Backends this build has a model implementation for; cuda (CuPy) and metal (MLX) come next."""


def create_backend(name: str) -> Backend:
    """The backend called `name`; callers probe first (probe.select_backend) and pass what it selected."""
    if name == "cpu":
        from infer.engine.backends.cpu import CpuBackend

        return CpuBackend()
    raise ValueError(f"backend {name!r} has no implementation in this build; use cpu")
