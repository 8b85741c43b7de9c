"""A worker handler for tests/test_workers.py, loaded by path by `infer.engine.workers.serve`: each job
names what to do, so a test can make the worker crash, spin, allocate or recurse on purpose."""

from __future__ import annotations

import ctypes
import threading
import time
from typing import Any


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """`{"do": "echo" | "segfault" | "spin" | "sleep" | "allocate" | "stack" | "raise", ...}`."""
    action = request["do"]
    if action == "echo":
        return {"echo": request.get("value")}
    if action == "segfault":
        ctypes.string_at(0)  # reads address 0: SIGSEGV, as a native crash would
    if action == "spin":
        while True:
            pass
    if action == "sleep":
        time.sleep(float(request["seconds"]))
        return {"slept": True}
    if action == "allocate":
        return {"size": len(bytearray(int(request["mb"]) * 2**20))}
    if action == "stack":
        return {"stack": threading.stack_size()}
    raise ValueError("asked to fail")


def describe(exc: BaseException, memory_mb: int) -> str:
    """The one-line message for a failed job."""
    if isinstance(exc, MemoryError):
        return f"needed more than {memory_mb} MiB"
    return f"{type(exc).__name__}: {exc}"
