"""`infer generate --tools FILE [--tool-choice ...]` and `infer serve --tool-call-parser` on the
command line, in a fresh process on the default model (issue 32): a forced call printed as
`name(arguments)` and structured under `--json`; bad input one line on stderr, exit 2, before the
model loads."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from cli_process import infer_cli

pytestmark = pytest.mark.real_model

SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 20}},
    "required": ["city"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather.", "parameters": SCHEMA}}
]


@pytest.fixture(scope="module")
def tools_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tools") / "tools.json"
    path.write_text(json.dumps(TOOLS))
    return path


def test_forced_call_is_printed_and_structured(tools_file: Path, default_model_path: Path) -> None:
    common = [
        "generate",
        "-m",
        str(default_model_path),
        "What is the weather in Paris?",
        "--tools",
        str(tools_file),
    ]
    result = infer_cli(*common, "--tool-choice", "get_weather", "--seed", "3", "-n", "48", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["finish_reason"] == "tool_calls"
    call = data["tool_calls"][0]
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"]["name"] == "get_weather"
    jsonschema.validate(json.loads(call["function"]["arguments"]), SCHEMA)
    printed = infer_cli(*common, "--tool-choice", "required", "--seed", "3", "-n", "48")
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.splitlines()[-1] == f"get_weather({call['function']['arguments']})"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tool-choice", "nope"], "tool_choice names 'nope', which is not among the tools"),
        (["--raw"], "--tools needs the chat template"),
        (["--stream"], "--tools prints the reply once it is complete"),
    ],
)
def test_bad_tool_flags_exit_2(tools_file: Path, args: list[str], message: str) -> None:
    result = infer_cli("generate", "-m", "/nonexistent.gguf", "hi", "--tools", str(tools_file), *args)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"infer: error: {result.stderr.split('error: ', 1)[1].strip()}"
    ]
    assert message in result.stderr


def test_tool_choice_needs_tools() -> None:
    result = infer_cli("generate", "-m", "/nonexistent.gguf", "hi", "--tool-choice", "required")
    assert result.returncode == 2 and "--tool-choice needs --tools" in result.stderr


def test_unknown_tool_call_parser_exits_2() -> None:
    result = infer_cli("serve", "-m", "/nonexistent.gguf", "--tool-call-parser", "nope")
    assert result.returncode == 2
    assert "--tool-call-parser must be one of" in result.stderr and "hermes" in result.stderr
