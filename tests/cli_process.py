"""Run the `infer` CLI in a fresh process, as a user's shell would (exit codes, stderr, hash stability)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from infer.cli.serve.launch import ServerProcess, start_server

ROOT = Path(__file__).resolve().parents[1]
"""The repository root (the CLI runs from there)."""


def infer_cli(
    *args: str, timeout: float = 300, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `infer ARGS` in a new Python process with a wide terminal; `env` adds variables."""
    return subprocess.run(
        [sys.executable, "-c", "from infer.cli.main import main; main()", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
    )


@contextmanager
def running_server(args: Sequence[str]) -> Iterator[ServerProcess]:
    """`infer serve ARGS` for the block; afterwards it must stop on SIGTERM with status 0 and no traceback."""
    process = start_server(args)
    yield process
    assert process.stop() == 0, process.stderr
    assert "Traceback" not in process.stderr, process.stderr
