"""The parent side of a worker process: start it, send it one job at a time, kill it when a job runs
past its time, and start a new one for the next job after it ended.

:class:`WorkerProcess` keeps one worker (:mod:`infer.engine.workers.serve` running a handler module)
alive between jobs, so the common case costs one pipe round trip (well under a millisecond) rather
than a process start (~0.2 s). A job that fails inside the worker comes back as its handler's
``{"error": ...}`` reply; a job that takes longer than ``timeout_s``, or that ends the worker (a
memory or CPU limit, a crash in native code), raises :class:`WorkerFailure`, and the next job
starts a fresh worker. Jobs through one worker run one at a time.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from infer.engine.workers import serve

__all__ = ["WorkerFailure", "WorkerLimits", "WorkerProcess"]

_LATE, _ENDED = object(), object()
"""What `_read_reply` returns instead of a reply: the deadline passed, or the worker ended."""

STARTUP_TIMEOUT_S = 60.0
"""How long a new worker may take to start (its imports) before the job is refused."""


@dataclass(frozen=True)
class WorkerLimits:
    """What one job may use (see :mod:`infer.engine.workers.serve` for how each is enforced)."""

    timeout_s: float
    """Wall-clock seconds per job; past it the worker is killed."""
    memory_mb: int
    """Address space the worker may add while working (MiB)."""
    cpu_s: float | None = None
    """CPU seconds per job (None = only the wall clock bounds it)."""
    nice: int = 0
    """How much lower than the parent's the worker's scheduling priority is."""
    stack_mb: int | None = None
    """Each job's thread stack (None: the worker's main thread runs the job)."""


class WorkerFailure(Exception):
    """A job got no reply: it ran past its time (``timed_out``), or the worker ended while working
    (``exit_code``: negative for a signal, e.g. -11 SIGSEGV, -24 SIGXCPU), or never started."""

    def __init__(self, message: str, *, timed_out: bool = False, exit_code: int | None = None) -> None:
        super().__init__(message)
        self.timed_out = timed_out
        self.exit_code = exit_code


class WorkerProcess:
    """One worker process running ``handler`` (a module file) under ``limits``; thread-safe.

    ``close()`` (or the end of a ``with`` block) ends the worker; a later job starts a new one.
    """

    def __init__(self, handler: str | Path, limits: WorkerLimits, *, name: str = "worker") -> None:
        self.handler = str(handler)
        self.limits = limits
        self.name = name
        """What the worker does, for messages ("the grammar compiler did not start")."""
        self._lock = threading.Lock()
        self._worker: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> WorkerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        """Start the worker now (a server does, so its first request does not wait for it)."""
        with self._lock:
            self._ensure()

    def close(self) -> None:
        """End the worker."""
        with self._lock:
            self._kill()

    @property
    def pid(self) -> int | None:
        """The live worker's process id (None when none runs)."""
        worker = self._worker
        return worker.pid if worker is not None and worker.poll() is None else None

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        """The worker's reply to ``request`` (JSON data; TypeError/ValueError if it is not).

        Raises :class:`WorkerFailure` when no reply came: the job ran past ``timeout_s`` (the worker
        is killed) or the worker ended while working.
        """
        payload = json.dumps(request).encode("utf-8")
        with self._lock:
            worker = self._ensure()
            try:
                assert worker.stdin is not None
                worker.stdin.write(serve.HEADER.pack(len(payload)) + payload)
                worker.stdin.flush()
                reply = self._read_reply(worker, time.monotonic() + self.limits.timeout_s)
            except BrokenPipeError:
                reply = _ENDED
            if not isinstance(reply, dict):
                code = self._kill(ended=reply is _ENDED)
                if code is None:
                    raise WorkerFailure(
                        f"the {self.name} took longer than {self.limits.timeout_s:g} s (stopped)",
                        timed_out=True,
                    )
                raise WorkerFailure(f"the {self.name} ended (exit status {code})", exit_code=code)
        return reply

    # -- the worker ------------------------------------------------------------------------------
    def _ensure(self) -> subprocess.Popen[bytes]:
        if self._worker is not None and self._worker.poll() is None:
            return self._worker
        self._kill()
        settings = json.dumps(asdict(self.limits))
        # -I: no user site, no PYTHON* variables, no script folder on the path: the standard library,
        # the installed packages and the handler file only
        command = [sys.executable, "-I", serve.__file__, self.handler, settings]
        worker = subprocess.Popen(
            command,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self._worker = worker
        # Starting (the handler's imports) is not the job's time: wait for "ready" apart from the
        # job's deadline, with room for a loaded machine.
        if not isinstance(self._read_reply(worker, time.monotonic() + STARTUP_TIMEOUT_S), dict):
            self._kill()
            raise WorkerFailure(f"the {self.name} did not start")
        return worker

    def _kill(self, ended: bool = False) -> int | None:
        """Kill and reap the worker; its exit status if it had ended by itself, else None. With
        `ended` (its output closed), wait a moment for that exit status before killing."""
        worker, self._worker = self._worker, None
        if worker is None:
            return None
        code = worker.poll()
        if code is None and ended:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = worker.wait(timeout=2)
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
    def _read_reply(worker: subprocess.Popen[bytes], deadline: float) -> dict[str, Any] | object:
        """The worker's reply; `_LATE` when the deadline passes first, `_ENDED` when its output
        closes first (it ended)."""
        assert worker.stdout is not None
        fd = worker.stdout.fileno()
        buffer = bytearray()
        need = serve.HEADER.size
        length: int | None = None
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                while len(buffer) < need:
                    left = deadline - time.monotonic()
                    if left <= 0 or not selector.select(left):
                        return _LATE
                    chunk = os.read(fd, max(need - len(buffer), 65536))
                    if not chunk:
                        return _ENDED
                    buffer += chunk
                if length is None:
                    (length,) = serve.HEADER.unpack(buffer[:need])
                    need += length
                    continue
                return json.loads(bytes(buffer[serve.HEADER.size : need]))  # type: ignore[no-any-return]
