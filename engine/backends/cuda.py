"""The CUDA backend (CuPy): its name, probe and capabilities; the ops come with the CUDA issue."""

from __future__ import annotations

from typing import ClassVar

from infer.engine.backends.base import Capabilities
from infer.engine.backends.errors import BackendError


class CudaBackend:
    """CuPy on an NVIDIA GPU. Only the probe exists in this build (`implemented` is False)."""

    name: ClassVar[str] = "cuda"
    capabilities: ClassVar[Capabilities] = Capabilities(dtypes=("float32", "float16", "bfloat16"))
    implemented: ClassVar[bool] = False

    def __init__(self, dtype: str = "float32") -> None:
        raise BackendError("this build has no cuda backend yet; use cpu")

    @staticmethod
    def probe() -> str | None:
        """None when CuPy imports, sees a device and runs a tiny op, else the reason."""
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
        return None if result == 12.0 else f"tiny op failed: cupy returned {result}"
