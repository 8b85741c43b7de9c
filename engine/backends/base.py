"""The Backend protocol: the array module and the handful of ops the models need.

Models call only this protocol, so a model file is written once for every backend.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, Protocol

import numpy as np

Array = Any
"""A backend array (numpy.ndarray on cpu, cupy.ndarray on cuda, mlx.core.array on metal)."""


class Backend(Protocol):
    """The ops a model needs, over the backend's own array type."""

    name: str
    """Backend name as profiles spell it: cpu, cuda, metal."""
    xp: ModuleType
    """The numpy-compatible array module the backend computes with."""

    def upload(self, array: np.ndarray) -> Array:
        """Copy a host float32 array to the device in the backend's compute dtype, contiguous."""
        ...

    def to_host(self, array: Array) -> np.ndarray:
        """Copy a device array back to a float32 numpy array."""
        ...

    def zeros(self, shape: tuple[int, ...]) -> Array:
        """A zero-filled array in the compute dtype (lazily committed where the platform allows)."""
        ...

    def linear(self, x: Array, weight: Array) -> Array:
        """x [rows, in] times weight [out, in] transposed: [rows, out]."""
        ...

    def logits(self, x: Array, table: Array) -> Array:
        """The vocabulary projection x [rows, hidden] @ table.T ([vocab, hidden]): [rows, vocab]."""
        ...

    def rms_norm(self, x: Array, weight: Array | None, eps: float) -> Array:
        """Root-mean-square normalisation over the last axis, scaled by `weight` when given."""
        ...

    def rope(self, x: Array, rotations: Array) -> Array:
        """Rotate adjacent pairs (2i, 2i + 1) of every head by complex `rotations` [T, d/2]:
        x [T, heads, d]; may work in place on `x`."""
        ...

    def silu_mul(self, gate_up: Array, width: int) -> Array:
        """SwiGLU: silu(gate) * up for gate_up = [gate | up] along the last axis, each `width` wide."""
        ...

    def exp_rows(self, scores: Array) -> tuple[Array, Array]:
        """Unnormalised softmax over the last axis: (weights, sums [..., 1]) with weights the exp of
        each row shifted by a constant of that row, so softmax = weights / sums; may reuse `scores`."""
        ...

    def softmax_(self, scores: Array) -> Array:
        """Softmax over the last axis, in place where possible; -inf entries get probability 0."""
        ...
