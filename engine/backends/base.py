"""The Backend protocol: what the models need, at the level they think in.

Models call only this protocol (weights the backend created, linear, embed, norms, RoPE, the
activation, KV writes and attention over the cache), so a model file is written once for every
backend and never touches an array library on activations. Host-side numpy (positions, slot
indices, masks) is passed in as numpy and the backend moves it with `asarray`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from infer.engine.backends.arrays import Array
from infer.engine.backends.errors import BackendError

if TYPE_CHECKING:
    from infer.engine.backends.attention import AttentionPlan
    from infer.engine.backends.kv_cache import KVCache

__all__ = [
    "Array",
    "Backend",
    "BackendOptions",
    "Capabilities",
    "CompileReport",
    "HostSetup",
    "SamplingEnvelope",
    "Weight",
    "device_capabilities",
]


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
    kernel_modes: tuple[str, ...] = ()
    """How it may multiply by a quantized matrix, when it has a choice (`BackendOptions.kernels`;
    the cpu backend: exact, int8, blas); empty: one way only. The profile schema reads them here."""


def device_capabilities(quant_formats: tuple[str, ...]) -> Capabilities:
    """A GPU backend's capabilities: every float dtype, `quant_formats` as blocks, and sampling on
    the device."""
    return Capabilities(
        dtypes=("float32", "float16", "bfloat16"),
        quant_formats=quant_formats,
        sampling=SamplingEnvelope(on_device=True),
    )


@dataclass(frozen=True)
class BackendOptions:
    """The settings that build a backend: which one, its dtype, its kernel mode and its threads."""

    name: str = "cpu"
    """Backend name as profiles spell it (one of BACKEND_NAMES)."""
    dtype: str = "float32"
    """Compute dtype (one of the backend's capabilities.dtypes)."""
    kernels: str = "blas"
    """Matmul mode, one of capabilities.kernel_modes, for a backend that has several (the profile's
    `cpu_kernels`); a backend with none has one way and takes no mode."""
    threads: int | None = None
    """Host threads for the matmuls: None = the libraries' own counts, left alone (library use);
    0 = all cores (the cpu kernels: one fewer per core other processes keep busy, re-checked before
    each step); N = N (the profile's `threads`)."""
    mmap: bool = True
    """The cpu backend computes on the GGUF's blocks where the file is memory-mapped (True) or on a copy
    in anonymous memory (False, the profile's `mmap: false`); the other backends copy weights to their
    device either way and take only True."""


@dataclass
class CompileReport:
    """What a backend compiled while its kernels loaded (the cpu backend's numba kernels on the first
    run on a machine); nothing for a backend that compiles nothing."""

    kernels: int = 0
    """Top-level compilations (functions a kernel calls compile inside its own event)."""
    seconds: float = 0.0
    """Wall time spent compiling."""


@dataclass(frozen=True)
class RowLayer:
    """One dense decoder layer's weights as a backend's `row_decoder` takes them (None: the layer has
    no such norm or bias)."""

    attn_norm: Any
    qkv: Any
    out: Any
    mlp_norm: Any
    gate_up: Any
    down: Any
    qkv_bias: Any = None
    q_norm: Any = None
    """Per head ([head_dim]) or over the whole q projection ([heads * head_dim])."""
    k_norm: Any = None
    post_attn_norm: Any = None
    post_mlp_norm: Any = None


@dataclass(frozen=True)
class RowShape:
    """What `row_decoder` needs of a model besides its layers' weights."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    """RMSNorm epsilon."""
    gelu: bool
    """GeGLU (True) or SwiGLU (False)."""
    rope_of: tuple[int, ...]
    """Each layer's kind of RoPE rotations (an index into the rotations `run` is handed)."""
    sliding: tuple[bool, ...]
    """Each layer: attends within `window` (True) or to every position."""
    window: int | None = None
    softcap: float | None = None
    """Attention scores' soft cap."""
    residual_multiplier: float | None = None
    """What each branch's output is multiplied by before it is added to the residual stream."""


class RowDecoder(Protocol):
    """A model's layers run for one decode row in one call (a backend's `row_decoder`)."""

    def run(
        self,
        hidden: Array,
        cache: KVCache,
        slot: int,
        position: int,
        q_rotations: np.ndarray,
        k_rotations: np.ndarray,
    ) -> Array:
        """Every layer for the one row `hidden` [1, width] (its embedding; may be updated in place):
        the residual stream after the last layer, the row's keys and values written at (slot,
        position); q_rotations, k_rotations: complex64 [rope kinds, head_dim / 2], the row's rotations
        of each kind. The row's bits are those the op-by-op path gives it."""
        ...


class HostSetup:
    """The hooks around a backend's ops, with what a backend that needs none does: the process, the
    step thread and each step are left as they are, and nothing compiles. A backend class inherits
    these and overrides what its libraries need (the cpu backend: cpu_setup.py)."""

    @classmethod
    def require_dtype(cls, dtype: str) -> None:
        """Raise BackendError unless the backend computes in `dtype` (one of capabilities.dtypes)."""
        dtypes: tuple[str, ...] = cls.capabilities.dtypes  # type: ignore[attr-defined]
        if dtype not in dtypes:
            raise BackendError(
                f"the {cls.name} backend computes in {', '.join(dtypes)}, got dtype {dtype!r}; "  # type: ignore[attr-defined]
                "use dtype float32"
            )

    @classmethod
    def require_library(cls, load: Callable[[], Any], package: str, extra: str) -> Any:
        """The library the backend runs on, from `load()` (its import), or BackendError naming the
        pip extra that installs `package`."""
        try:
            return load()
        except ImportError:
            raise BackendError(
                f"the {cls.name} backend needs {package}: pip install 'infer[{extra}]'"  # type: ignore[attr-defined]
            ) from None

    @classmethod
    def from_options(cls, options: BackendOptions) -> Backend:
        """The backend `options` ask for (raises BackendError for a dtype it cannot compute in, or for
        `mmap` False, a cpu backend setting)."""
        if not options.mmap:
            raise BackendError(
                f"mmap false (weights copied into memory) is a cpu backend setting; the {cls.name} backend "
                "copies weights to its device whatever it says: remove it"
            )
        return cls(options.dtype)  # type: ignore[call-arg,return-value]

    @staticmethod
    def prepare_process(options: BackendOptions, cache_home: Path) -> None:
        """Before anything loads: process-wide settings of the libraries the backend runs on.
        Here: the host BLAS (logits on the host, attention of long prompts) on `threads` threads
        when a count is fixed. `cache_home` is the folder of infer's own caches."""
        if options.threads:
            from threadpoolctl import threadpool_limits

            threadpool_limits(limits=options.threads, user_api="blas")

    @staticmethod
    def watch_compiles(
        options: BackendOptions, on_first: Callable[[], None]
    ) -> AbstractContextManager[CompileReport]:
        """A block whose kernel compilations are counted and timed (`on_first` runs before the first
        one starts, for a notice); here nothing compiles."""
        return nullcontext(CompileReport())

    @staticmethod
    def threads_note(options: BackendOptions) -> str | None:
        """One line saying how many host threads the matmuls run on (`infer profiles show`); None
        for a backend whose matmuls are not on the host."""
        return None

    @staticmethod
    def threads_warning(options: BackendOptions) -> str | None:
        """One line when the host threads asked for (`-t N`) exceed the cores other processes leave
        free now (checked once, before loading); None when they fit or the matmuls are not on the host."""
        return None

    def loading(self) -> AbstractContextManager[None]:
        """The block in which `load_engine` builds its models and warms the engine up: what a backend
        may set up only once every kernel has run (the cpu backend's weight copies) happens as it
        ends. Nothing here."""
        return nullcontext()

    def prepare_thread(self) -> None:
        """Called first in the thread that runs the engine's steps, if not the one that built it."""

    def release_thread(self) -> None:
        """Called in the thread that starts the engine's background step thread, before it starts:
        free what this thread holds for running steps that the step thread would compete with."""

    def prepare_step(self) -> None:
        """Called before each engine step."""

    def kernel_threads_now(self) -> int | None:
        """Threads the backend's own host kernels run on now; None when it has none (its matmuls
        go through the host BLAS or run on a device)."""
        return None

    def expert_stack(self, weights: Sequence[Any]) -> Any | None:
        """One weight holding a mixture of experts' matrices of one projection, for `expert_linear`;
        None (here) when the backend has no grouped product, and the model runs `linear` expert by
        expert."""
        return None

    def expert_linear(self, x: Any, stack: Any, experts: np.ndarray, starts: np.ndarray) -> Any:
        """Rows starts[s] .. starts[s + 1] - 1 of x times matrix experts[s] of `stack` (an
        `expert_stack` result), every segment in one call; each row's result is the bits `linear`
        gives it with that expert alone. Only backends whose `expert_stack` returns a weight have it."""
        raise BackendError(f"the {type(self).__name__} backend has no grouped expert product")

    def row_decoder(self, layers: Sequence[RowLayer], shape: RowShape) -> RowDecoder | None:
        """The layers packed to run one decode row in one call, or None (here) when the backend has no
        such path for them: the model then runs a one-row batch op by op."""
        return None

    def threads_reason(self) -> str | None:
        """One line saying why the host kernels run on the threads they do (fixed by `-t N`,
        adapted to the load, ...), for `infer bench`; None when the backend has no host kernels."""
        return None


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

    def expert_stack(self, weights: Sequence[Weight]) -> Weight | None:
        """One weight of a mixture of experts' matrices of one projection (same shape each), for
        `expert_linear`; None when this backend multiplies expert by expert (`linear`)."""
        ...

    def expert_linear(self, x: Array, stack: Weight, experts: np.ndarray, starts: np.ndarray) -> Array:
        """[P, out]: rows starts[s] .. starts[s + 1] - 1 of x [P, in] times matrix experts[s] of
        `stack`, in one call; each row's result is the bits `linear` gives it with that expert."""
        ...

    def row_decoder(self, layers: Sequence[RowLayer], shape: RowShape) -> RowDecoder | None:
        """Dense decoder `layers` packed to run one decode row in one call (`RowDecoder.run`), or None
        when the backend has no such path for them."""
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
        """A zero-filled array in the compute dtype (lazily committed where the platform allows).
        A backend that stores a KV cache in another dtype lists it in a `kv_cache_dtypes` attribute
        (the cpu backend: f32 and f16 with its kernels) and takes the storage dtype as a second
        argument here; one without the attribute stores f32 only (kv_cache.check_kv_cache_dtype)."""
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
