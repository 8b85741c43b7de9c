"""Run the `infer` CLI in a fresh process, as a user's shell would (exit codes, stderr, hash stability)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

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
