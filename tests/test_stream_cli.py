"""`infer stream` at a real terminal: a pseudo-terminal as its controlling tty, stderr on a pipe.

Proves that text reaches the terminal while generation is still running (timestamps of the reads,
and the process still alive at the time), and that Ctrl-C typed at the terminal stops it cleanly:
exit code 130, the stats line on stderr, no traceback.
"""

from __future__ import annotations

import os
import pty
import re
import select
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

pytest_plugins = ["conftest_synthetic"]

ENTRY = "import sys; from infer.cli.main import main; sys.argv[0] = 'infer'; main()"
STATS = re.compile(
    r"^infer: (\d+) tokens, prompt \d+, TTFT [\d.]+ s, [\d.]+ tok/s decode, finish (\w+), seed \d+"
)


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
    def spawn(cls, args: list[str]) -> Terminal:
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
        env["TERM"] = "xterm"
        read_err, write_err = os.pipe()
        pid, master = pty.fork()
        if pid == 0:  # child: only async-signal-safe work before exec
            try:
                os.dup2(write_err, 2)
                os.execve(sys.executable, [sys.executable, "-c", ENTRY, *args], env)
            finally:
                os._exit(127)
        os.close(write_err)
        return cls(pid, master, read_err)

    @property
    def stdout(self) -> str:
        return b"".join(chunk for _, chunk in self.chunks).decode("utf-8", errors="replace")

    def alive(self) -> bool:
        if self.status is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.status, self.exited_at = status, time.monotonic()
        return self.status is None

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
            self.kill()
            pytest.fail(f"infer did not exit within {timeout} s; stderr: {self.stderr.decode()}")
        assert self.status is not None
        return os.waitstatus_to_exitcode(self.status)

    def kill(self) -> None:
        if self.alive():
            os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        for fd in (self.master, self.stderr_fd):
            if fd >= 0:
                os.close(fd)
        self.master = self.stderr_fd = -1


def stats_lines(stderr: str) -> list[re.Match]:
    return [m for m in (STATS.match(line) for line in stderr.splitlines()) if m]


@pytest.mark.real_model
def test_stream_prints_while_generating_and_ctrl_c_exits_130(default_model_path: Path) -> None:
    term = Terminal.spawn(
        ["stream", "Count from one to two hundred, in words:", "--temp", "0", "-n", "200", "--ignore-eos",
         "-c", "256", "-m", str(default_model_path)]
    )  # fmt: skip
    try:
        # Several separate reads of text, each while the process is still generating.
        def streamed() -> bool:
            return len([c for c in term.chunks if c[1].strip()]) >= 3

        assert term.wait_for(streamed, timeout=45), (
            f"no streamed text within 45 s; stdout {term.stdout!r}, stderr {term.stderr.decode()!r}"
        )
        first_text_at = next(t for t, chunk in term.chunks if chunk.strip())
        assert term.alive(), "the text only arrived when the process had finished"
        text_before_interrupt = term.stdout
        times = [t for t, chunk in term.chunks if chunk.strip()]
        assert times[-1] > times[0], times

        os.write(term.master, b"\x03")  # Ctrl-C, typed at the terminal
        interrupted_at = time.monotonic()
        code = term.finish(timeout=20)
    finally:
        term.kill()

    stderr = term.stderr.decode("utf-8", errors="replace")
    assert code == 130, f"exit code {code}; stderr: {stderr}"
    assert "Traceback" not in stderr and "Traceback" not in term.stdout, stderr
    stats = stats_lines(stderr)
    assert len(stats) == 1, stderr
    tokens, finish = int(stats[0].group(1)), stats[0].group(2)
    assert finish == "cancelled"
    assert 1 <= tokens < 200
    assert term.exited_at is not None and first_text_at < interrupted_at <= term.exited_at
    assert text_before_interrupt.strip()


def test_stream_to_the_end_prints_text_and_stats(tiny_gguf: Path) -> None:
    """Without Ctrl-C: the text on stdout, then one stats line on stderr, exit 0."""
    term = Terminal.spawn(
        ["stream", "hello the world", "--raw", "--temp", "0", "-n", "8", "--ignore-eos", "-t", "1",
         "-m", str(tiny_gguf)]
    )  # fmt: skip
    try:
        code = term.finish(timeout=30)
    finally:
        term.kill()
    stderr = term.stderr.decode("utf-8", errors="replace")
    assert code == 0, stderr
    stats = stats_lines(stderr)
    assert len(stats) == 1 and stats[0].group(1) == "8" and stats[0].group(2) == "length", stderr
    assert "Traceback" not in stderr
    assert term.stdout.endswith("\r\n"), repr(term.stdout)
