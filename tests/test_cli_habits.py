"""CLI habits of llama.cpp, ollama and mlx-lm, and nothing silently ignored: -p/-f/--system, a bounded
default n_predict, warnings for unknown INFER_* variables, errors for contradictory flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infer.cli.env_check import unknown_variable_warnings
from infer.cli.main import app
from infer.profiles.settings import SettingsError, resolve_settings

pytest_plugins = ["conftest_synthetic"]

PROMPT = "hello the world is"


@pytest.fixture(scope="module")
def gen(tiny_gguf: Path) -> tuple[str, ...]:
    return ("generate", "-m", str(tiny_gguf), "-t", "1", "-n", "6", "--temp", "0", "--json")


def invoke(*args: str, env: dict[str, str] | None = None, stdin: str | None = None):
    result = CliRunner().invoke(app, list(args), input=stdin, env={"INFER_PROFILE": None, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result


def one_line_error(result, *parts: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.exit_code == 2, (result.exit_code, result.stderr)
    assert len(lines) == 1 and lines[0].startswith("infer: error:"), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_prompt_option_and_file_match_the_argument(gen: tuple[str, ...], tmp_path: Path) -> None:
    by_argument = json.loads(invoke(*gen, "--raw", PROMPT).stdout)
    by_option = json.loads(invoke(*gen, "--raw", "-p", PROMPT).stdout)
    (tmp_path / "prompt.txt").write_text(PROMPT)
    by_file = json.loads(invoke(*gen, "--raw", "-f", str(tmp_path / "prompt.txt")).stdout)
    by_stdin_file = json.loads(invoke(*gen, "--raw", "-f", "-", stdin=PROMPT).stdout)
    for other in (by_option, by_file, by_stdin_file):
        assert other["prompt_ids"] == by_argument["prompt_ids"]
        assert other["token_ids"] == by_argument["token_ids"]


def test_system_message_goes_into_the_chat_prompt(gen: tuple[str, ...], tmp_path: Path) -> None:
    plain = json.loads(invoke(*gen, "--chat", PROMPT).stdout)
    system = json.loads(invoke(*gen, "--system", "be brief", PROMPT).stdout)
    messages = tmp_path / "m.json"
    messages.write_text(
        json.dumps([{"role": "system", "content": "be brief"}, {"role": "user", "content": PROMPT}])
    )
    explicit = json.loads(invoke(*gen, "--messages", str(messages)).stdout)
    assert system["prompt_ids"] == explicit["prompt_ids"] != plain["prompt_ids"]


@pytest.mark.parametrize(
    "args, stdin, parts",
    [
        (("--stream", PROMPT), None, ["--json and --stream"]),
        (("-p", PROMPT, PROMPT), None, ["PROMPT and -p"]),
        (("-p", PROMPT, "-f", "x.txt"), None, ["-p and -f"]),
        (("--system", "s", "--raw", PROMPT), None, ["--system", "--raw"]),
        (("-i",), None, ["--interactive and --json"]),
        (("-f", "/nonexistent/prompt.txt"), None, ["/nonexistent/prompt.txt", "cannot read"]),
        (("-n", "0", PROMPT), None, ["n_predict", "-1 for no limit"]),
        (("--dtype", "float16", PROMPT), None, ["float32 only"]),
        (("--spec-ngram-max", "4", PROMPT), None, ["--spec-ngram-max", "not used by"]),
    ],
)
def test_contradictions_and_unhonoured_settings_are_errors(gen, args, stdin, parts) -> None:
    one_line_error(invoke(*gen, *args, stdin=stdin), *parts)


def test_interactive_with_a_prompt_or_unused_flags_is_an_error(tiny_gguf: Path) -> None:
    one_line_error(invoke("generate", "-m", str(tiny_gguf), "-i", PROMPT), "--interactive", "drop the PROMPT")
    result = invoke("generate", "-m", str(tiny_gguf), "-i", "--raw", "--ignore-eos")
    one_line_error(result, "--interactive does not take --raw, --ignore-eos")


def test_messages_with_system_is_an_error(gen: tuple[str, ...], tmp_path: Path) -> None:
    (tmp_path / "m.json").write_text('[{"role": "user", "content": "hi"}]')
    one_line_error(invoke(*gen, "--messages", str(tmp_path / "m.json"), "--system", "s"), "--messages")


def test_unknown_infer_variable_warns_with_the_closest_name(gen: tuple[str, ...]) -> None:
    result = invoke(*gen, "--raw", PROMPT, env={"INFER_TEMP": "abc", "INFER_TOPK": "3"})
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "warning" in line]
    assert warnings == [
        "infer: warning: INFER_TEMP is not a setting and is ignored; did you mean INFER_TEMPERATURE?",
        "infer: warning: INFER_TOPK is not a setting and is ignored; did you mean INFER_TOP_K?",
    ]


def test_known_and_other_variables_do_not_warn() -> None:
    env = {
        "INFER_TEMPERATURE": "0",
        "INFER_HOME": "/x",
        "INFER_API_KEY": "k",
        "PATH": "/bin",
        "LLAMA_ARG_X": "1",
    }
    assert unknown_variable_warnings(env) == []
    assert unknown_variable_warnings({"INFER_NONSENSE_XYZ": "1"}) == [
        "infer: warning: INFER_NONSENSE_XYZ is not a setting and is ignored"
    ]


def test_n_predict_is_bounded_by_default_and_minus_one_means_no_limit() -> None:
    settings = resolve_settings({}, env={})
    assert settings.n_predict == 512
    assert resolve_settings({"n_predict": "-1"}, env={}).n_predict == -1
    with pytest.raises(SettingsError, match="0 generates nothing"):
        resolve_settings({"n_predict": "0"}, env={})


def test_verbose_prints_the_load_time_and_stats(gen: tuple[str, ...]) -> None:
    result = invoke(*gen[:-1], "--raw", "-v", PROMPT)
    assert result.exit_code == 0, result.stderr
    assert "infer: loaded model in" in result.stderr and "tokens, prompt" in result.stderr
    quiet = invoke(*gen[:-1], "--raw", PROMPT)
    assert quiet.stderr == ""


def test_threads_reach_the_engines_step_thread(tiny_gguf: Path) -> None:
    """numba keeps its thread count per thread: `-t 1` must hold in the background step thread that
    generate, stream, chat and serve use, not only in the main thread."""
    import threading

    import numba

    from infer.cli.options import resolve_or_fail
    from infer.cli.runtime import open_engine

    engine = open_engine(resolve_or_fail({"threads": "1", "model": str(tiny_gguf)}, env={}))
    seen: list[int] = []
    ran = threading.Event()
    step = engine.step

    def counting_step() -> bool:
        seen.append(numba.get_num_threads())
        ran.set()
        return step()

    engine.step = counting_step  # type: ignore[method-assign]
    engine.start()
    try:
        assert ran.wait(30)
    finally:
        engine.shutdown()
    assert numba.config.NUMBA_NUM_THREADS == 1 or set(seen) == {1}


def test_kernel_threads_spin_briefly_unless_the_user_chose(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bounded spin (ACTIVE with GOMP_SPINCOUNT) by default; a policy the user set is left alone."""
    import os

    from infer.engine.backends.cpu_setup import idle_threads_sleep

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    idle_threads_sleep()
    assert (os.environ["OMP_WAIT_POLICY"], os.environ["GOMP_SPINCOUNT"]) == ("ACTIVE", "20000")
    monkeypatch.setenv("OMP_WAIT_POLICY", "PASSIVE")
    monkeypatch.delenv("GOMP_SPINCOUNT")
    idle_threads_sleep()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE" and "GOMP_SPINCOUNT" not in os.environ


def test_the_kernel_process_skips_numbas_blas_probe_and_still_runs_kernels(tmp_path) -> None:
    """prepare_process keeps numba from importing scipy.linalg to probe for BLAS (no kernel calls
    BLAS); the kernels still load and run. A process that loaded scipy.linalg first keeps it."""
    import subprocess
    import sys

    script = """
import sys
from pathlib import Path
pre = sys.argv[1] == "scipy-first"
if pre:
    import scipy.linalg
from infer.engine import BackendOptions, prepare_process
prepare_process(BackendOptions("cpu", kernels="int8"), Path(sys.argv[2]))
import numpy as np
from infer.engine.backends.cpu_kernels import rowops
import numba.np.arraymath as arraymath
x = np.ones((2, 64), np.float32)
out = np.empty_like(x)
rowops.rms_norm_rows(x, np.ones(64, np.float32), np.float32(1e-6), out)
print(arraymath._HAVE_BLAS, "scipy.linalg" in sys.modules, float(out[0, 0]))
"""
    results = []
    for mode in ("plain", "scipy-first"):
        done = subprocess.run(
            [sys.executable, "-c", script, mode, str(tmp_path)], capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr
        results.append(done.stdout.split())
    assert results[0][:2] == ["False", "False"] and float(results[0][2]) == pytest.approx(1.0, abs=1e-3)
    assert results[1][:2] == ["True", "True"]


@pytest.mark.parametrize(
    ("typed", "meant"),
    [("genrate", "generate"), ("run", "generate"), ("pull", "models pull"), ("list", "models list")],
)
def test_an_unknown_command_says_which_one_was_meant(typed: str, meant: str) -> None:
    result = invoke(typed, "x")
    assert result.exit_code == 2
    assert f"No such command '{typed}'. Did you mean 'infer {meant}'?" in result.stderr


def test_a_command_nothing_resembles_gets_no_guess() -> None:
    result = invoke("zzzz")
    assert result.exit_code == 2 and "No such command 'zzzz'." in result.stderr
    assert "Did you mean" not in result.stderr


def test_max_tokens_is_n_predict_as_openai_and_mlx_lm_spell_it(gen: tuple[str, ...]) -> None:
    by_n = json.loads(invoke(*gen, "--raw", "--ignore-eos", PROMPT).stdout)
    spelled = [("--max-tokens" if arg == "-n" else arg) for arg in gen]
    result = invoke(*spelled, "--raw", "--ignore-eos", PROMPT)
    assert result.exit_code == 0, result.stderr
    by_max = json.loads(result.stdout)
    assert by_max["token_ids"] == by_n["token_ids"] and len(by_max["token_ids"]) == 6


def test_chat_caches_prefixes_unless_the_user_says_otherwise() -> None:
    """Each chat turn's prompt starts with the conversation so far: infer chat turns prefix caching
    on by default (same tokens, tests/test_prefix_cache.py); a flag or variable still decides."""
    from infer.cli.chat import chat_prefix_caching

    assert chat_prefix_caching(resolve_settings({}, env={})) is True
    assert chat_prefix_caching(resolve_settings({"prefix_caching": "false"}, env={})) is False
    assert chat_prefix_caching(resolve_settings({}, env={"INFER_PREFIX_CACHING": "false"})) is False


def test_a_fixed_thread_count_on_busy_cores_is_warned_about() -> None:
    """-t N beyond the cores other processes leave free: one warning naming the load and what the
    adaptive default would use; none when it fits, for one thread, or for the adaptive default."""
    from infer.engine.backends.base import BackendOptions
    from infer.engine.backends.cpu_setup import threads_warning
    from infer.engine.backends.cpu_threads import usable_cpus

    cores = len(usable_cpus() or ()) or 2
    busy = threads_warning(BackendOptions("cpu", "float32", "exact", cores), others=float(cores - 1))
    assert busy is not None and f"-t {cores}" in busy and "would use 1" in busy
    assert threads_warning(BackendOptions("cpu", "float32", "exact", cores), others=0.0) is None
    assert threads_warning(BackendOptions("cpu", "float32", "exact", 1), others=float(cores)) is None
    assert threads_warning(BackendOptions("cpu", "float32", "exact", 0), others=float(cores)) is None
