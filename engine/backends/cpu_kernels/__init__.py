"""Numba kernels on raw GGUF blocks for the CPU backend (interface: KERNELS.md, record: registry.py).

KERNELS maps a GGUF type name to its QuantKernels. Each kernel module exports one dict of them; the
modules are listed in _MODULES as (module, dict name) and merged in order (a type may appear once).
"""

from __future__ import annotations

import importlib

from .activations import quantize_activations
from .features import CpuFeatures, cpu_features
from .registry import QuantKernels

_MODULES: tuple[tuple[str, str], ...] = (
    ("legacy", "LEGACY_KERNELS"),  # Q4_0, Q4_1, Q8_0
    ("floats", "FLOAT_KERNELS"),  # F32, F16, BF16
    # the K-quants join here: ("kquants", "KQUANT_KERNELS"),  # Q4_K, Q5_K, Q6_K
)


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


KERNELS: dict[str, QuantKernels] = _collect(_MODULES)
"""GGUF type name -> its kernels."""

__all__ = ["KERNELS", "CpuFeatures", "QuantKernels", "cpu_features", "quantize_activations"]
