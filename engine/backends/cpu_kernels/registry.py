"""What a kernel module registers for one GGUF tensor type (see engine/backends/cpu_kernels/__init__.py)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

MatmulExact = Callable[[np.ndarray, np.ndarray, np.ndarray], None]
"""(blocks uint8 [out, row_bytes], x float32 [B, in], out float32 [B, out]) -> None: out = x @ W.T with
W dequantized in registers and float32 accumulation, each out[b, o] independent of B."""

MatmulInt8 = Callable[..., None]
"""(blocks, *activations, out float32 [B, out]) -> None: the same product with activations quantized as
llama.cpp does (approximate), the activations being the arrays the type's `quantize` returns (by
default quantize_activations: xq int8 [B, in], xs float32 [B, in // 32]); every array is [B, ...]."""

Quantize = Callable[[np.ndarray], tuple[np.ndarray, ...]]
"""float32 x [B, in] -> the quantized activations a MatmulInt8 reads, each array [B, ...]."""

MatmulSegments = Callable[..., None]
"""(stack uint8 [E, out, row_bytes], experts int64 [S], starts int64 [S + 1], x or activations, out float32
[P, out]) -> None: a mixture of experts' products in one call, segment s multiplying rows starts[s] ..
starts[s + 1] - 1 of x by matrix experts[s] of the stack. Each row's result is the bits `matmul_exact`
(or `matmul_int8`) gives it alone with that matrix."""

DequantizeRows = Callable[[np.ndarray, int, int, np.ndarray], None]
"""(blocks, start, stop, out float32 [stop - start, in]) -> None: rows start..stop-1 as float32, for
BLAS on dequantized tiles (large prefill chunks)."""


@dataclass(frozen=True)
class QuantKernels:
    """The kernels of one GGUF tensor type."""

    type_name: str
    """GGUF type name as gguf.GGMLQuantizationType spells it: Q4_1, Q8_0, Q4_K, F16, ..."""
    block_elements: int
    """Weights per block (32 for the legacy types, 256 for K-quants, 1 for F16/BF16/F32)."""
    block_bytes: int
    """Bytes per block."""
    matmul_exact: MatmulExact
    matmul_int8: MatmulInt8 | None
    """None where the type has no int8-activation kernel (then `int8` mode uses `matmul_exact`)."""
    dequantize_rows: DequantizeRows
    quantize: Quantize | None = None
    """The activation quantizer `matmul_int8` reads; None: quantize_activations (per 32-block, Q8_0)."""
    segments_exact: MatmulSegments | None = None
    """`matmul_exact` over the segments of an expert stack in one call; None: one call per segment."""
    segments_int8: MatmulSegments | None = None
    """`matmul_int8` over the segments of an expert stack in one call; None: one call per segment."""


def quantize_once(
    x: np.ndarray, kernels: Sequence[QuantKernels], default: Quantize
) -> dict[Quantize, tuple[np.ndarray, ...]] | None:
    """x quantized once per activation quantizer that these kernels' int8 matmuls read (`default` for
    those that name none), keyed by quantizer; None when one of them has no int8 matmul (then every
    part of the product runs its exact kernel)."""
    if any(k.matmul_int8 is None for k in kernels):
        return None
    acts: dict[Quantize, tuple[np.ndarray, ...]] = {}
    for k in kernels:
        quantize = k.quantize or default
        if quantize not in acts:
            acts[quantize] = quantize(x)
    return acts
