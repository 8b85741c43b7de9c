"""Can a backend really run here? Import its array library, find the device, run a tiny op.

A profile asks for a backend; `select_backend` probes it and falls back to `cpu` when it cannot run
(or raises `SettingsError` under `--strict-backend`). The caller prints `fallback_notice` once on stderr.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from infer.engine.backends import IMPLEMENTED
from infer.profiles.settings import SettingsError

if TYPE_CHECKING:
    from infer.profiles.settings import Settings

BACKENDS: tuple[str, ...] = ("cpu", "cuda", "metal")
FALLBACK_BACKEND = "cpu"


@dataclass(frozen=True)
class BackendChoice:
    """The backend asked for, the one that will run, and why they differ (None when they don't).

    `requested_by` names who asked (e.g. `profile cuda (profiles/cuda.yaml:3)` or `--backend`), for the
    notice; it is optional.
    """

    requested: str
    selected: str
    reason: str | None
    requested_by: str | None = None


def _probe_cpu() -> str | None:
    import numpy as np

    result = (np.arange(4, dtype=np.float32) * 2).sum()
    return None if float(result) == 12.0 else f"tiny op failed: numpy returned {result}"


def _probe_cuda() -> str | None:
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


def _probe_metal() -> str | None:
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


_PROBES: dict[str, Callable[[], str | None]] = {
    "cpu": _probe_cpu,
    "cuda": _probe_cuda,
    "metal": _probe_metal,
}


def probe_backend(name: str) -> str | None:
    """None if backend `name` can run here, else the reason it cannot ("cupy is not installed",
    "no CUDA device", "mlx is not installed", "tiny op failed: ...").

    The probe really imports the array library and runs a tiny op on the device. MLX without Metal
    (Linux `mlx[cpu]`) counts as usable: the metal backend's code runs there on the CPU.
    """
    probe = _PROBES.get(name)
    if probe is None:
        return f"unknown backend {name!r} (allowed: {', '.join(BACKENDS)})"
    try:
        reason = probe()
    except Exception as exc:  # a probe must answer, never crash the caller
        return f"tiny op failed: {type(exc).__name__}: {exc}"
    if reason is None and name not in IMPLEMENTED:
        return f"the {name} array library works, but this build has no {name} backend yet"
    return reason


def select_backend(requested: str, *, strict: bool, requested_by: str | None = None) -> BackendChoice:
    """Probe `requested`; fall back to cpu when it cannot run, or raise `SettingsError` when `strict`."""
    reason = probe_backend(requested)
    if reason is None:
        return BackendChoice(requested, requested, None, requested_by)
    if strict:
        by = f" requested by {requested_by}" if requested_by else ""
        raise SettingsError(
            f"backend {requested!r}{by} is unavailable ({reason}) and --strict-backend is set "
            f"(without it, {FALLBACK_BACKEND} would be used)"
        )
    fallback_reason = probe_backend(FALLBACK_BACKEND)
    if fallback_reason is not None:
        raise SettingsError(
            f"backend {requested!r} is unavailable ({reason}) and the {FALLBACK_BACKEND} fallback failed too "
            f"({fallback_reason})"
        )
    return BackendChoice(requested, FALLBACK_BACKEND, reason, requested_by)


def choose_backend(settings: Settings) -> BackendChoice:
    """`select_backend` for resolved settings: their `backend`, `strict_backend`, and who asked."""
    source = settings.source("backend")
    if source.kind == "profile":
        requested_by = f"profile {settings.profile_name} ({source.detail})"
    elif source.kind == "default":
        requested_by = "default"
    else:
        requested_by = str(source)
    return select_backend(settings.backend, strict=settings.strict_backend, requested_by=requested_by)


def fallback_notice(choice: BackendChoice) -> str | None:
    """The one stderr line for a fallback, or None when the requested backend runs. E.g.
    `infer: backend 'cuda' requested by profile cuda (profiles/cuda.yaml:4) is unavailable
    (cupy is not installed ...); using cpu`."""
    if choice.selected == choice.requested:
        return None
    by = f" requested by {choice.requested_by}" if choice.requested_by else ""
    return (
        f"infer: backend {choice.requested!r}{by} is unavailable ({choice.reason}); using {choice.selected}"
    )
