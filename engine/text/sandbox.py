"""The parent side of the chat-template sandbox: a worker process that renders, and is killed when a
render runs past its time.

:class:`TemplateSandbox` keeps one worker (:mod:`infer.engine.workers` running
:mod:`infer.engine.text.template_worker`) alive between renders, so the common case costs one pipe
round trip (well under a millisecond) rather than a process start (~0.2 s). A render that fails
inside the worker (a syntax error, ``raise_exception``, a memory or output limit, too deep a
recursion) comes back as one line; a render that takes longer than ``timeout_s`` kills the worker,
which the next render replaces. Renders through one sandbox run one at a time.
"""

from __future__ import annotations

import atexit
import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from infer.engine.text import template_worker
from infer.engine.workers import WorkerFailure, WorkerLimits, WorkerProcess

__all__ = ["SandboxLimits", "TemplateSandbox", "TemplateSandboxError", "default_sandbox"]


class TemplateSandboxError(Exception):
    """A chat template failed to render in the sandbox; the message is one line."""


@dataclass(frozen=True)
class SandboxLimits:
    """What one render may use."""

    timeout_s: float = 2.0
    """Wall-clock seconds per render; past it the worker is killed."""
    memory_mb: int = 256
    """Address space the worker may add while rendering (MiB)."""
    max_chars: int = 8 * 2**20
    """Longest rendered text (characters)."""


class TemplateSandbox:
    """A worker process that renders chat templates under :class:`SandboxLimits`.

    Thread-safe; ``close()`` (or the end of a ``with`` block) ends the worker.
    """

    def __init__(self, limits: SandboxLimits | None = None) -> None:
        self.limits = limits or SandboxLimits()
        self._worker = WorkerProcess(
            template_worker.__file__,
            WorkerLimits(timeout_s=self.limits.timeout_s, memory_mb=self.limits.memory_mb),
            name="chat-template renderer",
        )

    def __enter__(self) -> TemplateSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the worker now (a server does, so its first chat request does not wait for it)."""
        try:
            self._worker.start()
        except WorkerFailure as exc:
            raise TemplateSandboxError(str(exc)) from None

    def close(self) -> None:
        """End the worker (a later render starts a new one)."""
        self._worker.close()

    @property
    def worker_pid(self) -> int | None:
        """The live worker's process id (None when none runs)."""
        return self._worker.pid

    def render(self, template: str, context: dict[str, Any], *, now: datetime | None = None) -> str:
        """``template`` rendered with ``context`` (JSON data); raises :class:`TemplateSandboxError`.

        now: the time ``strftime_now`` reads instead of the clock (reproducible prompts, tests).
        """
        request: dict[str, Any] = {
            "template": template,
            "context": context,
            "max_chars": self.limits.max_chars,
        }
        if now is not None:
            request["now"] = now.isoformat()
        try:
            reply = self._worker.call(request)
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            raise TemplateSandboxError(f"chat template variables are not plain JSON data: {exc}") from None
        except WorkerFailure as exc:
            if exc.timed_out:
                raise TemplateSandboxError(
                    f"chat template took longer than {self.limits.timeout_s:g} s to render (stopped)"
                ) from None
            if exc.exit_code is None:
                raise TemplateSandboxError(str(exc)) from None
            raise TemplateSandboxError(
                f"chat template renderer ended (exit status {exc.exit_code}) while rendering; the "
                f"template probably exceeded the {self.limits.memory_mb} MiB memory limit"
            ) from None
        if "error" in reply:
            raise TemplateSandboxError(str(reply["error"]))
        return str(reply["text"])


@functools.cache
def default_sandbox() -> TemplateSandbox:
    """The process's shared sandbox with the default limits, started on first use and ended at exit
    (like the compiled-template cache, a cache of a resource rather than state)."""
    sandbox = TemplateSandbox()
    atexit.register(sandbox.close)
    return sandbox
