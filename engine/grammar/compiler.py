"""Compiling constraints outside this process: the compile worker, and a cache of its verdicts.

:class:`GrammarCompiler` hands a constraint (already inside the bounds of :mod:`.limits`) to a worker
process (:mod:`.compile_worker`, under :data:`.limits.COMPILE_LIMITS`) and keeps what came back,
the compiled grammar or the reason it was refused, in a bounded LRU cache: a server sees the same
few schemas again and again, and a hostile grammar that crashed the worker once is refused from the
cache the next time instead of crashing a fresh worker. A crash, a timeout or a memory or CPU limit
of the worker is a refusal like any other (:class:`CompileRefused`), never an error of the caller.
"""

from __future__ import annotations

import atexit
import functools
import signal
import threading
from collections import OrderedDict
from dataclasses import dataclass

from infer.engine.grammar import compile_worker
from infer.engine.grammar.limits import COMPILE_LIMITS, PARSER_LIMITS
from infer.engine.workers import WorkerFailure, WorkerLimits, WorkerProcess

SMOKE_STEPS = 16
"""Tokens of the compile worker's byte-level smoke match."""


class CompileRefused(ValueError):
    """The worker refused the constraint (or failed on it); the message is one line for the client."""


@dataclass(frozen=True)
class Compiled:
    """What the worker made of a constraint: llguidance's grammar, and for `lark_or_gbnf` the Lark
    text the grammar was written as (a GBNF grammar converted)."""

    grammar: str
    lark: str = ""


@dataclass(frozen=True)
class _Job:
    kind: str
    source: str
    choices: tuple[str, ...]


class GrammarCompiler:
    """The compile worker plus an LRU cache of its verdicts (thread-safe; compiles run one at a time).

    `max_entries` and `max_chars` bound the cache (a verdict's size is its grammar's length).
    """

    def __init__(
        self,
        limits: WorkerLimits = COMPILE_LIMITS,
        *,
        max_entries: int = 256,
        max_chars: int = 16 * 2**20,
    ) -> None:
        self.limits = limits
        self._worker = WorkerProcess(compile_worker.__file__, limits, name="grammar compiler")
        self._cache: OrderedDict[_Job, Compiled | str] = OrderedDict()
        self._cached_chars = 0
        self.max_entries = max_entries
        self.max_chars = max_chars
        self._lock = threading.Lock()

    def close(self) -> None:
        """End the worker (a later compile starts a new one); the cache stays."""
        self._worker.close()

    @property
    def worker_pid(self) -> int | None:
        """The live worker's process id (None when none runs)."""
        return self._worker.pid

    def compile(
        self, kind: str, source: str = "", choices: tuple[str, ...] = (), json_options: dict | None = None
    ) -> Compiled:
        """The compiled constraint; CompileRefused (one line) if llguidance refuses it or the worker
        fails on it. `kind` is a GrammarSpec kind, or `lark_or_gbnf` for a grammar in either syntax."""
        job = _Job(kind, source, tuple(choices))
        with self._lock:
            verdict = self._cache.get(job)
            if verdict is not None:
                self._cache.move_to_end(job)
        if verdict is None:
            verdict = self._run(job, json_options or {})
            self._remember(job, verdict)
            if isinstance(verdict, Compiled) and verdict.lark and kind == "lark_or_gbnf":
                self._remember(_Job("lark", verdict.lark, ()), Compiled(verdict.grammar, verdict.lark))
        if isinstance(verdict, str):
            raise CompileRefused(verdict)
        return verdict

    def _run(self, job: _Job, json_options: dict) -> Compiled | str:
        request = {
            "kind": job.kind,
            "source": job.source,
            "choices": list(job.choices),
            "json_options": json_options,
            "limits": PARSER_LIMITS,
            "smoke_steps": SMOKE_STEPS,
        }
        try:
            reply = self._worker.call(request)
        except (TypeError, ValueError, UnicodeEncodeError) as exc:
            return f"the constraint is not plain text: {exc}"
        except WorkerFailure as exc:
            return self._describe_failure(exc)
        if "error" in reply:
            return str(reply["error"])
        return Compiled(str(reply["grammar"]), str(reply.get("lark", "")))

    def _describe_failure(self, exc: WorkerFailure) -> str:
        limits = self.limits
        if exc.timed_out:
            return f"the grammar took longer than {limits.timeout_s:g} s to compile (stopped)"
        code = exc.exit_code
        if code == -signal.SIGXCPU:
            return f"the grammar needed more than {limits.cpu_s:g} s of CPU time to compile (stopped)"
        if code is None:
            return f"the grammar could not be compiled: {exc}"
        if code in (-signal.SIGSEGV, -signal.SIGBUS):
            return "the grammar crashed the grammar compiler (too deeply nested or too large)"
        return (
            f"the grammar compiler ended (exit status {code}) on this grammar; it probably needed more "
            f"than the {limits.memory_mb} MiB memory limit"
        )

    def _remember(self, job: _Job, verdict: Compiled | str) -> None:
        size = len(verdict if isinstance(verdict, str) else verdict.grammar) + len(job.source)
        with self._lock:
            if job in self._cache:
                return
            self._cache[job] = verdict
            self._cached_chars += size
            while len(self._cache) > self.max_entries or self._cached_chars > self.max_chars:
                old_job, old = self._cache.popitem(last=False)
                self._cached_chars -= len(old if isinstance(old, str) else old.grammar) + len(old_job.source)


@functools.cache
def default_compiler() -> GrammarCompiler:
    """The process's shared compiler, its worker started on first use and ended at exit (a cache of
    a resource, like the chat-template sandbox)."""
    compiler = GrammarCompiler()
    atexit.register(compiler.close)
    return compiler
