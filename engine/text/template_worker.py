"""The chat-template worker: a separate Python process that renders Jinja2 chat templates.

A chat template comes from a model file and is hostile input: it can loop for hours, recurse without
end, or build strings of gigabytes, and a Python thread that runs it cannot be stopped. So templates
render here, in a child process the parent can kill (:mod:`infer.engine.text.sandbox`), under:

* a memory bound: the address space may grow by ``memory_mb`` beyond what the worker needs idle
  (``RLIMIT_AS``); an allocation past it is a ``MemoryError``, reported as one line;
* a wall-clock bound: the parent kills the worker after ``timeout_s``; a watchdog thread in here also
  exits the process shortly after, so nothing keeps running if the parent is gone;
* an output bound: rendering streams and stops once the text passes ``max_chars``;
* a recursion bound: Python's frame limit (``RecursionError``, reported as one line).

Jinja2's immutable sandbox still applies inside (no attribute walking, no mutation of the context,
``range`` capped), with the environment of transformers' ``apply_chat_template``.

This file imports only the standard library and Jinja2: it runs as a script (``python -I
template_worker.py``) without importing ``infer``. The protocol on stdin/stdout is one frame per
message, a 4-byte big-endian length then UTF-8 JSON: ``{"template", "context", "max_chars"}`` in,
``{"text"}`` or ``{"error"}`` out, after one ``{"ready"}`` frame once the worker has started.
"""

from __future__ import annotations

import json
import os
import resource
import struct
import sys
import threading
import time
from datetime import datetime
from functools import lru_cache
from typing import Any, BinaryIO, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

HEADER = struct.Struct(">I")
"""Each frame's length prefix."""

RECURSION_LIMIT = 1000
"""Python frames (about a hundred nested macro calls)."""


class TemplateRejected(Exception):
    """The template called ``raise_exception``: it cannot express these messages."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot express (e.g. roles out of order).
    raise TemplateRejected(str(message))


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # Same signature and defaults as transformers' filter; Jinja's own tojson escapes HTML characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def environment() -> ImmutableSandboxedEnvironment:
    """The sandboxed environment templates render in (transformers' settings)."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def compile_template(source: str) -> jinja2.Template:
    """The compiled template (compiling is the slow part; a server renders the same few templates)."""
    return environment().from_string(source)


class OutputTooLarge(Exception):
    """The rendered text passed the output limit."""


def render(source: str, context: dict[str, Any], max_chars: int) -> str:
    """Render ``source`` with ``context``, streaming, and stop once the text passes ``max_chars``."""
    pieces: list[str] = []
    size = 0
    for piece in compile_template(source).generate(**context):
        size += len(piece)
        if size > max_chars:
            raise OutputTooLarge(f"chat template output exceeds {max_chars} characters")
        pieces.append(piece)
    return "".join(pieces)


def _one_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def describe(exc: BaseException, memory_mb: int) -> str:
    """The one-line message for a failed render."""
    if isinstance(exc, jinja2.TemplateSyntaxError):
        return f"chat template does not parse (line {exc.lineno}): {_one_line(exc.message or '')}"
    if isinstance(exc, TemplateRejected):
        return f"chat template rejected the messages: {_one_line(str(exc))}"
    if isinstance(exc, OutputTooLarge):
        return str(exc)
    if isinstance(exc, MemoryError):
        return f"chat template needed more than {memory_mb} MiB of memory to render"
    if isinstance(exc, RecursionError):
        return f"chat template recursed too deeply (more than {RECURSION_LIMIT} Python frames)"
    if isinstance(exc, jinja2.TemplateError):  # undefined variables, sandbox violations
        return f"chat template failed to render: {_one_line(str(exc))}"
    return f"chat template failed to render: {type(exc).__name__}: {_one_line(str(exc))}"


def _read_frame(stream: BinaryIO) -> bytes | None:
    head = stream.read(HEADER.size)
    if len(head) < HEADER.size:
        return None
    (length,) = HEADER.unpack(head)
    body = stream.read(length)
    return body if len(body) == length else None


def _write_frame(stream: BinaryIO, payload: dict[str, Any]) -> None:
    data = json.dumps(payload).encode("utf-8")
    stream.write(HEADER.pack(len(data)) + data)
    stream.flush()


def _limit_memory(memory_mb: int) -> None:
    """Let the address space grow by ``memory_mb`` beyond its size now (Linux; elsewhere a no-op)."""
    try:
        with open("/proc/self/statm") as statm:
            now = int(statm.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        cap = now + memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    except (OSError, ValueError):
        pass


class _Watchdog:
    """Ends the process if one render outlives ``seconds`` (the parent kills it first; this covers a
    parent that died). The main thread yields the GIL every few milliseconds even in a tight loop."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.started: float | None = None
        threading.Thread(target=self._watch, name="template-watchdog", daemon=True).start()

    def _watch(self) -> None:
        while True:
            time.sleep(0.1)
            started = self.started
            if started is not None and time.monotonic() - started > self.seconds:
                os._exit(3)


def main(argv: list[str]) -> int:
    """Serve render requests on stdin/stdout until stdin closes. argv: memory_mb timeout_s."""
    memory_mb, timeout_s = int(argv[0]), float(argv[1])
    sys.setrecursionlimit(RECURSION_LIMIT)
    environment()  # build it before the memory cap applies
    compile_template("{{ '' }}")
    watchdog = _Watchdog(timeout_s + 1.0)
    _limit_memory(memory_mb)
    stdin, stdout = sys.stdin.buffer, sys.stdout.buffer
    _write_frame(stdout, {"ready": True})  # the parent's render deadlines start after this
    while True:
        frame = _read_frame(stdin)
        if frame is None:
            return 0
        watchdog.started = time.monotonic()
        try:
            request = json.loads(frame)
            reply = {"text": render(request["template"], request["context"], int(request["max_chars"]))}
        except BaseException as exc:  # every failure is a message to the parent, never a traceback
            reply = {"error": describe(exc, memory_mb)}
        watchdog.started = None
        try:
            _write_frame(stdout, reply)
        except MemoryError:
            _write_frame(stdout, {"error": describe(MemoryError(), memory_mb)})


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
