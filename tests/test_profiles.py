"""Profile files: the shipped ones, `extends:` chains, line numbers, and every validation error."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from infer.cli.options import with_settings
from infer.cli.profiles_cmd import profiles_app
from infer.profiles.loader import (
    PROFILES_DIR,
    ProfileError,
    find_profile,
    load_profile,
    shipped_profiles,
)
from infer.profiles.settings import Settings


@pytest.fixture(autouse=True)
def _no_infer_env(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("INFER_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(text).lstrip("\n"))
    return path


def make_app() -> typer.Typer:
    app = typer.Typer()
    app.add_typer(profiles_app, name="profiles")

    @app.command()
    @with_settings
    def run(settings: Settings) -> None:
        """Print one setting so the command has something to do."""
        typer.echo(f"top_k={settings.top_k}")

    return app


# --- shipped profiles ---------------------------------------------------------------------------


def test_shipped_profiles_all_load() -> None:
    names = [path.stem for path in shipped_profiles()]
    assert {"cpu", "cuda", "metal"} <= set(names)
    for path in shipped_profiles():
        profile = load_profile(path)
        assert profile.description, f"{path.name} needs a description for `infer profiles list`"


def test_cuda_and_metal_profiles() -> None:
    cuda = load_profile("cuda")
    assert cuda.values["backend"].value == "cuda"
    assert cuda.values["dtype"].value == "bfloat16"
    assert cuda.values["max_num_seqs"].value == 256
    metal = load_profile("metal")
    assert metal.values["backend"].value == "metal"
    assert metal.values["dtype"].value == "float16"
    cpu = load_profile("cpu")
    assert cpu.values["backend"].value == "cpu"
    assert cpu.values["dtype"].value == "float32"


def test_line_numbers_point_at_the_key() -> None:
    for path in shipped_profiles():
        profile = load_profile(path)
        for key, set_by in profile.values.items():
            line = set_by.path.read_text().splitlines()[set_by.line - 1]
            assert line.strip().startswith(key.split(".")[-1] + ":"), (key, set_by.location, line)


def test_extends_merges_key_by_key_with_provenance(tmp_path: Path) -> None:
    write(tmp_path, "base.yaml", "threads: 3\nsampler:\n  top_k: 7\n  top_p: 0.5\n")
    child = write(tmp_path, "child.yaml", "extends: ./base.yaml\nsampler:\n  top_k: 9\n")
    profile = load_profile(str(child))
    assert profile.values["sampler.top_k"].value == 9
    assert profile.values["sampler.top_k"].path == child
    assert profile.values["sampler.top_k"].line == 3
    assert profile.values["sampler.top_p"].value == 0.5
    assert profile.values["sampler.top_p"].path == tmp_path / "base.yaml"
    assert profile.values["threads"].line == 1
    assert profile.chain == (child, tmp_path / "base.yaml")


def test_extends_shipped_name(tmp_path: Path) -> None:
    child = write(tmp_path, "mine.yaml", "extends: cuda\nmax_num_seqs: 8\n")
    profile = load_profile(str(child))
    assert profile.values["backend"].value == "cuda"
    assert profile.values["max_num_seqs"].value == 8
    assert profile.chain[-1] == PROFILES_DIR / "cpu.yaml"


def test_find_profile_by_name_and_path(tmp_path: Path) -> None:
    assert find_profile("cpu") == PROFILES_DIR / "cpu.yaml"
    mine = write(tmp_path, "mine.yaml", "threads: 1\n")
    assert find_profile(str(mine)) == mine
    assert find_profile("mine.yaml", relative_to=tmp_path) == mine


# --- validation errors --------------------------------------------------------------------------

# (files, profile to load, substrings the one-line message must contain)
ERROR_CASES = {
    "unknown top-level key": (
        {"p.yaml": "thread: 4\n"},
        "p.yaml",
        ["p.yaml:1", "'thread'", "did you mean 'threads'", "allowed:"],
    ),
    "unknown sampler key": (
        {"p.yaml": "backend: cpu\nsampler:\n  top_kk: 4\n"},
        "p.yaml",
        ["p.yaml:3", "'sampler.top_kk'", "did you mean 'top_k'", "min_p"],
    ),
    "wrong type": (
        {"p.yaml": "sampler:\n  top_k: forty\n"},
        "p.yaml",
        ["p.yaml:2", "sampler.top_k", "valid integer", "'forty'"],
    ),
    "wrong type bool for int": (
        {"p.yaml": "threads: true\n"},
        "p.yaml",
        ["p.yaml:1", "threads", "valid integer"],
    ),
    "backend not in enum": (
        {"p.yaml": "# mine\nbackend: gpu\n"},
        "p.yaml",
        ["p.yaml:2", "backend", "'cpu', 'cuda', 'metal' or 'remote'", "'gpu'"],
    ),
    "threads below 0": (
        {"p.yaml": "threads: -2\n"},
        "p.yaml",
        ["p.yaml:1", "threads", "greater than or equal to 0"],
    ),
    "speculative method": (
        {"p.yaml": "speculative:\n  method: medusa\n"},
        "p.yaml",
        ["p.yaml:2", "speculative.method", "'none', 'prompt_lookup' or 'draft_model'"],
    ),
    "extends cycle": (
        {"a.yaml": "extends: ./b.yaml\n", "b.yaml": "extends: ./a.yaml\n"},
        "a.yaml",
        ["extends", "cycle", "a.yaml -> ", "b.yaml"],
    ),
    "extends itself": (
        {"a.yaml": "extends: ./a.yaml\n"},
        "a.yaml",
        ["extends", "cycle", "a.yaml"],
    ),
    "extends missing": (
        {"a.yaml": "threads: 1\nextends: ./nowhere.yaml\n"},
        "a.yaml",
        ["a.yaml:2", "extends", "nowhere.yaml", "not found"],
    ),
    "missing file": ({}, "absent.yaml", ["absent.yaml", "not found"]),
    "unknown shipped name": ({}, "cdua", ["'cdua'", "did you mean 'cuda'", "cpu", "metal"]),
    "yaml syntax error": (
        {"p.yaml": "threads: 1\nsampler: [top_k: 4\n"},
        "p.yaml",
        ["p.yaml:", "YAML syntax error"],
    ),
    "duplicate key": (
        {"p.yaml": "threads: 1\nthreads: 2\n"},
        "p.yaml",
        ["p.yaml:2", "threads", "duplicate key"],
    ),
    "not a mapping": ({"p.yaml": "- cpu\n- cuda\n"}, "p.yaml", ["p.yaml:1", "mapping"]),
}


def _materialize(tmp_path: Path, files: dict[str, str], ref: str) -> str:
    for name, text in files.items():
        write(tmp_path, name, text)
    return str(tmp_path / ref) if ref.endswith(".yaml") else ref


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_validation_error_message(tmp_path: Path, case: str) -> None:
    files, ref, expected = ERROR_CASES[case]
    with pytest.raises(ProfileError) as info:
        load_profile(_materialize(tmp_path, files, ref))
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, f"{part!r} not in {message!r}"


@pytest.mark.parametrize("case", list(ERROR_CASES))
def test_validation_error_via_cli(tmp_path: Path, case: str) -> None:
    files, ref, expected = ERROR_CASES[case]
    profile = _materialize(tmp_path, files, ref)
    result = CliRunner().invoke(make_app(), ["run", "--profile", profile])
    assert result.exit_code == 2, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("infer: error: ")
    assert "Traceback" not in result.stderr + result.stdout
    for part in expected:
        assert part in lines[0]
    assert "top_k=" not in result.stdout


@pytest.mark.parametrize("case", ["unknown sampler key", "extends cycle", "missing file"])
def test_validation_error_via_profiles_show(tmp_path: Path, case: str) -> None:
    files, ref, expected = ERROR_CASES[case]
    profile = _materialize(tmp_path, files, ref)
    result = CliRunner().invoke(make_app(), ["profiles", "show", profile])
    assert result.exit_code == 2
    assert len(result.stderr.splitlines()) == 1
    assert expected[0] in result.stderr


def test_empty_profile_and_empty_section_are_fine(tmp_path: Path) -> None:
    assert load_profile(str(write(tmp_path, "e.yaml", "# nothing\n"))).values == {}
    profile = load_profile(str(write(tmp_path, "s.yaml", "sampler:\nthreads: 2\n")))
    assert set(profile.values) == {"threads"}


# --- infer profiles list ------------------------------------------------------------------------


def test_profiles_list_json() -> None:
    import json

    result = CliRunner().invoke(make_app(), ["profiles", "list", "--json"])
    assert result.exit_code == 0, result.output
    rows = {row["name"]: row for row in json.loads(result.stdout)}
    assert rows["cuda"]["backend"] == "cuda"
    assert rows["metal"]["backend"] == "metal"
    assert rows["cpu"]["backend"] == "cpu"
    assert rows["cpu"]["description"]
    assert Path(rows["cpu"]["path"]) == PROFILES_DIR / "cpu.yaml"


def test_profiles_list_table() -> None:
    result = CliRunner().invoke(make_app(), ["profiles", "list"], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("cpu", "cuda", "metal"):
        assert f"profiles/{name}.yaml" in result.stdout
