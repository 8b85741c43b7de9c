"""Output constraints on the command line (`--json-schema`, `--json-object`, `--regex`, `--grammar`,
`--choice`), their env twins and profile keys, on the tiny synthetic model through the Typer app.

A bad constraint is one line on stderr and exit 2 naming the flag, before any model is loaded.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infer.cli.main import app
from infer.engine.grammar import GrammarSpec
from infer.profiles.constraints import grammar_from_settings
from infer.profiles.settings import SettingsError, resolve_settings

pytest_plugins = ["conftest_synthetic"]

SCHEMA = {
    "type": "object",
    "properties": {"word": {"enum": ["sea", "world"]}, "n": {"type": "integer", "minimum": 0, "maximum": 9}},
    "required": ["word", "n"],
    "additionalProperties": False,
}


def invoke(*args: str, env: dict[str, str | None] | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(app, list(args), env={"INFER_PROFILE": None, **(env or {})})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def gen(tiny_gguf: Path) -> tuple[str, ...]:
    return ("generate", "-m", str(tiny_gguf), "-t", "1", "-n", "40", "--raw", "--json")


@pytest.mark.parametrize("temp", ["0", "1.0"])
def test_json_schema_flag_inline_and_file(gen: tuple[str, ...], tmp_path: Path, temp: str) -> None:
    path = tmp_path / "schema.json"
    path.write_text(json.dumps(SCHEMA))
    outputs = []
    for value in (json.dumps(SCHEMA), str(path)):
        code, out, err = invoke(*gen, "--temp", temp, "--seed", "3", "--json-schema", value, "hello the")
        assert code == 0, err
        result = json.loads(out)
        assert result["finish_reason"] == "stop"
        doc = json.loads(result["text"])
        assert doc["word"] in ("sea", "world") and 0 <= doc["n"] <= 9
        outputs.append(result["token_ids"])
    assert outputs[0] == outputs[1]


def test_regex_choice_grammar_and_json_object(gen: tuple[str, ...], tmp_path: Path) -> None:
    lark = tmp_path / "g.lark"
    lark.write_text('start: "the " WORD\nWORD: /(sea|world)/\n')
    gbnf = tmp_path / "g.gbnf"
    gbnf.write_text('root ::= "is " ("it" | "the")\n')
    checks = {
        ("--regex", "(the|sea)( (the|sea)){1,3}"): lambda t: re.fullmatch("(the|sea)( (the|sea)){1,3}", t),
        ("--choice", "sea,hello world,is it"): lambda t: t in ("sea", "hello world", "is it"),
        ("--choice", '["a,b", "c"]'): lambda t: t in ("a,b", "c"),
        ("--grammar", str(lark)): lambda t: t in ("the sea", "the world"),
        ("--grammar", str(gbnf)): lambda t: t in ("is it", "is the"),
        ("--json-object",): lambda t: isinstance(json.loads(t), dict),
    }
    for flags, check in checks.items():
        code, out, err = invoke(*gen, "--temp", "0", *flags, "hello")
        assert code == 0, (flags, err)
        result = json.loads(out)
        assert check(result["text"]), (flags, result["text"])
        if flags[0] != "--json-object":  # any JSON object can run past 40 tokens
            assert result["finish_reason"] == "stop", flags


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--regex", "a(b"), "flag --regex: regex: invalid regex"),
        (("--json-schema", '{"type": "array", "uniqueItems": true}'), "Unimplemented keys"),
        (("--json-schema", "{oops"), "not valid JSON"),
        (("--json-schema", "/no/such/schema.json"), "cannot read the JSON schema file"),
        (("--grammar", "start: foo"), "flag --grammar: grammar"),
        (("--grammar", "root ::= ("), "invalid GBNF grammar"),
        (("--choice", ","), "non-empty"),
        (("--regex", "a", "--choice", "x,y"), "only one output constraint"),
    ],
)
def test_a_bad_constraint_exits_2_with_one_line_before_loading(flags: tuple[str, ...], needle: str) -> None:
    code, out, err = invoke("generate", "-m", "/no/such/model.gguf", *flags, "hello")
    assert code == 2 and out == ""
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("infer: error:") and needle in lines[0], err


def test_env_twin_and_profile_key(tmp_path: Path) -> None:
    settings = resolve_settings({}, env={"INFER_CHOICE": "yes;no"})
    spec = grammar_from_settings(settings)
    assert spec == GrammarSpec("choice", choices=("yes", "no"), parameter="choice")
    profile = tmp_path / "p.yaml"
    profile.write_text("extends: cpu\nregex: '[0-9]+'\n")
    spec = grammar_from_settings(resolve_settings({"profile": str(profile)}, env={}))
    assert spec is not None and spec.kind == "regex" and spec.source == "[0-9]+"
    profile.write_text("extends: cpu\nregex: '[0-9'\n")
    with pytest.raises(SettingsError, match=r"p\.yaml:2: regex: invalid regex"):
        grammar_from_settings(resolve_settings({"profile": str(profile)}, env={}))
    assert grammar_from_settings(resolve_settings({}, env={})) is None
