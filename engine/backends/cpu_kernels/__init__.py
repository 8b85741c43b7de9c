"""Numba kernels on raw GGUF blocks for the CPU backend (the record each type registers: registry.py).

`KERNELS` maps a GGUF type name to its QuantKernels. Each kernel module exports one dict of them; the
modules are listed in _MODULES as (module, dict name) and merged in order (a type may appear once).
`row_attention` (attention.py) is the batch-invariant attention of decode and verify rows.

Importing the package imports no numba: `KERNELS`, `quantize_activations` and `cpu_features` load on
first use, so the `blas` mode, `infer --help` and the profile schema (which reads the QuantKernels
record) never pay for loading compiled kernels. It does drop numba's cache entries in the package's
own `__pycache__` that were compiled from other kernel sources (cache_freshness.py), before any
kernel module can load one.
"""

from __future__ import annotations

import importlib
from typing import Any

from infer.engine.backends.cpu_kernels.cache_freshness import drop_stale_in_tree_cache
from infer.engine.backends.cpu_kernels.registry import QuantKernels

drop_stale_in_tree_cache()

_MODULES: tuple[tuple[str, str], ...] = (
    ("legacy", "LEGACY_KERNELS"),  # Q4_0, Q4_1, Q8_0, Q5_0, Q5_1
    ("floats", "FLOAT_KERNELS"),  # F32, F16, BF16
    ("kquants_int8", "KQUANT_KERNELS"),  # Q4_K, Q5_K, Q6_K (kquants.py, integer int8 matmuls)
)

_HELPERS: dict[str, str] = {
    "quantize_activations": "activations",
    "cpu_features": "features",
    "CpuFeatures": "features",
}
"""Names loaded on first use, by the module that defines them."""


def _collect(modules: tuple[tuple[str, str], ...]) -> dict[str, QuantKernels]:
    """Merge the modules' dicts; a type registered twice is a programming error."""
    merged: dict[str, QuantKernels] = {}
    for module_name, dict_name in modules:
        module = importlib.import_module(f"{__name__}.{module_name}")
        for type_name, kernels in getattr(module, dict_name).items():
            if type_name in merged:
                raise RuntimeError(f"GGUF type {type_name} registered twice (again by {module_name})")
            merged[type_name] = kernels
    return merged


def __getattr__(name: str) -> Any:
    """`KERNELS` (GGUF type name -> its kernels) and the helpers, imported when first asked for."""
    if name == "KERNELS":
        value: Any = _collect(_MODULES)
    elif name in _HELPERS:
        value = getattr(importlib.import_module(f"{__name__}.{_HELPERS[name]}"), name)
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    globals()[name] = value  # later lookups find it without coming here
    return value


__all__ = ["KERNELS", "CpuFeatures", "QuantKernels", "cpu_features", "quantize_activations"]
