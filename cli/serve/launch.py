"""Start `infer serve` as a child process and wait until it listens (for benchmarks and tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence

_LISTENING = re.compile(r"listening on (http://\S+)")


class ServerProcess:
    """A running `infer serve` child: its base URL, its stderr so far, and a graceful stop."""

    def __init__(self, popen: subprocess.Popen[str]) -> None:
        self.popen = popen
        self.url: str | None = None
        self.stderr_lines: list[str] = []
        self.startup_seconds = 0.0
        """From spawning to listening (model load included)."""
        self._ready = threading.Event()
        # Drain stderr for the whole life of the process: a full pipe would block the server.
        self._reader = threading.Thread(target=self._read, name="infer-serve-stderr", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stderr is not None
        for line in self.popen.stderr:
            self.stderr_lines.append(line.rstrip("\n"))
            match = _LISTENING.search(line)
            if match and self.url is None:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended; wait_ready() reports it

    @property
    def stderr(self) -> str:
        """Everything the server wrote to stderr so far."""
        return "\n".join(self.stderr_lines)

    def wait_ready(self, timeout: float) -> str:
        """The base URL once the server listens; RuntimeError if it exits or takes too long."""
        if not self._ready.wait(timeout) or self.url is None:
            self.stop(timeout=5)
            raise RuntimeError(f"infer serve did not start within {timeout:.0f} s:\n{self.stderr}")
        return self.url

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60.0) -> int:
        """Send `sig`, wait for the exit status (kill after `timeout`)."""
        if self.popen.poll() is None:
            self.popen.send_signal(sig)
            try:
                self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(timeout=5)
        return self.popen.returncode


def start_server(
    args: Sequence[str], *, timeout: float = 180.0, env: Mapping[str, str] | None = None
) -> ServerProcess:
    """Run `infer serve --host 127.0.0.1 --port 0 ARGS...` and wait until it listens.

    The server picks a free port itself and prints it; the returned process knows its `url`.
    """
    command = [
        sys.executable,
        "-c",
        "from infer.cli.main import main; main()",
        "serve",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        *args,
    ]
    popen = subprocess.Popen(
        command,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    server = ServerProcess(popen)
    started = time.monotonic()
    server.wait_ready(timeout)
    server.startup_seconds = time.monotonic() - started
    return server
