"""What a person at a terminal sees (pseudo-terminal tests): `generate` streams by default with a loading
line first, Ctrl-C keeps the text and exits 130, `--no-stream` buffers, and `infer chat` edits lines,
keeps history, forgets on /clear, helps on /help and /?, and leaves on /exit."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pty_terminal import Terminal

pytest_plugins = ["conftest_synthetic"]

STATS = re.compile(
    r"infer: (\d+) tokens, prompt (\d+), TTFT [\d.]+ s, [\d.]+ tok/s decode, finish (\w+), seed \d+"
)
COUNT = ["Count from one to two hundred, in words:", "--temp", "0", "-n", "200", "--ignore-eos", "-c", "256"]


def _finish(term: Terminal, timeout: float = 60) -> int:
    try:
        return term.finish(timeout=timeout)
    finally:
        term.kill()


def test_generate_shows_a_loading_line_then_the_text(tiny_gguf: Path) -> None:
    """stderr on the terminal too: the transient loading line comes before the text."""
    term = Terminal.spawn(
        ["generate", "hello the world", "--raw", "--temp", "0", "-n", "8", "--ignore-eos", "-t", "1",
         "-m", str(tiny_gguf)],
        stderr_on_pty=True,
    )  # fmt: skip
    code = _finish(term)
    out = term.stdout
    assert code == 0, out
    assert f"loading {tiny_gguf.stem}" in out, out
    assert "Traceback" not in out


def test_generate_piped_stays_plain(tiny_gguf: Path, tmp_path: Path) -> None:
    """stdout to a file: no status line and no escape codes in the text."""
    import subprocess
    import sys

    from pty_terminal import ENTRY

    args = ["generate", "hello the world", "--raw", "--temp", "0", "-n", "8", "--ignore-eos", "-t", "1"]
    result = subprocess.run(
        [sys.executable, "-c", ENTRY, *args, "-m", str(tiny_gguf)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert "\x1b" not in result.stdout and "\x1b" not in result.stderr
    assert "loading" not in result.stderr and result.stdout.endswith("\n") and result.stdout.strip()


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "no-stream"])
def test_generate_ctrl_c_prints_the_text_so_far_and_exits_130(default_model_path: Path, stream: bool) -> None:
    # -v: the "loaded" line tells the buffered run when decoding starts; 2,000 tokens outlast the wait
    # on an idle machine (200 took under 3 s)
    long_count = [*COUNT[:3], "-n", "2000", "--ignore-eos", "-c", "2100"]
    args = ["generate", *long_count, "-v", "-m", str(default_model_path)]
    args += [] if stream else ["--no-stream"]
    term = Terminal.spawn(args)
    try:
        if stream:  # text arrives in several reads while the process still runs
            assert term.wait_for(lambda: len([c for c in term.chunks if c[1].strip()]) >= 3, timeout=60), (
                term.stderr.decode()
            )
            assert term.alive()
        else:  # nothing until the end: wait until the model is loaded and decoding under way
            assert term.wait_for(lambda: b"infer: loaded" in term.stderr, timeout=60), term.stderr.decode()
            assert term.wait_for(lambda: False, timeout=1) is False
            assert not term.stdout.strip() and term.alive()
        term.type("\x03")  # Ctrl-C, typed at the terminal
        code = term.finish(timeout=30)
    finally:
        term.kill()
    stderr = term.stderr.decode("utf-8", errors="replace")
    assert code == 130, stderr
    assert "Traceback" not in stderr
    stats = [m for m in map(STATS.match, stderr.splitlines()) if m]
    assert len(stats) == 1 and stats[0].group(3) == "cancelled", stderr
    assert 1 <= int(stats[0].group(1)) < 2000
    assert "one" in term.stdout.lower(), term.stdout  # the partial text is printed, streamed or not


def reading_keys(output: str) -> bool:
    """A prompt is reading keys in raw mode now: prompt_toolkit turns bracketed paste on
    (ESC[?2004h) as each prompt starts and off (ESC[?2004l) as it ends."""
    return output.rfind("\x1b[?2004h") > output.rfind("\x1b[?2004l")


def test_chat_line_editing_history_clear_and_exit(tiny_gguf: Path, tmp_path: Path) -> None:
    term = Terminal.spawn(
        ["chat", "-m", str(tiny_gguf), "--temp", "0", "-n", "4", "-t", "1"],
        env={"INFER_HOME": str(tmp_path), "PROMPT_TOOLKIT_NO_CPR": "1"},
    )
    try:

        def stats() -> list[re.Match]:
            text = term.stderr.decode("utf-8", errors="replace")
            return [m for m in map(STATS.match, text.splitlines()) if m]

        assert term.wait_for(lambda: ">>>" in term.stdout, timeout=60), term.stderr.decode()
        term.type("helo\x1b[Dl\r")  # a typo mended with the left arrow: "hello"
        assert term.wait_for(lambda: len(stats()) == 1, timeout=30), term.stderr.decode()
        first_prompt = int(stats()[0].group(2))
        term.type("hi again\r")
        assert term.wait_for(lambda: len(stats()) == 2, timeout=30), term.stderr.decode()
        assert int(stats()[1].group(2)) > first_prompt  # the conversation so far is in the prompt
        term.type("/clear\r")
        assert term.wait_for(lambda: b"conversation cleared" in term.stderr, timeout=30)
        # Type the arrows only once the next prompt has put the terminal in raw mode: before that
        # it is still in cooked mode and would echo them as ^[[A. (Counting ">>>" is not enough:
        # the line being submitted is redrawn with its ">>>" too.)
        assert term.wait_for(lambda: reading_keys(term.stdout), timeout=30)
        term.type("\x1b[A\x1b[A\x1b[A\r")  # up three times: "hello" from the history
        assert term.wait_for(lambda: len(stats()) == 3, timeout=30), term.stderr.decode()
        assert int(stats()[2].group(2)) == first_prompt  # /clear forgot the conversation
        for count, word in ((2, "/help"), (3, "/?")):  # ollama's habits; the help was printed once at start
            assert term.wait_for(lambda: reading_keys(term.stdout), timeout=30)
            term.type(f"{word}\r")
            assert term.wait_for(lambda n=count: term.stderr.count(b"/help shows this") == n, timeout=30)
        assert b"unknown command" not in term.stderr
        term.type("/exit\r")
        code = term.finish(timeout=30)
    finally:
        term.kill()
    assert code == 0, term.stderr.decode()
    assert "^[[" not in term.stdout  # arrow keys edit the line instead of printing escapes
    assert "hello" in (tmp_path / "chat_history").read_text()
