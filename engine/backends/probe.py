"""Can a backend really run here? Import its array library, find the device, run a tiny op.

A profile asks for a backend; `select_backend` probes it and falls back to `cpu` when it cannot run
(or raises `BackendError` under `--strict-backend`; the settings layer turns that into its own
error). The caller prints `fallback_notice` once on stderr. Each backend class owns its probe.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from infer.engine.backends import BACKEND_CLASSES, BACKEND_NAMES
from infer.engine.backends.errors import BackendError

BACKENDS: tuple[str, ...] = BACKEND_NAMES
"""Every backend name (derived from the registry in infer.engine.backends)."""
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
    dtype: str = "float32"
    """The compute dtype the selected backend runs in."""
    requested_dtype: str | None = None
    """The dtype asked for, when a fallback backend cannot compute in it (None otherwise)."""


def probe_backend(name: str) -> str | None:
    """None if backend `name` can run here, else the reason it cannot ("cupy is not installed",
    "no CUDA device", "mlx is not installed", "tiny op failed: ...").

    The probe really imports the array library and runs a tiny op on the device. MLX without Metal
    (Linux `mlx[cpu]`) counts as usable: the metal backend's code runs there on the CPU.
    """
    cls = BACKEND_CLASSES.get(name)
    if cls is None:
        return f"unknown backend {name!r} (allowed: {', '.join(BACKENDS)})"
    try:
        reason = cls.probe()
    except Exception as exc:  # a probe must answer, never crash the caller
        return f"tiny op failed: {type(exc).__name__}: {exc}"
    if reason is None and not cls.implemented:
        return f"the {name} array library works, but this build has no {name} backend yet"
    return reason


def select_backend(requested: str, *, strict: bool, requested_by: str | None = None) -> BackendChoice:
    """Probe `requested`; fall back to cpu when it cannot run, or raise `BackendError` when `strict`."""
    reason = probe_backend(requested)
    if reason is None:
        return BackendChoice(requested, requested, None, requested_by)
    if strict:
        by = f" requested by {requested_by}" if requested_by else ""
        raise BackendError(
            f"backend {requested!r}{by} is unavailable ({reason}) and --strict-backend is set "
            f"(without it, {FALLBACK_BACKEND} would be used)"
        )
    fallback_reason = probe_backend(FALLBACK_BACKEND)
    if fallback_reason is not None:
        raise BackendError(
            f"backend {requested!r} is unavailable ({reason}) and the {FALLBACK_BACKEND} fallback failed too "
            f"({fallback_reason})"
        )
    return BackendChoice(requested, FALLBACK_BACKEND, reason, requested_by)


def fallback_notice(choice: BackendChoice) -> str | None:
    """The one stderr line for a fallback, or None when the requested backend runs. E.g.
    `infer: backend 'cuda' requested by profile cuda (profiles/cuda.yaml:4) is unavailable
    (cupy is not installed ...); using cpu`."""
    if choice.selected == choice.requested:
        return None
    by = f" requested by {choice.requested_by}" if choice.requested_by else ""
    return (
        f"infer: backend {choice.requested!r}{by} is unavailable ({choice.reason}); "
        f"using {choice.selected}{dtype_note(choice)}"
    )


def dtype_note(choice: BackendChoice) -> str:
    """' in float32 (not bfloat16)' when the selected backend cannot compute in the dtype asked for,
    else ''."""
    return f" in {choice.dtype} (not {choice.requested_dtype})" if choice.requested_dtype else ""


def with_dtype(choice: BackendChoice, dtype: str) -> BackendChoice:
    """`choice` computing in `dtype`: as asked when the selected backend can; on a fallback backend
    that cannot, its first dtype (the fallback notice then says so); else BackendError, since the
    backend that was asked for cannot honour the dtype that was asked for."""
    dtypes = BACKEND_CLASSES[choice.selected].capabilities.dtypes
    if dtype in dtypes:
        return replace(choice, dtype=dtype, requested_dtype=None)
    if choice.selected != choice.requested:
        return replace(choice, dtype=dtypes[0], requested_dtype=dtype)
    raise BackendError(f"backend {choice.selected!r} computes in {' or '.join(dtypes)} only, not {dtype!r}")
