"""The Backend protocol: what the models need, at the level they think in.

Models call only this protocol (weights the backend created, linear, embed, norms, RoPE, the
activation, KV writes and attention over the cache), so a model file is written once for every
backend and never touches an array library on activations. Host-side numpy (positions, slot
indices, masks) is passed in as numpy and the backend moves it with `asarray`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from infer.engine.backends.arrays import Array

if TYPE_CHECKING:
    from infer.engine.backends.attention import AttentionPlan
    from infer.engine.backends.kv_cache import KVCache

__all__ = ["Array", "Backend", "Capabilities", "SamplingEnvelope", "Weight"]


@dataclass(frozen=True)
class SamplingEnvelope:
    """Whether a backend samples on the device the requests inside the envelope
    (`sampling.envelope.in_envelope`); the engine does so through `Backend.sampling_module`."""

    on_device: bool = False
    """True when the backend has device sampling kernels; the envelope function comes with them."""


@dataclass(frozen=True)
class Capabilities:
    """What a backend class can do, declared next to its probe."""

    dtypes: tuple[str, ...]
    """Compute dtypes it accepts at construction (profile `dtype` values)."""
    quant_formats: tuple[str, ...] = ()
    """GGUF block formats `Backend.weight` takes as blocks, without a float copy (empty: dense only)."""
    sampling: SamplingEnvelope = SamplingEnvelope()
    """Device-sampling envelope."""


class Weight(Protocol):
    """A weight the backend created from a checkpoint array; models pass it back to the backend's ops."""

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape ([out, in] for a matrix, [n] for a vector)."""
        ...


class Backend(Protocol):
    """The ops a model needs, over the backend's own array type."""

    name: ClassVar[str]
    """Backend name as profiles spell it: cpu, cuda, metal."""
    capabilities: ClassVar[Capabilities]
    """Dtypes, quant formats and sampling envelope of this backend class."""
    dtype: str
    """Compute dtype chosen at construction (one of capabilities.dtypes)."""

    # -- weights and host data ------------------------------------------------------------------
    def weight(
        self, array: np.ndarray, *, quant: str | None = None, shape: tuple[int, ...] | None = None
    ) -> Weight:
        """A weight from a checkpoint array. Dense (`quant` None): `array` is a float array of the
        weight's shape. Quantized (`quant` a GGUF type name such as "Q4_1", one of
        capabilities.quant_formats): `array` is the tensor's raw blocks as stored (uint8, memory-mapped
        is fine: no float copy is made) and `shape` its logical shape."""
        ...

    @property
    def block_formats(self) -> frozenset[str]:
        """GGUF types this backend instance computes on as blocks (its capabilities' quant formats it
        has kernels for in its current mode); tensors of other types are passed to `weight` as floats."""
        ...

    def stack(self, weights: Sequence[Weight]) -> Weight:
        """One weight whose rows are `weights`' rows in order (q, k, v into qkv): `linear` by it
        equals the concatenation of `linear` by each."""
        ...

    def asarray(self, host: np.ndarray) -> Array:
        """Move host data (indices, masks, RoPE rotations) to the device, keeping its dtype."""
        ...

    def to_host(self, array: Array) -> np.ndarray:
        """Copy a device array back to a numpy array."""
        ...

    @property
    def sampling_module(self) -> object | None:
        """The array module device sampling runs on (mlx.core, cupy), where logits rows are drawn
        without copying them to the host (`runtime.device_sampling`); None when the host is where
        the logits already are (the cpu backend)."""
        ...

    def softcap(self, x: Array, cap: float) -> Array:
        """cap * tanh(x / cap), elementwise in float32 (Gemma's final-logit soft-capping)."""
        ...

    def zeros(self, shape: tuple[int, ...]) -> Array:
        """A zero-filled array in the compute dtype (lazily committed where the platform allows)."""
        ...

    # -- ops on activations ---------------------------------------------------------------------
    def embed(self, table: Weight, ids: np.ndarray) -> Array:
        """Rows `ids` (host int64 [rows]) of the embedding table [vocab, hidden]: [rows, hidden]."""
        ...

    def linear(self, x: Array, weight: Weight, bias: Weight | None = None) -> Array:
        """x [rows, in] times weight [out, in] transposed, plus `bias` [out] when given: [rows, out]."""
        ...

    def logits(self, x: Array, table: Weight) -> Array:
        """The vocabulary projection x [rows, hidden] @ table.T ([vocab, hidden]): [rows, vocab]."""
        ...

    def rms_norm(self, x: Array, weight: Weight | None, eps: float) -> Array:
        """Root-mean-square normalisation over the last axis, scaled by `weight` when given."""
        ...

    def rope(self, x: Array, rotations: Array) -> Array:
        """Rotate adjacent pairs (2i, 2i + 1) of every head by complex `rotations` [T, d/2]:
        x [T, heads, d]; may work in place on `x`."""
        ...

    def silu_mul(self, gate_up: Array, width: int) -> Array:
        """SwiGLU: silu(gate) * up for gate_up = [gate | up] along the last axis, each `width` wide."""
        ...

    def gelu_mul(self, gate_up: Array, width: int) -> Array:
        """GeGLU: gelu(gate) * up (tanh approximation) for gate_up = [gate | up], each `width` wide."""
        ...

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(
        self, cache: KVCache, layer: int, slots: np.ndarray, positions: np.ndarray, k: Array, v: Array
    ) -> None:
        """Store row i's keys/values k, v [rows, kv_heads, head_dim] of `layer` at (slots[i],
        positions[i]) (host int64 arrays)."""
        ...

    def attention(self, q: Array, cache: KVCache, layer: int, plan: AttentionPlan) -> Array:
        """Causal grouped-query attention of q [rows, heads, head_dim] against each row's own
        sequence in `cache` (positions <= its own, and within `plan.window` of it when the plan has
        one, as `plan` says): [rows, heads, head_dim]."""
        ...
