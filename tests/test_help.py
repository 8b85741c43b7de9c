"""Help that reads well at 80 columns, a fast `infer --help`, `--version`, `-h` and shell completion."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import typer
from typer.testing import CliRunner

from infer.cli.main import COMMANDS, app

COMMAND_PATHS = [
    ["generate"], ["chat"], ["stream"], ["serve"], ["bench"], ["gate"],
    ["models"], ["models", "pull"], ["models", "list"], ["models", "rm"],
    ["profiles"], ["profiles", "list"], ["profiles", "show"],
]  # fmt: skip
HEAVY = ("numpy", "fastapi", "uvicorn", "numba", "infer.engine", "infer.profiles", "rich.progress")


def _help(path: list[str]) -> str:
    result = CliRunner().invoke(app, [*path, "-h"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.mark.parametrize("path", COMMAND_PATHS, ids=" ".join)
def test_help_fits_80_columns_with_every_option_whole(path: list[str]) -> None:
    text = _help(path)
    long_lines = [line for line in text.splitlines() if len(line) > 80]
    assert not long_lines, long_lines
    for leak in (":func:", ":data:", ":class:", "``", "<bool>", "<str>", "<int>", "…"):
        assert leak not in text, (leak, text)
    # Every option appears whole: click's formatter wraps help text but never cuts a name.
    command = typer.main.get_command(app)
    context = command.make_context("infer", ["-h"], resilient_parsing=True)
    for name in path:
        command = command.get_command(context, name)
    for param in command.params:
        for opt in (*param.opts, *param.secondary_opts):
            if opt.startswith("-"):
                assert opt in text, (opt, text)
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.stdout == text  # -h and --help are the same


def test_brackets_and_option_names_survive() -> None:
    text = _help(["generate"])
    assert "--max-batched-tokens" in text and "--dry-sequence-breakers" in text
    # Rich markup once ate "[...]" ranges; the help is plain text now.
    assert "[" in text.split("--dynatemp-range", 1)[1].split("--", 1)[0]
    assert "Examples:" in text and "infer generate -p" in text


@pytest.mark.parametrize("name", [n for n, spec in COMMANDS.items() if spec.epilog])
def test_each_command_ends_with_examples(name: str) -> None:
    text = _help([name])
    assert "infer " in text.rstrip().splitlines()[-1], text
    assert "Examples:" in text


def test_root_help_lists_commands_without_importing_them() -> None:
    code = (
        "import sys; from infer.cli.main import main; sys.argv = ['infer', '--help']\n"
        "try:\n    main()\nexcept SystemExit:\n    pass\n"
        f"print('LOADED', sorted(m for m in sys.modules if m.startswith({HEAVY!r})))"
    )
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    elapsed = time.perf_counter() - started
    assert result.returncode == 0, result.stderr
    assert "LOADED []" in result.stdout, result.stdout.splitlines()[-1]
    for name in COMMANDS:
        assert f"  {name} " in result.stdout
    assert elapsed < 5  # about 0.15 s on a quiet machine; the assertion above is the real check


def test_version_and_short_help() -> None:
    result = CliRunner().invoke(app, ["--version"])
    assert result.exit_code == 0 and result.stdout.startswith("infer ")
    assert CliRunner().invoke(app, ["-h"]).stdout == CliRunner().invoke(app, ["--help"]).stdout


def test_shell_completion_completes_commands_and_flags() -> None:
    def complete(words: str, cword: int) -> list[str]:
        env = {
            **os.environ,
            "_INFER_COMPLETE": "complete_bash",
            "COMP_WORDS": words,
            "COMP_CWORD": str(cword),
        }
        code = "import sys; from infer.cli.main import main; sys.argv = ['infer']; main()"
        result = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
        )
        return result.stdout.split()

    assert complete("infer gen", 1) == ["generate"]
    assert {"--top-k", "--top-p"} <= set(complete("infer generate --top", 2))
    assert "--install-completion" in _help([])


@pytest.mark.parametrize("command", ["generate", "stream"])
def test_what_to_generate_and_how_to_sample_come_first(command: str) -> None:
    """-n and the sampling flags within the first screenful (they were at lines 94 and 117 of 249),
    before the model, engine and speculative panels."""
    lines = _help([command]).splitlines()
    first = {
        name: next(i for i, line in enumerate(lines) if line.lstrip().startswith(name))
        for name in ("-n,", "--temp")
    }
    assert max(first.values()) < 50, first
    panels = [line for line in lines if line and not line.startswith(" ") and line.endswith(":")]
    assert panels.index("Sampling:") < panels.index("Model & profile:") < panels.index("Engine:"), panels
