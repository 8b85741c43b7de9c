"""The CUDA backend: CuPy on an NVIDIA GPU, with the fused kernels of cuda_kernels.

Activations, the KV cache and every accumulation are float32. Weights stay as they are stored:
GGUF Q4_0/Q4_1/Q8_0 blocks are multiplied as blocks; float matrices are kept in the compute dtype
(`bfloat16` as raw bits, rounded to nearest even; `float16`; `float32`). A product of at most
GEMV_MAX_ROWS rows streams the weight once through a GEMV kernel that decodes it in registers;
a larger one dequantizes the matrix to float32 and runs through cuBLAS (`cupy.matmul`). Attention runs
one (row, head) per thread block over the row's own slot, so every row's result is the same whatever
batch it runs in. The host-side helpers (bfloat16 rounding, launch geometry) are plain numpy.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.base import Capabilities, HostSetup, device_capabilities
from infer.engine.backends.cuda_kernels import BLOCK_FORMATS, COMPILE_OPTIONS, GEMV_MAX_ROWS, SOURCES
from infer.engine.backends.errors import BackendError
from infer.engine.backends.kv_cache import KVCache

QUANT_FORMATS: tuple[str, ...] = ("Q4_0", "Q4_1", "Q8_0")
"""GGUF block types the kernels multiply as blocks."""

THREADS = 256
"""Threads per block of the element-wise and GEMV kernels (8 warps: 8 output rows per GEMV block)."""

ATTENTION_THREADS = 128
"""Threads per (row, head) block of row_attention."""

_DENSE_FORMAT = {"float32": "F32", "float16": "F16", "bfloat16": "BF16"}


def bfloat16_bits(array: np.ndarray) -> np.ndarray:
    """float32 values as bfloat16 bits (uint16), rounded to nearest, ties to even (NaN stays NaN)."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32)
    bias = np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))  # ties go to the even result
    rounded = ((bits + bias) >> np.uint32(16)).astype(np.uint16)
    nan = np.isnan(array)
    if nan.any():
        rounded[nan] = np.uint16(0x7FC0)
    return rounded


def dense_bytes(array: np.ndarray, dtype: str) -> np.ndarray:
    """A float matrix [out, in] as the bytes the kernels read: uint8 [out, in * itemsize]."""
    array = np.asarray(array, dtype=np.float32)
    if dtype == "bfloat16":
        raw = bfloat16_bits(array)
    elif dtype == "float16":
        raw = array.astype(np.float16)
    else:
        raw = np.ascontiguousarray(array)
    return raw.view(np.uint8).reshape(array.shape[0], -1)


def grid_for(count: int, threads: int = THREADS) -> tuple[int]:
    """Blocks of `threads` covering `count` work items."""
    return (max(1, -(-int(count) // threads)),)


def gemv_grid(out: int) -> tuple[int]:
    """Blocks for a GEMV: one warp per output row, THREADS / 32 rows per block."""
    return grid_for(out, THREADS // 32)


@dataclass(frozen=True)
class CudaMatrix:
    """A matrix as bytes on the device (GGUF blocks or dense rows), read 32 weights at a time."""

    data: Any
    format: str
    shape: tuple[int, ...]


@dataclass(frozen=True)
class CudaVector:
    """A float32 vector (norm weights, biases)."""

    data: Any

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the weight."""
        return tuple(self.data.shape)


@dataclass(frozen=True)
class CudaStacked:
    """Matrices whose rows stack into one weight, each multiplied on its own."""

    parts: tuple[CudaMatrix, ...]
    shape: tuple[int, ...]


CudaWeight = CudaMatrix | CudaVector | CudaStacked


class CudaBackend(HostSetup):
    """CuPy implementation of the Backend protocol (float32 activations; weights in the dtype)."""

    name: ClassVar[str] = "cuda"
    capabilities: ClassVar[Capabilities] = device_capabilities(QUANT_FORMATS)
    implemented: ClassVar[bool] = True

    def __init__(self, dtype: str = "float32") -> None:
        self.require_dtype(dtype)
        cupy = self.require_library(lambda: importlib.import_module("cupy"), "cupy", "cuda")
        self.dtype = dtype
        self.xp = cupy
        """cupy (the array module the envelope sampler runs on)."""
        self._kernels = {
            name: cupy.RawModule(code=source, options=COMPILE_OPTIONS) for name, source in SOURCES.items()
        }

    def _kernel(self, module: str, name: str) -> Any:
        return self._kernels[module].get_function(name)

    @property
    def block_formats(self) -> frozenset[str]:
        """GGUF types multiplied as blocks: Q4_0, Q4_1, Q8_0."""
        return frozenset(QUANT_FORMATS)

    @staticmethod
    def probe() -> str | None:
        """None when CuPy imports, sees a device, runs a tiny op, multiplies a tiny matrix and picks
        sampling candidates exactly as numpy does; else the reason (fails closed)."""
        try:
            import cupy
        except ImportError:
            return "cupy is not installed"
        except Exception as exc:  # a broken install raises anything at import
            return f"cupy failed to import: {type(exc).__name__}: {exc}"
        try:
            count = cupy.cuda.runtime.getDeviceCount()
        except Exception as exc:
            return f"no CUDA device ({type(exc).__name__}: {exc})"
        if count < 1:
            return "no CUDA device"
        try:
            result = float((cupy.arange(4, dtype=cupy.float32) * 2).sum().get())
        except Exception as exc:
            return f"tiny op failed: {type(exc).__name__}: {exc}"
        if result != 12.0:
            return f"tiny op failed: cupy returned {result}"
        from infer.engine.backends.probe_ops import check_array_module

        return check_array_module(cupy, cupy.asnumpy, "cupy")

    # -- weights and host data ------------------------------------------------------------------
    def weight(
        self, array: np.ndarray, *, quant: str | None = None, shape: tuple[int, ...] | None = None
    ) -> CudaWeight:
        """A vector as float32; a float matrix as dense rows in the compute dtype; GGUF blocks of
        `quant` (Q4_0/Q4_1/Q8_0, logical `shape` [out, in]) as they are."""
        cp = self.xp
        if quant is None:
            array = np.asarray(array, dtype=np.float32)
            if array.ndim == 1:
                return CudaVector(cp.asarray(array))
            if array.shape[1] % 32:  # not whole runs of 32: float32, through cuBLAS only
                return CudaMatrix(cp.asarray(array).view(cp.uint8), "F32", tuple(array.shape))
            data = cp.asarray(dense_bytes(array, self.dtype))
            return CudaMatrix(data, _DENSE_FORMAT[self.dtype], tuple(array.shape))
        if quant not in QUANT_FORMATS or shape is None or len(shape) != 2 or shape[1] % 32:
            raise BackendError(
                f"the cuda backend computes on no {quant} blocks of shape {shape}; pass it as floats"
            )
        rows = int(shape[0])
        blocks = np.ascontiguousarray(array, dtype=np.uint8).reshape(rows, -1)
        return CudaMatrix(cp.asarray(blocks), quant, (rows, int(shape[1])))

    def stack(self, weights: Sequence[CudaWeight]) -> CudaWeight:
        """One weight whose rows are `weights`' rows: same-format matrices concatenated, others kept
        as parts."""
        cp = self.xp
        if all(isinstance(w, CudaVector) for w in weights):
            return CudaVector(cp.concatenate([w.data for w in weights]))  # type: ignore[union-attr]
        if not all(isinstance(w, CudaMatrix) for w in weights):
            raise BackendError("cannot stack vectors and matrices into one")
        parts: tuple[CudaMatrix, ...] = tuple(weights)  # type: ignore[arg-type]
        rows = sum(p.shape[0] for p in parts)
        if len({p.format for p in parts}) == 1:
            return CudaMatrix(
                cp.concatenate([p.data for p in parts]), parts[0].format, (rows, parts[0].shape[1])
            )
        return CudaStacked(parts, (rows, parts[0].shape[1]))

    def asarray(self, host: np.ndarray) -> Any:
        """Host data on the device, same dtype."""
        return self.xp.asarray(host)

    def to_host(self, array: Any) -> np.ndarray:
        """A numpy copy."""
        return self.xp.asnumpy(array)

    @property
    def sampling_module(self) -> Any:
        """cupy: requests inside the envelope are drawn from candidates picked on the device."""
        return self.xp

    def softcap(self, x: Any, cap: float) -> Any:
        """cap * tanh(x / cap), in float32."""
        x = x.astype(self.xp.float32)
        return self.xp.tanh(x / cap) * cap

    def zeros(self, shape: tuple[int, ...]) -> Any:
        """Float32 zeros (the cache and activations are float32 whatever the weights' dtype)."""
        return self.xp.zeros(shape, dtype=self.xp.float32)

    # -- products -------------------------------------------------------------------------------
    def _float32(self, matrix: CudaMatrix, rows: Any = None) -> Any:
        """`matrix` (or its `rows`) as float32 [n, in] through the dequantize kernel."""
        cp = self.xp
        data = matrix.data if rows is None else matrix.data[rows]
        if matrix.format == "F32" and matrix.shape[1] % 32:
            return data.view(cp.float32)
        count, width = int(data.shape[0]), int(matrix.shape[1])
        out = cp.empty((count, width), dtype=cp.float32)
        _, run_bytes = BLOCK_FORMATS[matrix.format]
        kernel = self._kernel("matmul", f"dequantize_{matrix.format.lower()}")
        kernel(
            grid_for(count * width // 32),
            (THREADS,),
            (data, out, np.int32(count), np.int32(width), np.int32(data.shape[1]), np.int32(run_bytes)),
        )
        return out

    def _product(self, x: Any, weight: CudaMatrix | CudaStacked) -> Any:
        cp = self.xp
        if isinstance(weight, CudaStacked):
            return cp.concatenate([self._product(x, p) for p in weight.parts], axis=1)
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        rows = int(x.shape[0])
        out_rows, width = weight.shape
        if rows <= GEMV_MAX_ROWS and width % 32 == 0:
            y = cp.empty((rows, out_rows), dtype=cp.float32)
            _, run_bytes = BLOCK_FORMATS[weight.format]
            kernel = self._kernel("matmul", f"gemv_{weight.format.lower()}")
            args = (weight.data, x, y, np.int32(out_rows), np.int32(width), np.int32(rows))
            kernel(
                gemv_grid(out_rows), (THREADS,), (*args, np.int32(weight.data.shape[1]), np.int32(run_bytes))
            )
            return y
        return cp.matmul(x, self._float32(weight).T)

    def linear(self, x: Any, weight: CudaWeight, bias: CudaVector | None = None) -> Any:
        """x @ weight.T (+ bias)."""
        if isinstance(weight, CudaVector):
            raise BackendError("linear needs a matrix, got a vector")
        out = self._product(x, weight)
        if bias is not None:
            out += bias.data
        return out

    def logits(self, x: Any, table: CudaWeight) -> Any:
        """The vocabulary projection (float32)."""
        return self.linear(x, table)

    def embed(self, table: CudaWeight, ids: np.ndarray) -> Any:
        """Rows `ids` of the table, dequantized to float32."""
        if not isinstance(table, CudaMatrix):
            raise BackendError("an embedding table must be one matrix")
        return self._float32(table, self.xp.asarray(np.asarray(ids, dtype=np.int64)))

    # -- element-wise ---------------------------------------------------------------------------
    def rms_norm(self, x: Any, weight: CudaVector | None, eps: float) -> Any:
        """The rms_norm kernel: one block per row, float32."""
        cp = self.xp
        x = cp.ascontiguousarray(x, dtype=cp.float32)
        rows, cols = x.shape
        y = cp.empty_like(x)
        scale = weight.data if weight is not None else x  # unread when has_weight is 0
        self._kernel("elementwise", "rms_norm")(
            (rows,), (THREADS,), (x, scale, y, np.int32(cols), np.float32(eps), np.int32(weight is not None))
        )
        return y

    def rope(self, x: Any, rotations: Any) -> Any:
        """The rope kernel on a contiguous copy of x [rows, heads, d]; rotations complex64 [rows, d/2]."""
        cp = self.xp
        x = cp.array(x, dtype=cp.float32, order="C", copy=True)
        rows, heads, dim = x.shape
        rot = cp.ascontiguousarray(rotations, dtype=cp.complex64).view(cp.float32)
        half = dim // 2
        self._kernel("elementwise", "rope")(
            grid_for(rows * heads * half),
            (THREADS,),
            (x, rot, np.int32(rows), np.int32(heads), np.int32(half)),
        )
        return x

    def gelu_mul(self, gate_up: Any, width: int) -> Any:
        """GeGLU: gelu(gate) * up with the tanh approximation, in float32 array ops."""
        cp = self.xp
        gate_up = cp.asarray(gate_up, dtype=cp.float32)
        gate, up = gate_up[:, :width], gate_up[:, width:]
        inner = cp.float32(math.sqrt(2.0 / math.pi)) * (gate + cp.float32(0.044715) * gate * gate * gate)
        return cp.float32(0.5) * gate * (cp.float32(1.0) + cp.tanh(inner)) * up

    def silu_mul(self, gate_up: Any, width: int) -> Any:
        """The silu_mul kernel."""
        cp = self.xp
        gate_up = cp.ascontiguousarray(gate_up, dtype=cp.float32)
        rows = int(gate_up.shape[0])
        out = cp.empty((rows, width), dtype=cp.float32)
        self._kernel("elementwise", "silu_mul")(
            grid_for(rows * width), (THREADS,), (gate_up, out, np.int32(rows), np.int32(width))
        )
        return out

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(
        self, cache: KVCache, layer: int, slots: np.ndarray, positions: np.ndarray, k: Any, v: Any
    ) -> None:
        """The write_kv kernel: each row's keys/values to (slot, position) of `layer`."""
        cp = self.xp
        _, num_slots, kv_heads, capacity, head_dim = cache.keys.shape
        rows = int(k.shape[0])
        args = (
            cache.keys,
            cache.values,
            cp.ascontiguousarray(k, dtype=cp.float32),
            cp.ascontiguousarray(v, dtype=cp.float32),
            cp.asarray(np.asarray(slots, dtype=np.int64)),
            cp.asarray(np.asarray(positions, dtype=np.int64)),
        )
        sizes = (layer, num_slots, kv_heads, capacity, head_dim, rows)
        self._kernel("attention", "write_kv")(
            grid_for(rows * kv_heads * head_dim), (THREADS,), (*args, *(np.int32(s) for s in sizes))
        )

    def attention(self, q: Any, cache: KVCache, layer: int, plan: AttentionPlan) -> Any:
        """The row_attention kernel over every row (decode and prefill alike), each on its own slot.
        Sliding windows (Gemma 3) are not in the kernel yet: refused rather than attended in full."""
        if plan.window is not None and plan.row_first.any():
            raise BackendError(
                "sliding-window attention (Gemma 3) is not implemented on the cuda backend yet; "
                "use --profile cpu or metal"
            )
        if plan.softcap is not None:
            raise BackendError(
                "attention soft-capping (Gemma 2) is not implemented on the cuda backend yet; "
                "use --profile cpu"
            )
        cp = self.xp
        q = cp.ascontiguousarray(q, dtype=cp.float32)
        rows, heads, head_dim = q.shape
        _, num_slots, kv_heads, capacity, _ = cache.keys.shape
        out = cp.empty_like(q)
        scores = cp.empty((rows, heads, capacity), dtype=cp.float32)
        args = (q, cache.keys, cache.values, out, scores)
        index = (cp.asarray(plan.row_slots), cp.asarray(plan.row_visible))
        sizes = (layer, num_slots, heads, kv_heads, capacity, head_dim)
        self._kernel("attention", "row_attention")(
            (rows, heads), (ATTENTION_THREADS,), (*args, *index, *(np.int32(s) for s in sizes))
        )
        return out
