"""`infer stream` at a real terminal: a pseudo-terminal as its controlling tty, stderr on a pipe.

Proves that text reaches the terminal while generation is still running (timestamps of the reads,
and the process still alive at the time), and that Ctrl-C typed at the terminal stops it cleanly:
exit code 130, the stats line on stderr, no traceback.
"""

from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from pty_terminal import Terminal

pytest_plugins = ["conftest_synthetic"]

STATS = re.compile(
    r"^infer: (\d+) tokens, prompt \d+, TTFT [\d.]+ s, [\d.]+ tok/s decode, finish (\w+), seed \d+"
)


def stats_lines(stderr: str) -> list[re.Match]:
    return [m for m in (STATS.match(line) for line in stderr.splitlines()) if m]


@pytest.mark.real_model
def test_stream_prints_while_generating_and_ctrl_c_exits_130(default_model_path: Path) -> None:
    term = Terminal.spawn(
        ["stream", "Count from one to two hundred, in words:", "--temp", "0", "-n", "2000",
         "--ignore-eos", "-c", "2100", "-m", str(default_model_path)]
    )  # fmt: skip
    try:
        # Several separate reads of text, each while the process is still generating (2,000 tokens:
        # at 200 a fast run could end between the check that it is alive and the Ctrl-C).
        def streamed() -> bool:
            return len([c for c in term.chunks if c[1].strip()]) >= 3

        # 300 s: in a fresh clone this process may compile the CPU kernels first, which took over 45 s
        # on a slow 2-core Zen 3 VM beside the other xdist worker; the wait ends at the third chunk
        assert term.wait_for(streamed, timeout=300), (
            f"no streamed text within 300 s; stdout {term.stdout!r}, stderr {term.stderr.decode()!r}"
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
    assert 1 <= tokens < 2000
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
