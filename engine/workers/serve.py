"""The child side of a worker process: read a job, run the handler on it, write the reply, repeat.

Run as a script (``python -I serve.py HANDLER.py SETTINGS_JSON``) by :mod:`.process`; it imports only
the standard library (``-I`` puts no script folder on the path, so it cannot import ``infer``) and
loads the handler module from its path. A handler module defines:

* ``handle(request: dict) -> dict``: one job's reply (JSON data);
* ``describe(exc: BaseException, memory_mb: int) -> str``: the one-line message for a job that raised;
* ``prepare() -> None`` (optional): imports and caches, run once before the limits apply.

Bounds, from the settings the parent passes:

* memory: the address space may grow by ``memory_mb`` beyond what the worker uses once prepared
  (``RLIMIT_AS``); an allocation past it is a ``MemoryError`` (Python) or the end of the process
  (native code that aborts), which the parent reports;
* CPU: with ``cpu_s``, each job may use that many more CPU seconds (``RLIMIT_CPU``, set before each
  job); past it the kernel ends the process with SIGXCPU, even inside native code;
* wall clock: the parent kills the worker after ``timeout_s``; a watchdog thread in here also exits
  the process shortly after, so nothing keeps running if the parent is gone;
* priority: ``nice`` lowers the worker's scheduling priority, so a job competes with the engine's
  own threads only for spare CPU (and the engine's core-load probe does not count it as busy);
* stack: with ``stack_mb``, each job runs in a thread with exactly that stack, so how deep native code
  may recurse does not depend on the shell's ``ulimit -s``.

The protocol on stdin/stdout is one frame per message, a 4-byte big-endian length then UTF-8 JSON:
one ``{"ready": true}`` frame once the worker has started, then one reply per request.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import os
import resource
import struct
import sys
import threading
import time
from types import ModuleType
from typing import Any, BinaryIO

HEADER = struct.Struct(">I")
"""Each frame's length prefix."""


def read_frame(stream: BinaryIO) -> bytes | None:
    """The next frame's payload, or None at the end of the stream."""
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (length,) = HEADER.unpack(head)
    body = stream.read(length)
    return body if len(body) == length else None


def write_frame(stream: BinaryIO, payload: dict[str, Any]) -> None:
    """Write one frame holding ``payload`` as JSON."""
    data = json.dumps(payload).encode("utf-8")
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def limit_memory(memory_mb: int) -> None:
    """Let the address space grow by ``memory_mb`` beyond its size now (Linux; elsewhere a no-op)."""
    try:
        with open("/proc/self/statm") as statm:
            now = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = now + memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (OSError, ValueError):
        pass


def limit_cpu(cpu_s: float) -> None:
    """Let this process use ``cpu_s`` more CPU seconds from now (whole seconds, rounded up)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _, hard = resource.getrlimit(resource.RLIMIT_CPU)
    soft = math.ceil(usage.ru_utime + usage.ru_stime + cpu_s)
    if hard != resource.RLIM_INFINITY:
        soft = min(soft, hard)
    with contextlib.suppress(OSError, ValueError):
        resource.setrlimit(resource.RLIMIT_CPU, (soft, hard))


class _Watchdog:
    """Ends the process if one job outlives ``seconds`` (the parent kills it first; this covers a
    parent that died). The job thread yields the GIL every few milliseconds even in a tight loop."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: float | None = None
        threading.Thread(target=self._watch, name="worker-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            started = self.started
            if started is not None and time.monotonic() - started > self.seconds:
                os._exit(3)


def load_handler(path: str) -> ModuleType:
    """The handler module at ``path``."""
    spec = importlib.util.spec_from_file_location("infer_worker_handler", path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load the worker handler {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_job(handler: ModuleType, frame: bytes, memory_mb: int, stack_mb: int | None) -> dict[str, Any]:
    """The reply to one request frame: the handler's, or ``{"error": ...}`` if it raised."""
    box: dict[str, Any] = {}

    def job() -> None:
        try:
            box["reply"] = handler.handle(json.loads(frame))
        except BaseException as exc:  # every failure is a message to the parent, never a traceback
            box["reply"] = {"error": handler.describe(exc, memory_mb)}

    if stack_mb is None:
        job()
    else:
        thread = threading.Thread(target=job, name="worker-job")
        thread.start()
        thread.join()
    return box.get("reply", {"error": "the worker job ended without a reply"})


def main(argv: list[str]) -> int:
    """Serve requests on stdin/stdout until stdin closes. argv: HANDLER_PATH SETTINGS_JSON."""
    settings = json.loads(argv[1])
    if settings.get("nice"):
        os.nice(int(settings["nice"]))  # first: the handler's imports are spare-CPU work too
    handler = load_handler(argv[0])
    memory_mb, timeout_s = int(settings["memory_mb"]), float(settings["timeout_s"])
    cpu_s, stack_mb = settings.get("cpu_s"), settings.get("stack_mb")
    prepare = getattr(handler, "prepare", None)
    if prepare is not None:
        prepare()  # imports and caches, before the memory cap applies
    watchdog = _Watchdog(timeout_s + 1.0)
    if stack_mb is not None:
        threading.stack_size(int(stack_mb) * 2**20)  # for the job threads, made after the watchdog
    limit_memory(memory_mb)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    write_frame(stdout, {"ready": True})  # the parent's job deadlines start after this
    while True:
        frame = read_frame(stdin)
        if frame is None:
            return 0
        if cpu_s is not None:
            limit_cpu(float(cpu_s))
        watchdog.started = time.monotonic()
        reply = run_job(handler, frame, memory_mb, stack_mb)
        watchdog.started = None
        try:
            write_frame(stdout, reply)
        except MemoryError:
            write_frame(stdout, {"error": handler.describe(MemoryError(), memory_mb)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
