"""CPU feature detection for the kernels (informational and for choosing explicit SIMD paths)."""

from __future__ import annotations

from dataclasses import dataclass

import llvmlite.binding as llvm


@dataclass(frozen=True)
class CpuFeatures:
    """What the host CPU offers the kernels, best path first."""

    avx512_vnni: bool
    avx_vnni: bool
    avx2: bool
    f16c: bool
    cpu_name: str
    """LLVM's name for the host CPU (numba compiles every kernel for it)."""

    @property
    def best(self) -> str:
        """The best SIMD level: avx512_vnni, avx_vnni, avx2 or portable."""
        if self.avx512_vnni:
            return "avx512_vnni"
        if self.avx_vnni:
            return "avx_vnni"
        if self.avx2:
            return "avx2"
        return "portable"


def _target_flags() -> tuple[set[str], str]:
    """The features and CPU name numba compiles for: the host's, or those NUMBA_CPU_FEATURES and
    NUMBA_CPU_NAME set (e.g. `haswell` with AVX2 features on an AVX-512 machine, to check the AVX2 code):
    the explicit paths must not use an instruction the code is compiled without."""
    from numba.core import config

    name = config.CPU_NAME or llvm.get_host_cpu_name()
    if config.CPU_FEATURES is not None:
        return {item[1:] for item in config.CPU_FEATURES.split(",") if item.startswith("+")}, name
    return {feature for feature, on in llvm.get_host_cpu_features().items() if on}, name


def cpu_features() -> CpuFeatures:
    """The target's features as LLVM sees them (the compiler that builds the kernels)."""
    flags, name = _target_flags()
    return CpuFeatures(
        avx512_vnni="avx512vnni" in flags and "avx512bw" in flags,
        avx_vnni="avxvnni" in flags,
        avx2="avx2" in flags and "fma" in flags,
        f16c="f16c" in flags,
        cpu_name=name,
    )
