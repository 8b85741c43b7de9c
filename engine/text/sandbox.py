"""The parent side of the chat-template sandbox: a worker process that renders, and is killed when a
render runs past its time.

:class:`TemplateSandbox` keeps one worker (:mod:`infer.engine.text.template_worker`) alive between
renders, so the common case costs one pipe round trip (well under a millisecond) rather than a
process start (~0.2 s). A render that fails inside the worker (a syntax error, ``raise_exception``,
a memory or output limit, too deep a recursion) comes back as one line; a render that takes longer
than ``timeout_s`` kills the worker, which the next render replaces. Renders through one sandbox run
one at a time.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from infer.engine.text import template_worker

__all__ = ["SandboxLimits", "TemplateSandbox", "TemplateSandboxError", "default_sandbox"]


STARTUP_TIMEOUT_S = 60.0
"""How long a new worker may take to start (import Jinja2) before rendering is refused."""


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
        self._lock = threading.Lock()
        self._worker: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> TemplateSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the worker now (a server does, so its first chat request does not wait for it)."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        """End the worker (a later render starts a new one)."""
        with self._lock:
            self._kill()

    @property
    def worker_pid(self) -> int | None:
        """The live worker's process id (None when none runs)."""
        worker = self._worker
        return worker.pid if worker is not None and worker.poll() is None else None

    def render(self, template: str, context: dict[str, Any]) -> str:
        """``template`` rendered with ``context`` (JSON data); raises :class:`TemplateSandboxError`."""
        try:
            payload = json.dumps(
                {"template": template, "context": context, "max_chars": self.limits.max_chars}
            ).encode("utf-8")
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            raise TemplateSandboxError(f"chat template variables are not plain JSON data: {exc}") from None
        with self._lock:
            worker = self._ensure()
            try:
                assert worker.stdin is not None
                worker.stdin.write(template_worker.HEADER.pack(len(payload)) + payload)
                worker.stdin.flush()
                reply = self._read_reply(worker, time.monotonic() + self.limits.timeout_s)
            except BrokenPipeError:
                reply = None
            if reply is None:
                code = self._kill()
                if code is None:
                    raise TemplateSandboxError(
                        f"chat template took longer than {self.limits.timeout_s:g} s to render (stopped)"
                    )
                raise TemplateSandboxError(
                    f"chat template renderer ended (exit status {code}) while rendering; the template "
                    f"probably exceeded the {self.limits.memory_mb} MiB memory limit"
                )
        if "error" in reply:
            raise TemplateSandboxError(str(reply["error"]))
        return str(reply["text"])

    # -- the worker ------------------------------------------------------------------------------
    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._worker is not None and self._worker.poll() is None:
            return self._worker
        self._kill()
        limits = self.limits
        # -I: no user site, no PYTHON* variables, no script folder on the path: stdlib and Jinja2 only
        command = [
            sys.executable,
            "-I",
            template_worker.__file__,
            str(limits.memory_mb),
            str(limits.timeout_s),
        ]
        worker = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0
        )
        self._worker = worker
        # Starting (importing Jinja2) is not the template's time: wait for "ready" apart from the
        # render's deadline, with room for a loaded machine.
        if self._read_reply(worker, time.monotonic() + STARTUP_TIMEOUT_S) is None:
            self._kill()
            raise TemplateSandboxError("the chat-template renderer did not start")
        return worker

    def _kill(self) -> int | None:
        """Kill and reap the worker; its exit status if it had already ended by itself, else None."""
        worker, self._worker = self._worker, None
        if worker is None:
            return None
        code = worker.poll()
        if code is None:
            worker.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            worker.wait(timeout=5)
        for stream in (worker.stdin, worker.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        return code

    @staticmethod
    def _read_reply(worker: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | None:
        """The worker's reply, or None when the deadline passes or the worker ends first."""
        assert worker.stdout is not None
        fd = worker.stdout.fileno()
        buffer = bytearray()
        need = template_worker.HEADER.size
        length: int | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                while len(buffer) < need:
                    left = deadline - time.monotonic()
                    if left <= 0 or not selector.select(left):
                        return None
                    chunk = os.read(fd, max(need - len(buffer), 65536))
                    if not chunk:
                        return None
                    buffer += chunk
                if length is None:
                    (length,) = template_worker.HEADER.unpack(buffer[:need])
                    need += length
                    continue
                return json.loads(bytes(buffer[template_worker.HEADER.size : need]))  # type: ignore[no-any-return]


@functools.cache
def default_sandbox() -> TemplateSandbox:
    """The process's shared sandbox with the default limits, started on first use and ended at exit
    (like the compiled-template cache, a cache of a resource rather than state)."""
    sandbox = TemplateSandbox()
    atexit.register(sandbox.close)
    return sandbox
