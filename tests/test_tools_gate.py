"""Tools in `infer gate` anchors and `infer bench --dataset` lines (issue 32).

Gate: an anchor with `tools` (inline or a file relative to the anchors file) and `tool_choice` is
rendered and constrained as `infer generate --tools` does it; its token hash and its calls' hash are
blessed and checked, and a drift report says whether the calls changed. Bad tool anchors are one
line naming the file's line. `--server`: tools and tool_choice go in the chat request, the calls come
from the answer's `tool_calls` (a fake server; a server without `tool_calls` cannot be checked, exit
2), and anchors blessed locally pass on `infer serve` (slow: a server process).

Bench: a dataset line with tools sends them; a call's tokens count as any reply's (a fake server, and
`infer serve` on the tiny model in the slow test)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fake_openai import CALL_TOKENS, FIXED_IDS, FakeServer, fake_openai_server
from typer.testing import CliRunner

from infer.cli.bench.dataset import DatasetError, load_dataset
from infer.cli.gate.anchors import GateFileError, calls_hash, canonical_calls, load_anchors, token_hash
from infer.cli.gate.remote import anchor_body
from infer.cli.main import app

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"enum": ["Paris", "Oslo"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
TIME = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}

ANCHORS = """\
version: 1
defaults:
  profile: cpu
  model: {model}
  n_predict: 160
anchors:
  - name: forced
    messages:
      - {{role: user, content: "What is the weather in Paris?"}}
    tools: tools.json
    tool_choice: required
    sampler: {{temperature: 0}}
  - name: named-seeded
    prompt: "What time is it?"
    chat: true
    tools: [{time}]
    tool_choice: get_time
    sampler: {{temperature: 0.9, seed: 3}}
  - name: auto
    prompt: "Hi"
    chat: true
    tools: tools.json
    sampler: {{temperature: 0}}
    n_predict: 8
"""


ENV: dict[str, str | None] = {"COLUMNS": "200", "INFER_PROFILE": None, "INFER_SERVER_URL": None}


def _gate(*args: str) -> Any:
    return CliRunner().invoke(app, ["gate", *args], env=ENV)


@pytest.fixture(scope="module")
def tool_model(tiny_model_factory: Callable[..., Any]) -> Path:
    """The tiny model with room for the generic tool prompt (about 560 tokens of its byte vocabulary)."""
    return tiny_model_factory(context_length=2048).gguf_path


def _write_anchors(folder: Path, model: Path) -> Path:
    (folder / "tools.json").write_text(json.dumps([WEATHER, TIME]))
    path = folder / "anchors.yaml"
    path.write_text(ANCHORS.format(model=model, time=json.dumps(TIME)))
    return path


def _set_expect(path: Path, name: str, **values: Any) -> None:
    data = yaml.safe_load(path.read_text())
    for anchor in data["anchors"]:
        if anchor["name"] == name:
            anchor["expect"].update(values)
    path.write_text(json.dumps(data))


# -- the canonical calls hash --------------------------------------------------------------------
def test_calls_hash_ignores_ids_and_key_order() -> None:
    one = [{"id": "call_1", "function": {"name": "f", "arguments": '{"b": 1, "a": "é"}'}}]
    two = [{"id": "call_2", "type": "function", "function": {"name": "f", "arguments": '{"a":"é","b":1}'}}]
    assert canonical_calls(one) == [{"name": "f", "arguments": {"a": "é", "b": 1}}]
    assert calls_hash(canonical_calls(one)) == calls_hash(canonical_calls(two))
    text = '[{"arguments":{"a":"é","b":1},"name":"f"}]'.encode()
    assert calls_hash(canonical_calls(one)) == hashlib.sha256(text).hexdigest()
    assert calls_hash([]) == hashlib.sha256(b"[]").hexdigest()
    raw = canonical_calls([{"function": {"name": "g", "arguments": "not json"}}])
    assert raw == [{"name": "g", "arguments": "not json"}]
    with pytest.raises(ValueError):
        canonical_calls([{"function": {}}])


# -- bad tool anchors: one line naming the file's line -------------------------------------------
GOOD = """\
version: 1
anchors:
  - name: a
    prompt: "Hello"
    chat: true
    sampler: {temperature: 0}
    n_predict: 4
    tools: [{"type": "function", "function": {"name": "f"}}]
"""


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (GOOD.replace("    chat: true\n", ""), ":7: anchors[0].tools: tools need the chat template"),
        (GOOD.replace("    tools:", "    tolls:"), "unknown key 'tolls' (did you mean 'tools'?)"),
        (GOOD + "    tool_choice: g\n", ":9: anchors[0].tool_choice: tool_choice names 'g', which is not"),
        (GOOD + "    tool_choice: sometimes\n", "anchors[0].tool_choice: tool_choice names 'sometimes'"),
        (GOOD.replace('"name": "f"', '"name": "bad name"'), ":8: anchors[0].tools: tools.0.function.name"),
        (GOOD.replace("[{", "[{}, {"), ":8: anchors[0].tools: tools.0.function must be an object"),
        (GOOD.replace('[{"type"', '[{"type": "web_search"}, {"type"'), "only function tools"),
        (GOOD.replace("tools: [", "tools: missing.json #"), "missing.json: cannot read the tools"),
        (GOOD + "    tool_choice: f\n    regex: a+\n", ":9: anchors[0].tool_choice: a required or named"),
    ],
)
def test_bad_tool_anchors_name_the_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(text)
    with pytest.raises(GateFileError) as info:
        load_anchors(path)
    message = str(info.value)
    assert message.startswith(str(path)) and expected in message and "\n" not in message, message


def test_tool_choice_without_tools_and_an_empty_tools_file(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        GOOD.replace(
            '    tools: [{"type": "function", "function": {"name": "f"}}]', "    tool_choice: required"
        )
    )
    with pytest.raises(GateFileError, match=r":8: anchors\[0\].tool_choice: needs `tools`"):
        load_anchors(path)
    (tmp_path / "empty.json").write_text("[]")
    path.write_text(GOOD.replace('[{"type": "function", "function": {"name": "f"}}]', "empty.json"))
    with pytest.raises(GateFileError, match=r":8: anchors\[0\].tools: .*empty.json: expected a JSON list"):
        load_anchors(path)


def test_auto_tools_may_share_an_anchor_with_a_constraint(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(GOOD + "    regex: a+\n")
    (anchor,) = load_anchors(path).anchors
    assert anchor.tool_choice is not None and anchor.tool_choice.mode == "auto"


# -- local runs on the tiny model ----------------------------------------------------------------
def test_tool_anchors_bless_pass_and_pin_the_calls(tmp_path: Path, tool_model: Path) -> None:
    path = _write_anchors(tmp_path, tool_model)
    blessed = _gate(str(path), "--bless", "-t", "1")
    assert blessed.exit_code == 0, blessed.output
    loaded = load_anchors(path)
    expects = {a.name: a.anchor.expect for a in loaded.anchors}
    assert all(e is not None and e.sha256 and e.calls_sha256 for e in expects.values())
    assert expects["forced"].calls_sha256 != calls_hash([])  # type: ignore[union-attr]

    checked = _gate(str(path), "--json", "--audit", "-t", "1")  # the tokens obey the call grammar
    assert checked.exit_code == 0, checked.output
    report = {a["name"]: a for a in json.loads(checked.stdout)["anchors"]}
    assert {name: a["status"] for name, a in report.items()} == dict.fromkeys(report, "pass")
    forced, named = report["forced"]["got"], report["named-seeded"]["got"]
    assert forced["calls"] and {c["name"] for c in forced["calls"]} <= {"get_weather", "get_time"}
    assert forced["calls_sha256"] == calls_hash(forced["calls"]) == expects["forced"].calls_sha256  # type: ignore[union-attr]
    assert named["calls"] and {c["name"] for c in named["calls"]} == {"get_time"}

    # The calls changed (the tokens did not: a parser change): exit 1, the report says so.
    _set_expect(path, "forced", calls_sha256="0" * 64)
    drift = _gate(str(path), "-t", "1", "--filter", "forced")
    assert drift.exit_code == 1, drift.output
    assert "calls_sha256 000000000000… expected" in drift.output and "the tool calls changed" in drift.output

    # The tokens changed but the calls did not: exit 1, and a note that the calls are the same.
    _set_expect(path, "forced", calls_sha256=forced["calls_sha256"], sha256="1" * 64)
    tokens = _gate(str(path), "-t", "1", "--filter", "forced")
    assert tokens.exit_code == 1 and "the tool calls are unchanged" in tokens.output, tokens.output


# -- --server against a fake ---------------------------------------------------------------------
CALLS = [
    {"id": "call_9", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with fake_openai_server() as server:
        yield server


def _remote_anchors(tmp_path: Path, expect: dict[str, Any], tool_choice: str = "get_weather") -> Path:
    anchor = {
        "name": "call",
        "messages": [{"role": "user", "content": "Weather in Oslo?"}],
        "tools": [WEATHER],
        "tool_choice": tool_choice,
        "sampler": {"temperature": 0},
        "n_predict": 3,
        "expect": expect,
    }
    path = tmp_path / "anchors.yaml"
    path.write_text(json.dumps({"version": 1, "anchors": [anchor]}))
    return path


def test_remote_tool_anchor_sends_the_tools_and_checks_the_calls(tmp_path: Path, fake: FakeServer) -> None:
    fake.tool_calls = CALLS
    blessed = {
        "sha256": token_hash(FIXED_IDS),
        "finish_reason": "stop",
        "calls_sha256": calls_hash(canonical_calls(CALLS)),
    }
    path = _remote_anchors(tmp_path, blessed)
    (anchor,) = load_anchors(path).anchors
    route, body = anchor_body(anchor, "m", None)
    assert route == "/chat/completions" and body["tools"] == [WEATHER]
    assert body["tool_choice"] == {"type": "function", "function": {"name": "get_weather"}}
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none", "--json")
    assert result.exit_code == 0, result.output
    (got,) = json.loads(result.stdout)["anchors"]
    assert got["status"] == "pass" and got["got"]["calls"] == [
        {"name": "get_weather", "arguments": {"city": "Oslo"}}
    ]
    assert fake.bodies[-1]["tools"] == [WEATHER]

    fake.tool_calls = [{**CALLS[0], "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]
    changed = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert changed.exit_code == 1 and "the tool calls changed" in changed.output, changed.output

    fake.tool_calls = None  # a server that does not parse tool calls: nothing to check them by
    unchecked = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert unchecked.exit_code == 2, unchecked.output
    assert "could not check" in unchecked.output and "no tool_calls" in unchecked.output


def test_remote_auto_anchor_without_calls_passes_on_a_plain_server(tmp_path: Path, fake: FakeServer) -> None:
    blessed = {"sha256": token_hash(FIXED_IDS), "finish_reason": "length", "calls_sha256": calls_hash([])}
    result = _gate(
        str(_remote_anchors(tmp_path, blessed, "auto")), "--server", fake.url, "--tokenizer", "none"
    )
    assert result.exit_code == 0, result.output


# -- bench datasets with tools -------------------------------------------------------------------
def _bench(*args: str) -> Any:
    return CliRunner().invoke(app, ["bench", *args], env=ENV)


def _tools_dataset(folder: Path) -> Path:
    path = folder / "tools.jsonl"
    lines = [
        {
            "messages": [{"role": "user", "content": "Weather in Oslo?"}],
            "tools": [WEATHER],
            "tool_choice": "get_weather",
        },
        {
            "prompt": "Say hi.",
            "tools": [WEATHER, TIME],
            "tool_choice": "required",
            "parallel_tool_calls": False,
        },
        {"prompt": "Hello"},
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return path


def test_dataset_lines_with_tools_are_checked(tmp_path: Path) -> None:
    items = load_dataset(_tools_dataset(tmp_path), api="chat")
    assert items[0].tool_choice == {"type": "function", "function": {"name": "get_weather"}}
    assert items[1].tools == [WEATHER, TIME] and items[1].tool_choice == "required" and items[2].tools is None
    bad = tmp_path / "bad.jsonl"
    for line, message in (
        ({"prompt": "a", "tool_choice": "auto"}, '"tool_choice" needs "tools"'),
        ({"prompt": "a", "parallel_tool_calls": True}, '"parallel_tool_calls" needs "tools"'),
        ({"prompt": "a", "tools": [WEATHER], "parallel_tool_calls": "no"}, "must be true or false"),
        ({"prompt": "a", "tools": []}, '"tools" must be a non-empty list'),
        ({"prompt": "a", "tools": [{"type": "web_search"}]}, "only function tools"),
        ({"prompt": "a", "tools": [WEATHER], "tool_choice": "get_time"}, "'get_time', which is not among"),
    ):
        bad.write_text(json.dumps(line) + "\n")
        with pytest.raises(DatasetError, match=message):
            load_dataset(bad, api="chat")
    bad.write_text(json.dumps({"prompt": "a", "tools": [WEATHER]}) + "\n")
    with pytest.raises(DatasetError, match=":1: a line with tools needs --api chat"):
        load_dataset(bad, api="completions")


def test_bench_sends_the_tools_and_counts_the_call_tokens(tmp_path: Path, fake: FakeServer) -> None:
    fake.tool_calls = CALLS
    result = _bench(
        "--server", fake.url, "--dataset", str(_tools_dataset(tmp_path)), "-n", "4", "-r", "1",
        "--no-warmup", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.stdout)["results"]
    assert record["completed"] == 3 and record["errors"] == 0
    assert record["tokens"] == 2 * CALL_TOKENS + 4  # two call replies and one of four text chunks
    assert record["ttft_ms"]["p50"] > 0
    sent = sorted(fake.bodies, key=lambda b: json.dumps(b["messages"]))
    with_tools = [b for b in sent if "tools" in b]
    assert [b.get("parallel_tool_calls") for b in with_tools].count(False) == 1
    assert len(with_tools) == 2 and {json.dumps(b["tool_choice"]) for b in with_tools} == {
        '"required"',
        '{"type": "function", "function": {"name": "get_weather"}}',
    }


# -- infer serve on the tiny model ---------------------------------------------------------------
@pytest.mark.slow
def test_locally_blessed_tool_anchors_pass_on_infer_serve_and_bench_runs(
    tmp_path: Path, tool_model: Path
) -> None:
    from cli_process import running_server

    path = _write_anchors(tmp_path, tool_model)
    blessed = _gate(str(path), "--bless", "-t", "1")
    assert blessed.exit_code == 0, blessed.output
    with running_server(["-m", str(tool_model), "-c", "1024", "--max-num-seqs", "4", "-t", "1"]) as server:
        remote = _gate(str(path), "--server", server.url or "", "--json")
        bench = _bench(
            "--server", server.url or "", "--dataset", str(_tools_dataset(tmp_path)), "-n", "24", "-r", "1",
            "--no-warmup", "--json",
        )  # fmt: skip
    assert remote.exit_code == 0, remote.output
    anchors = json.loads(remote.stdout)["anchors"]
    assert [a["status"] for a in anchors] == ["pass"] * 3
    forced = next(a for a in anchors if a["name"] == "forced")
    assert forced["got"]["calls"] and forced["got"]["ids_method"] == "token_ids"
    assert bench.exit_code == 0, bench.output
    (record,) = json.loads(bench.stdout)["results"]
    assert record["completed"] == 3 and record["errors"] == 0 and record["tokens"] > 3


def test_local_bench_renders_the_dataset_tools(tmp_path: Path, tool_model: Path) -> None:
    from infer.cli.bench.dataset import load_dataset as load
    from infer.cli.bench.engine_serve import dataset_requests
    from infer.cli.serve.tools import read_tool_choice
    from infer.cli.tool_use import build_tool_request
    from infer.engine.runtime.engine import EngineConfig, load_engine
    from infer.profiles.settings import resolve_settings

    dataset = _tools_dataset(tmp_path)
    engine = load_engine(tool_model, EngineConfig(ctx_size=1024, max_num_seqs=2))
    settings = resolve_settings({"model": str(tool_model)}, env={})
    items = load(dataset, api="chat")
    requests = dataset_requests(engine, settings, items, api="chat", max_tokens=12, seed=4)
    choice = read_tool_choice(items[0].tools, items[0].tool_choice, None, flat=False)
    assert choice is not None and choice.forced == "get_weather"
    generated, _ = build_tool_request(
        engine, settings, items[0].as_messages(), choice=choice, ignore_eos=True, max_tokens=12, seed=4
    )
    # As `infer generate --tools --tool-choice get_weather` renders and constrains it.
    assert requests[0].prompt_ids == generated.prompt_ids and requests[0].grammar == generated.grammar
    assert requests[0].grammar is not None and requests[1].grammar is not None and requests[2].grammar is None
    assert all(r.ignore_eos and r.max_tokens == 12 and r.seed == 4 for r in requests)

    result = _bench(
        "-m", str(tool_model), "-t", "1", "--dataset", str(dataset), "-n", "12", "-r", "1", "--no-warmup",
        "--max-concurrency", "2", "--json",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (record,) = json.loads(result.stdout)["results"]
    assert record["kind"] == "serve" and record["completed"] == 3 and record["errors"] == 0
    assert record["tokens"] == 36 and record["max_concurrency"] == 2  # a call is longer than 12 tokens
