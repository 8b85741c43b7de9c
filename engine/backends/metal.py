"""The Metal backend (MLX): its name, probe and capabilities; the ops come with the Metal issue."""

from __future__ import annotations

from typing import ClassVar

from infer.engine.backends.base import Capabilities
from infer.engine.backends.errors import BackendError


class MetalBackend:
    """MLX on Apple silicon (or MLX's Linux CPU build). Only the probe exists in this build."""

    name: ClassVar[str] = "metal"
    capabilities: ClassVar[Capabilities] = Capabilities(dtypes=("float32", "float16", "bfloat16"))
    implemented: ClassVar[bool] = False

    def __init__(self, dtype: str = "float32") -> None:
        raise BackendError("this build has no metal backend yet; use cpu")

    @staticmethod
    def probe() -> str | None:
        """None when MLX imports and runs a tiny op, else the reason. MLX without Metal (Linux
        `mlx[cpu]`) counts as usable: the backend's code runs there on the CPU."""
        try:
            import mlx.core as mx
        except ImportError:
            return "mlx is not installed"
        except Exception as exc:
            return f"mlx failed to import: {type(exc).__name__}: {exc}"
        try:
            value = mx.sum(mx.arange(4, dtype=mx.float32) * 2)
            mx.eval(value)
            result = float(value.item())
        except Exception as exc:
            return f"tiny op failed: {type(exc).__name__}: {exc}"
        return None if result == 12.0 else f"tiny op failed: mlx returned {result}"
