"""Every CUDA kernel source compiles for sm_90 under NVRTC, here, without a GPU.

NVRTC comes from PyPI (`cuda-bindings` + `nvidia-cuda-nvrtc`, the `cuda-compile` extra); the test
skips where they are not installed. The compiled cubin must export every kernel the backend looks up.
"""

from __future__ import annotations

import pytest

from infer.engine.backends.cuda_kernels import COMPILE_OPTIONS, KERNELS, SOURCES

nvrtc = pytest.importorskip(
    "cuda.bindings.nvrtc", reason="NVRTC is not installed (pip install '.[cuda-compile]')"
)

ARCH = "sm_90"


def compile_source(name: str, source: str) -> tuple[bytes, str]:
    """(cubin, log) of `source` compiled for ARCH; the test fails with NVRTC's log on an error."""
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, err
    try:
        options = [f"--gpu-architecture={ARCH}".encode(), *(o.encode() for o in COMPILE_OPTIONS)]
        (result,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        _, log_size = nvrtc.nvrtcGetProgramLogSize(program)
        # Writable buffers: NVRTC writes into what it is given, and `b" " * 1` is CPython's shared
        # one-byte object (writing into it turned every later b" " into b"\x00").
        log = bytearray(max(log_size, 1))
        nvrtc.nvrtcGetProgramLog(program, log)
        text = log.decode(errors="replace").rstrip("\x00 \n")
        assert result == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{name} failed to compile:\n{text}"
        _, size = nvrtc.nvrtcGetCUBINSize(program)
        cubin = bytearray(size)
        nvrtc.nvrtcGetCUBIN(program, cubin)
        return bytes(cubin), text
    finally:
        nvrtc.nvrtcDestroyProgram(program)


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_kernel_source_compiles_for_sm90(name: str) -> None:
    cubin, log = compile_source(name, SOURCES[name])
    assert cubin[:4] == b"\x7fELF", "NVRTC did not return a cubin"
    assert "warning" not in log.lower(), log
    for kernel in KERNELS[name]:
        assert kernel.encode() in cubin, f"{kernel} is not exported by {name}"


def test_a_broken_source_fails_to_compile() -> None:
    """The check can fail: a source with an error is reported with NVRTC's log."""
    with pytest.raises(AssertionError, match="failed to compile"):
        compile_source("broken", 'extern "C" __global__ void k(float* x) { x[0] = undefined_name; }')
