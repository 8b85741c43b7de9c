"""A child `infer` process on a pseudo-terminal (stdin/stdout, and stderr too if asked), for tests of what
a person at a terminal sees: streaming, status lines, Ctrl-C, line editing."""

from __future__ import annotations

import os
import pty
import select
import signal
import sys
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ENTRY = "import sys; from infer.cli.main import main; sys.argv[0] = 'infer'; main()"


@dataclass
class Terminal:
    """A child process on a pty (stdin/stdout) with stderr on a pipe."""

    pid: int
    master: int
    stderr_fd: int
    started: float = field(default_factory=time.monotonic)
    chunks: list[tuple[float, bytes]] = field(default_factory=list)
    stderr: bytearray = field(default_factory=bytearray)
    status: int | None = None
    exited_at: float | None = None

    @classmethod
    def spawn(
        cls, args: list[str], env: dict[str, str] | None = None, stderr_on_pty: bool = False
    ) -> Terminal:
        """Start `infer ARGS`; stderr goes to its own pipe unless `stderr_on_pty` (then it is in `stdout`)."""
        full = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
        full.update({"TERM": "xterm", "COLUMNS": "100", **(env or {})})
        read_err, write_err = os.pipe()
        pid, master = pty.fork()
        if pid == 0:  # child: only async-signal-safe work before exec
            try:
                if not stderr_on_pty:
                    os.dup2(write_err, 2)
                signal.signal(
                    signal.SIGINT, signal.SIG_DFL
                )  # as at a terminal, even if pytest runs with it ignored (a shell's & job)
                os.execve(sys.executable, [sys.executable, "-c", ENTRY, *args], full)
            finally:
                os._exit(127)
        os.close(write_err)
        if stderr_on_pty:
            os.close(read_err)
            read_err = -1
        return cls(pid, master, read_err)

    def type(self, text: str) -> None:
        """Keys typed at the terminal."""
        os.write(self.master, text.encode())

    @property
    def stdout(self) -> str:
        return b"".join(chunk for _, chunk in self.chunks).decode("utf-8", errors="replace")

    def alive(self) -> bool:
        """Whether the child still runs; reaps it (keeping its status) once it has exited."""
        if self.status is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped by something else in this process: its status is lost
                pytest.fail(f"infer's process {self.pid} was reaped outside this harness; {self.describe()}")
            if pid:
                self.status, self.exited_at = status, time.monotonic()
        return self.status is None

    def describe(self) -> str:
        """The child's kernel state and what it printed, for a failure message (CI saw a child whose
        outputs had closed stay unreaped for 20 s and then vanish)."""
        try:
            state = next(
                line
                for line in Path(f"/proc/{self.pid}/status").read_text().splitlines()
                if line.startswith("State:")
            )
            wchan = Path(f"/proc/{self.pid}/wchan").read_text()
            where = f"{state}, wchan {wchan or '-'}"
        except (OSError, StopIteration):
            where = "no /proc entry"
        return f"{where}; stdout {self.stdout[-300:]!r}; stderr {self.stderr.decode(errors='replace')!r}"

    def pump(self, timeout: float) -> None:
        """Read whatever arrives within `timeout` seconds."""
        fds = [fd for fd in (self.master, self.stderr_fd) if fd >= 0]
        if not fds:
            time.sleep(timeout)
            return
        ready, _, _ = select.select(fds, [], [], timeout)
        now = time.monotonic()
        for fd in ready:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO: the pty's other side is closed
                data = b""
            if fd == self.master:
                if data:
                    self.chunks.append((now, data))
                else:
                    os.close(self.master)
                    self.master = -1
            elif data:
                self.stderr += data
            else:
                os.close(self.stderr_fd)
                self.stderr_fd = -1

    def wait_for(self, predicate, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            self.pump(0.05)
        return predicate()

    def finish(self, timeout: float) -> int:
        """Drain both outputs until the process exits; its exit code."""
        done = self.wait_for(lambda: not self.alive() and self.master < 0 and self.stderr_fd < 0, timeout)
        if not done:
            where = self.describe()
            self.kill()
            pytest.fail(f"infer did not exit within {timeout} s; {where}")
        assert self.status is not None
        return os.waitstatus_to_exitcode(self.status)

    def kill(self) -> None:
        """SIGKILL the child if it still runs, reap it and close both outputs (safe to call twice)."""
        # a child reaped elsewhere is left alone: its pid may belong to another process by now
        with suppress(ChildProcessError):
            if self.status is None:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if not pid:  # still ours and running: unreaped, its pid cannot be reused
                    os.kill(self.pid, signal.SIGKILL)
                    pid, status = os.waitpid(self.pid, 0)
                self.status = status
        for fd in (self.master, self.stderr_fd):
            if fd >= 0:
                os.close(fd)
        self.master = self.stderr_fd = -1
