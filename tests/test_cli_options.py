"""The shared CLI flags: defined once, grouped in --help, resolved with provenance, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest
import typer
from typer.testing import CliRunner

from infer.cli.help import plain_text
from infer.cli.options import (
    PANEL_ENGINE,
    PANEL_MODEL,
    PANEL_SAMPLING,
    PANEL_SPECULATIVE,
    fail,
    option,
    takes_options,
    with_settings,
)
from infer.cli.profiles_cmd import profiles_app
from infer.engine.sampling import SamplingParamsError
from infer.profiles.settings import SETTINGS, Settings, SettingsError


@pytest.fixture(autouse=True)
def _no_infer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("INFER_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("COLUMNS", "200")


def make_app(seen: list[Settings] | None = None) -> typer.Typer:
    app = typer.Typer()
    app.add_typer(profiles_app, name="profiles")

    @app.command()
    @with_settings
    def gen(prompt: str, settings: Settings, shout: bool = typer.Option(False, "--shout")) -> None:
        """Dummy generate: records the settings it got."""
        if seen is not None:
            seen.append(settings)
        typer.echo(prompt.upper() if shout else prompt)

    @app.command()
    @with_settings
    def bad(settings: Settings, which: str = "sampling") -> None:
        """Raises the errors a command body may raise."""
        if which == "sampling":
            settings.sampling_params(top_p=7.0)
        raise SettingsError("made up problem")

    return app


def invoke(args: list[str], env: dict[str, str] | None = None, seen: list[Settings] | None = None):
    return CliRunner().invoke(make_app(seen), args, env=env)


def assert_one_line_error(result, *parts: str) -> str:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("infer: error: ")
    assert "Traceback" not in result.output
    for part in parts:
        assert part in lines[0], (part, lines[0])
    return lines[0]


def test_flags_reach_the_command_with_flag_provenance() -> None:
    seen: list[Settings] = []
    result = invoke(
        ["gen", "hi", "--top-k", "3", "--temp", "0.25", "-n", "16", "-c", "512", "--shout"], seen=seen
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "HI"
    (settings,) = seen
    assert (settings.top_k, settings.temperature, settings.n_predict, settings.ctx_size) == (3, 0.25, 16, 512)
    assert str(settings.source("top_k")) == "flag --top-k"
    assert settings.source("temperature").detail == "--temp"
    assert settings.source("n_predict").detail == "--n-predict"


def test_flags_not_given_are_not_flag_provenance() -> None:
    seen: list[Settings] = []
    result = invoke(["gen", "hi"], seen=seen)
    assert result.exit_code == 0, result.output
    (settings,) = seen
    kinds = {name: settings.source(name).kind for name in SETTINGS}
    assert "flag" not in kinds.values()
    assert kinds["top_k"] == "profile" and kinds["typical_p"] == "default"


def test_env_then_flag() -> None:
    seen: list[Settings] = []
    invoke(["gen", "hi"], env={"INFER_TOP_K": "5"}, seen=seen)
    invoke(["gen", "hi", "--top-k", "6"], env={"INFER_TOP_K": "5"}, seen=seen)
    assert [(s.top_k, s.source("top_k").kind) for s in seen] == [(5, "env"), (6, "flag")]


@pytest.mark.parametrize(
    "args, name, value",
    [
        (["--temperature", "0.5"], "temperature", 0.5),
        (["--typical", "0.9"], "typical_p", 0.9),
        (["--typical-p", "0.8"], "typical_p", 0.8),
        (["--mirostat-ent", "3"], "mirostat_tau", 3.0),
        (["--mirostat-tau", "4"], "mirostat_tau", 4.0),
        (["--mirostat-lr", "0.2"], "mirostat_eta", 0.2),
        (["--mirostat-eta", "0.3"], "mirostat_eta", 0.3),
        (["-t", "2"], "threads", 2),
        (["-b", "64"], "batch_size", 64),
        (["--seed", "-1"], "seed", None),
        (["--seed", "7"], "seed", 7),
        (["--samplers", "top_k;temperature"], "samplers", ("top_k", "temperature")),
        (
            ["--dry-sequence-breakers", "a", "--dry-sequence-breakers", "b"],
            "dry_sequence_breakers",
            ("a", "b"),
        ),
        (["--strict-backend"], "strict_backend", True),
        (["--backend", "cpu"], "backend", "cpu"),
        (["--spec-method", "prompt_lookup", "--spec-num-tokens", "3"], "spec_num_tokens", 3),
        (["--draft-model", "d.gguf"], "spec_draft_model", "d.gguf"),
        (["-m", "model.gguf"], "model", "model.gguf"),
        (["--profile", "cpu-fast"], "spec_method", "prompt_lookup"),
        (["--spec-method", "prompt_lookup", "--draft-max", "3"], "spec_num_tokens", 3),
        (["--spec-method", "prompt_lookup", "--draft-min", "2"], "spec_draft_min", 2),
        (["--spec-method", "draft_model", "-md", "d.gguf"], "spec_draft_model", "d.gguf"),
        (["--spec-method", "draft_model", "--model-draft", "d.gguf"], "spec_draft_model", "d.gguf"),
        (["--spec-method", "draft_model", "-md", "d.gguf", "--draft-p-min", "0.5"], "spec_p_min", 0.5),
    ],
)
def test_flag_spellings(args: list[str], name: str, value: object) -> None:
    seen: list[Settings] = []
    result = invoke(["gen", "hi", *args], seen=seen)
    assert result.exit_code == 0, result.output
    assert seen[0].value(name) == value


def test_help_groups_every_shared_flag_with_its_description() -> None:
    result = invoke(["gen", "--help"])
    assert result.exit_code == 0, result.output
    text = result.stdout
    for panel in (PANEL_MODEL, PANEL_ENGINE, PANEL_SAMPLING, PANEL_SPECULATIVE):
        assert panel in text
    assert text.index(PANEL_MODEL) < text.index(PANEL_ENGINE) < text.index(PANEL_SAMPLING)
    assert text.index(PANEL_SAMPLING) < text.index(PANEL_SPECULATIVE)
    for spec in SETTINGS.values():
        assert spec.flag in text, spec.flag
        # Help shows descriptions as plain text: Sphinx roles (:data:`X`) become X.
        assert plain_text(spec.description).split(";")[0][:30] in " ".join(text.split()), spec.name
    assert "INFER_TOP_K" in text


@pytest.mark.parametrize(
    "args, env, parts",
    [
        (["gen", "hi"], {"INFER_TOP_K": "abc"}, ["INFER_TOP_K", "must be an integer"]),
        (["gen", "hi", "--top-k", "abc"], {}, ["--top-k", "must be an integer"]),
        (["gen", "hi", "--threads", "-3"], {}, ["--threads", "threads", "greater than or equal to 0"]),
        (["gen", "hi", "--backend", "tpu"], {}, ["--backend", "'cpu', 'cuda', 'metal' or 'remote'"]),
        (["gen", "hi", "--top-p", "2"], {}, ["--top-p", "sampler.top_p", "(0, 1]"]),
        (["gen", "hi", "--profile", "nope"], {}, ["'nope'", "not found", "--profile"]),
        (["gen", "hi"], {"INFER_PROFILE": "./missing.yaml"}, ["missing.yaml", "INFER_PROFILE"]),
        (["bad"], {}, ["top_p"]),
        (["bad", "--which", "settings"], {}, ["made up problem"]),
    ],
)
def test_errors_are_one_line_exit_2(args, env, parts) -> None:
    assert_one_line_error(invoke(args, env=env), *parts)


def test_fail_is_one_line(capsys) -> None:
    with pytest.raises(SystemExit) as info:
        fail("two\nlines", code=3)
    assert info.value.code == 3
    assert capsys.readouterr().err == "infer: error: two lines\n"


def test_decorator_rejects_misuse() -> None:
    with pytest.raises(TypeError, match="settings"):

        @with_settings
        def no_settings(prompt: str) -> None:
            """No settings parameter."""

    with pytest.raises(TypeError, match="top_k"):

        @with_settings
        def clash(settings: Settings, top_k: int = 1) -> None:
            """Clashes with a shared flag."""


def test_sampling_params_error_type_is_mapped() -> None:
    assert issubclass(SamplingParamsError, Exception)  # the type with_settings catches


# --- infer profiles show ---------------------------------------------------------------------


def test_profiles_show_env_and_flag_provenance() -> None:
    result = invoke(["profiles", "show", "cpu", "--temp", "0.3", "--json"], env={"INFER_TOP_K": "5"})
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    rows = document["settings"]
    assert rows["top_k"] == {
        "section": "sampler",
        "value": 5,
        "source": {"kind": "env", "detail": "env INFER_TOP_K"},
    }
    assert rows["temperature"]["source"] == {"kind": "flag", "detail": "--temp"}
    assert rows["top_p"]["source"]["detail"].startswith("profiles/cpu.yaml:")
    assert rows["typical_p"]["source"] == {"kind": "default", "detail": "default"}
    assert document["profile_name"] == "cpu"


def test_profiles_show_table() -> None:
    result = invoke(["profiles", "show", "cuda", "--temp", "0.3"], env={"INFER_TOP_K": "5"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("top_k" in line and "env INFER_TOP_K" in line for line in lines)
    assert any("temperature" in line and "flag --temp" in line for line in lines)
    assert any("backend" in line and "cuda" in line and "profiles/cuda.yaml:" in line for line in lines)


def test_profiles_show_cuda_on_a_machine_without_cuda(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    result = invoke(["profiles", "show", "cuda", "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["settings"]["backend"]["value"] == "cuda"
    choice = document["backend_choice"]
    assert (choice["requested"], choice["selected"]) == ("cuda", "cpu")
    assert "cupy" in choice["reason"]
    strict = invoke(["profiles", "show", "cuda", "--strict-backend"])
    assert_one_line_error(strict, "backend 'cuda'", "--strict-backend", "cupy")


def test_profiles_show_default_and_conflict() -> None:
    result = invoke(["profiles", "show", "--json"], env={"INFER_PROFILE": "metal"})
    assert json.loads(result.stdout)["profile_name"] == "metal"
    conflict = invoke(["profiles", "show", "cuda", "--profile", "metal"])
    assert_one_line_error(conflict, "cuda", "metal")


# --- a command's own options as one dataclass --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LoudOptions:
    """A command's own options (module level: the decorator resolves the annotation by name)."""

    times: int = option(1, "--times", min=1, help="How often.")
    shout: bool = option(False, "--shout", help="Upper case.")


def test_a_command_takes_its_own_options_as_one_dataclass() -> None:
    seen: list[tuple[str, LoudOptions, Settings]] = []
    app = typer.Typer()

    @app.command()
    @with_settings
    @takes_options
    def loud(word: str, settings: Settings, options: LoudOptions) -> None:
        """Records what it got."""
        seen.append((word, options, settings))

    @app.command()
    def other() -> None:
        """A second command, so the first keeps its name."""

    result = CliRunner().invoke(app, ["loud", "hey", "--times", "3", "--shout", "--temp", "0.5"])
    assert result.exit_code == 0, result.output
    ((word, options, settings),) = seen
    assert (word, options) == ("hey", LoudOptions(times=3, shout=True))
    assert settings.temperature == 0.5
    refused = CliRunner().invoke(app, ["loud", "hey", "--times", "0"])
    assert refused.exit_code == 2 and "--times" in refused.output


def test_bench_gate_and_serve_take_their_options_as_dataclasses() -> None:
    import dataclasses

    from infer.cli.bench.options import BenchOptions
    from infer.cli.gate.options import GateOptions
    from infer.cli.serve.app import AppOptions
    from infer.cli.serve.options import ServeOptions

    for options_type in (BenchOptions, GateOptions, ServeOptions, AppOptions):
        assert dataclasses.is_dataclass(options_type)
    # bench's parameters: these and `flags` (--plot added; --server is the shared server_url setting now)
    assert len(dataclasses.fields(BenchOptions)) == 22
    assert BenchOptions().repetitions == 3 and GateOptions().tie_margin == 1e-3
