"""Which backend runs, for resolved settings: the engine's probe, with errors in settings terms.

`infer.engine.backends.probe` knows nothing of settings (the engine imports nothing above it); this
module reads the settings' `backend`, `strict_backend` and who asked, and turns the probe's
`BackendError` into a `SettingsError` (one line on stderr, exit 2 in the CLI).
"""

from __future__ import annotations

from infer.engine.backends.errors import BackendError
from infer.engine.backends.probe import BackendChoice, fallback_notice, probe_backend, with_dtype
from infer.engine.backends.probe import select_backend as _probe_and_select
from infer.profiles.settings import Settings, SettingsError

__all__ = ["BackendChoice", "choose_backend", "fallback_notice", "probe_backend", "select_backend"]


def select_backend(requested: str, *, strict: bool, requested_by: str | None = None) -> BackendChoice:
    """Probe `requested`; fall back to cpu when it cannot run, or raise `SettingsError` when `strict`
    (or when the cpu fallback fails too)."""
    try:
        return _probe_and_select(requested, strict=strict, requested_by=requested_by)
    except BackendError as exc:
        raise SettingsError(str(exc)) from None


def choose_backend(settings: Settings) -> BackendChoice:
    """`select_backend` for resolved settings (their `backend`, `strict_backend`, and who asked), with
    the compute `dtype` settled: a backend that runs as asked must support the dtype asked for (else
    `SettingsError` naming where the dtype came from); a fallback runs in its own dtype and says so."""
    source = settings.source("backend")
    if source.kind == "profile":
        requested_by = f"profile {settings.profile_name} ({source.detail})"
    elif source.kind == "default":
        requested_by = "default"
    else:
        requested_by = str(source)
    choice = select_backend(settings.backend, strict=settings.strict_backend, requested_by=requested_by)
    try:
        return with_dtype(choice, settings.dtype)
    except BackendError as exc:
        raise SettingsError(f"{settings.source('dtype')}: dtype {settings.dtype!r}: {exc}") from None
