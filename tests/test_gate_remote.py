"""`infer gate --server`: anchors run on an OpenAI-compatible server.

Against a fake server in this process (fixed ids, logprob ids with near-ties, text only, a 500, a 400,
an answer cut half-way, a timeout, a refused connection) and against `infer serve` started as a real
process on 127.0.0.1 (anchors blessed locally pass remotely: raw and chat, greedy and seeded).
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cli_process import infer_cli
from fake_openai import FIXED_IDS, FIXED_TEXT, FakeServer, fake_openai_server
from typer.testing import CliRunner

from infer.cli.gate.anchors import load_anchors, token_hash
from infer.cli.gate.remote import (
    IDS_FIELD,
    IDS_LOGPROBS,
    IDS_RETOKENIZED,
    IDS_TEXT_ONLY,
    IDS_TOKENS,
    anchor_body,
    parse_completion,
    text_hash,
)
from infer.cli.main import app
from infer.cli.server_client import server_message


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with fake_openai_server() as server:
        yield server


def _anchors(tmp_path: Path, expect: dict[str, Any] | None = None, **extra: Any) -> Path:
    anchor: dict[str, Any] = {
        "name": "raw",
        "prompt": "Hello",
        "sampler": {"temperature": 0},
        "n_predict": 3,
        **extra,
    }
    if expect is not None:
        anchor["expect"] = expect
    path = tmp_path / "anchors.yaml"
    path.write_text(json.dumps({"version": 1, "anchors": [anchor]}), encoding="utf-8")
    return path


def _gate(*args: str, env: dict[str, str] | None = None) -> Any:
    return CliRunner().invoke(app, ["gate", *args], env={"COLUMNS": "200", **(env or {})})


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- parsing each server's answer ------------------------------------------------------------------
def _resolved(tmp_path: Path, **extra: Any) -> Any:
    return load_anchors(_anchors(tmp_path, **extra)).anchors[0]


def test_bodies_ask_every_server_for_ids_and_top2(tmp_path: Path) -> None:
    raw = _resolved(tmp_path, stop=["\n"], ignore_eos=True)
    path, body = anchor_body(raw, "m", [1, 2, 3])
    assert path == "/completions" and body["prompt"] == [1, 2, 3] and body["logprobs"] == 2
    assert body["return_token_ids"] and body["return_tokens_as_token_ids"] and body["return_tokens"]
    assert body["n_probs"] == 2 and body["temperature"] == 0 and body["max_tokens"] == 3
    assert body["stop"] == ["\n"] and body["ignore_eos"] is True and body["stream"] is False
    assert anchor_body(raw, "m", None)[1]["prompt"] == "Hello"
    chat = _resolved(tmp_path, chat=True)
    path, body = anchor_body(chat, "m", None)
    assert path == "/chat/completions" and body["messages"] == [{"role": "user", "content": "Hello"}]
    assert body["logprobs"] is True and body["top_logprobs"] == 2


def test_parse_each_way_of_returning_ids(tmp_path: Path) -> None:
    anchor = _resolved(tmp_path)
    usage = {"prompt_tokens": 2, "completion_tokens": 3}
    vllm = {"choices": [{"text": "x", "finish_reason": "length", "token_ids": [1, 2, 3]}], "usage": usage}
    got = parse_completion(vllm, chat=False, anchor=anchor, tokenizer=None, seconds=0.1)
    assert got.ids_method == IDS_FIELD and got.run.token_ids == (1, 2, 3) and not got.top2

    # llama-server: merged logprob entries (a split UTF-8 character) -> the verbose token list wins.
    entries = [{"id": 9, "token": "é", "logprob": -0.1, "top_logprobs": []}]
    llama = {
        "choices": [{"text": "é", "finish_reason": "length", "logprobs": {"content": entries}}],
        "usage": usage,
        "__verbose": {"tokens": [7, 8, 9]},
    }
    got = parse_completion(llama, chat=False, anchor=anchor, tokenizer=None, seconds=0.1)
    assert got.ids_method == IDS_TOKENS and got.run.token_ids == (7, 8, 9)
    # Without the verbose list, merged entries are not taken for the ids: text only.
    del llama["__verbose"]
    got = parse_completion(llama, chat=False, anchor=anchor, tokenizer=None, seconds=0.1)
    assert got.ids_method == IDS_TEXT_ONLY and got.text_sha256 == text_hash("é")

    # vLLM legacy completions with return_tokens_as_token_ids, and top-2 logprobs.
    legacy = {
        "tokens": ["token_id:4", "token_id:5"],
        "top_logprobs": [{"token_id:4": -0.5, "token_id:6": -0.9}, {"token_id:5": -0.1, "token_id:1": -3.0}],
    }
    answer = {"choices": [{"text": "ab", "finish_reason": "stop", "logprobs": legacy}], "usage": {}}
    got = parse_completion(answer, chat=False, anchor=anchor, tokenizer=None, seconds=0.1)
    assert got.ids_method == IDS_LOGPROBS and got.run.token_ids == (4, 5) and got.top2
    assert got.run.gaps == pytest.approx([0.4, 2.9])

    # An unknown finish reason (a server-side abort) is an error, not a result.
    odd = {"choices": [{"message": {"content": "x"}, "finish_reason": "abort", "token_ids": [1]}]}
    got = parse_completion(odd, chat=True, anchor=anchor, tokenizer=None, seconds=0.1)
    assert got.run.error and "abort" in got.run.error


def test_retokenizing_puts_back_the_end_of_text_only_when_it_can_tell(tmp_path: Path) -> None:
    class Words:
        eos_id = 99

        def encode(self, text: str, *, parse_special: bool, add_bos: bool) -> list[int]:
            return [len(w) for w in text.split()]

    answer = {"choices": [{"text": "ab cde", "finish_reason": "stop"}], "usage": {}}
    got = parse_completion(answer, chat=False, anchor=_resolved(tmp_path), tokenizer=Words(), seconds=0)  # type: ignore[arg-type]
    assert got.ids_method == IDS_RETOKENIZED and got.run.token_ids == (2, 3, 99)
    stopped = _resolved(tmp_path, stop=["."])
    got = parse_completion(answer, chat=False, anchor=stopped, tokenizer=Words(), seconds=0)  # type: ignore[arg-type]
    assert got.ids_method == IDS_TEXT_ONLY and "stop strings" in got.notes[0]


def test_server_message_keeps_the_servers_words() -> None:
    body = json.dumps({"error": {"message": "bad  temperature", "param": "temperature"}})
    assert server_message(400, body) == "HTTP 400: bad temperature (param temperature)"
    assert server_message(502, b"<html>Bad Gateway</html>") == "HTTP 502: <html>Bad Gateway</html>"
    assert server_message(503, "") == "HTTP 503: (empty body)"


# -- against the fake server -----------------------------------------------------------------------
def test_fixed_ids_pass_then_drift_fails_with_1(tmp_path: Path, fake: FakeServer) -> None:
    path = _anchors(tmp_path, {"sha256": token_hash(FIXED_IDS), "tokens": 3, "finish_reason": "length"})
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    anchor = payload["anchors"][0]
    assert anchor["status"] == "pass" and anchor["got"]["ids_method"] == IDS_FIELD
    assert payload["server"]["model"] == "fake-model" and payload["server"]["headers"]["x-fake-version"]
    assert fake.bodies[-1]["prompt"] == "Hello" and fake.bodies[-1]["model"] == "fake-model"
    fake.ids = [5, 6, 8]
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "token_ids" in result.output


def test_near_tie_classified_from_remote_top2(tmp_path: Path, fake: FakeServer) -> None:
    fake.mode = "logprobs"
    fake.ids, fake.gaps, fake.runner_ups = [5, 9, 7], [3.0, 1e-5, 3.0], [100, 6, 102]
    expect = {"sha256": token_hash(FIXED_IDS), "tokens": 3, "token_ids": FIXED_IDS}
    path = _anchors(tmp_path, expect)
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none", "--json")
    assert result.exit_code == 1, result.output
    anchor = json.loads(result.stdout)["anchors"][0]
    assert anchor["status"] == "tie" and anchor["divergence"]["near_tie"] is True
    assert anchor["got"]["ids_method"] == IDS_LOGPROBS
    allowed = _gate(str(path), "--server", fake.url, "--tokenizer", "none", "--allow-ties")
    assert allowed.exit_code == 0, allowed.output
    # Without top-2 logprobs the report says the classification was not possible.
    fake.mode = "ids"
    fake.ids = [5, 9, 7]
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert result.exit_code == 1 and "near-tie classification not possible" in result.output


def test_text_only_compares_the_text_hash(tmp_path: Path, fake: FakeServer) -> None:
    fake.mode = "text"
    path = _anchors(tmp_path, {"sha256": token_hash(FIXED_IDS)})
    unchecked = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert unchecked.exit_code == 2 and "no text_sha256" in unchecked.output, unchecked.output
    blessed = _gate(str(path), "--bless", "--server", fake.url, "--tokenizer", "none")
    assert blessed.exit_code == 0, blessed.output
    loaded = load_anchors(path)
    expect = loaded.spec.anchors[0].expect
    assert expect is not None and expect.text_sha256 == text_hash(FIXED_TEXT)
    assert expect.sha256 == token_hash(FIXED_IDS)  # token fields untouched by a text-only bless
    fingerprint = loaded.spec.fingerprint or {}
    assert fingerprint["backend"] == "server" and fingerprint["server"]["models"] == ["fake-model"]
    assert fingerprint["server"]["headers"]["x-fake-version"] == "1.2.3"
    assert fingerprint["server"]["system_fingerprint"] == "fake-build-1"
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none")
    assert result.exit_code == 0 and "text only" in result.output, result.output


@pytest.mark.parametrize(
    ("mode", "message"),
    [
        ("500", "HTTP 500: engine exploded"),
        ("400", "HTTP 400: temperature is out of range (param temperature)"),
        ("cut", "cut mid-response"),
        ("slow", "timed out"),
    ],
)
def test_remote_failures_exit_2_with_the_servers_message(
    tmp_path: Path, fake: FakeServer, mode: str, message: str
) -> None:
    fake.mode = mode
    path = _anchors(tmp_path, {"sha256": token_hash(FIXED_IDS)})
    result = _gate(str(path), "--server", fake.url, "--tokenizer", "none", "--timeout", "1", "--json")
    assert result.exit_code == 2, result.output
    anchor = json.loads(result.stdout)["anchors"][0]
    assert anchor["status"] == "error" and message in anchor["problems"][0], anchor["problems"]
    assert "could not be checked" in result.output
    blessed = _gate(str(path), "--bless", "--server", fake.url, "--tokenizer", "none", "--timeout", "1")
    assert blessed.exit_code == 2 and message in blessed.output


def test_refused_connection_and_bad_flags_exit_2(tmp_path: Path) -> None:
    path = _anchors(tmp_path, {"sha256": token_hash(FIXED_IDS)})
    url = f"http://127.0.0.1:{_free_port()}"
    result = _gate(str(path), "--tokenizer", "none", env={"INFER_SERVER_URL": url})
    assert result.exit_code == 2 and "could not check" in result.output and "cannot connect" in result.output
    assert _gate(str(path), "--api-key", "k").exit_code == 2  # only with --server
    threads = _gate(str(path), "--server", url, "-t", "2", "--tokenizer", "none")
    assert threads.exit_code == 2 and "--threads" in threads.output


# -- against `infer serve` as a real process ------------------------------------------------------
LOCAL_ANCHORS = """\
version: 1
defaults:
  profile: cpu
  n_predict: 6
anchors:
  - name: raw-greedy
    prompt: "The capital of France is"
    sampler: {temperature: 0}
  - name: raw-seeded
    prompt: "List three colors:"
    sampler: {temperature: 1.3, seed: 42, top_k: 0, top_p: 1.0, min_p: 0.0}
  - name: chat-greedy
    messages:
      - {role: user, content: "Write a haiku about the sea."}
    sampler: {temperature: 0}
  - name: chat-seeded
    prompt: "Once upon a time"
    chat: true
    sampler: {temperature: 0.7, seed: 1234, top_k: 40, top_p: 0.95, min_p: 0.05}
"""


@pytest.mark.real_model
@pytest.mark.slow
def test_locally_blessed_anchors_pass_on_infer_serve(tmp_path: Path, default_model_path: Path) -> None:
    from infer.cli.serve.launch import start_server

    path = tmp_path / "anchors.yaml"
    path.write_text(LOCAL_ANCHORS, encoding="utf-8")
    blessed = infer_cli("gate", str(path), "--bless", "--keep-tokens")
    assert blessed.returncode == 0, blessed.stderr
    server = start_server(["--profile", "cpu", "-t", "1", "--api-key", "sesame"])
    try:
        denied = infer_cli("gate", str(path), "--server", server.url or "")
        remote = infer_cli(
            "gate", str(path), "--server", server.url or "", "--json", env={"INFER_API_KEY": "sesame"}
        )
        _check_token_id_fields(server.url or "", "sesame")
    finally:
        server.stop()
    assert denied.returncode == 2 and "HTTP 401" in denied.stderr, denied.stderr
    assert remote.returncode == 0, remote.stdout + remote.stderr
    payload = json.loads(remote.stdout)
    assert [a["status"] for a in payload["anchors"]] == ["pass"] * 4
    assert {a["got"]["ids_method"] for a in payload["anchors"]} == {IDS_FIELD}
    assert payload["fingerprint"]["server"]["models"]


def _check_token_id_fields(url: str, key: str) -> None:
    """`infer serve`'s vLLM extensions: `return_token_ids` whole and streamed (the same ids), and
    `return_tokens_as_token_ids` in the logprobs; refused where they cannot be honoured."""
    import httpx

    headers = {"Authorization": f"Bearer {key}"}
    common = {"max_tokens": 5, "temperature": 0, "return_token_ids": True}
    with httpx.Client(base_url=url, headers=headers, timeout=120) as http:
        for route, extra in (
            ("/v1/completions", {"prompt": "Hello there", "logprobs": 1}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}], "logprobs": True}),
        ):
            body = {**common, **extra, "return_tokens_as_token_ids": True}
            whole = http.post(route, json=body).json()
            choice = whole["choices"][0]
            ids = choice["token_ids"]
            assert len(ids) == whole["usage"]["completion_tokens"] > 0
            logprobs = choice["logprobs"]
            tokens = logprobs["tokens"] if "tokens" in logprobs else [e["token"] for e in logprobs["content"]]
            assert tokens == [f"token_id:{t}" for t in ids]
            streamed: list[int] = []
            with http.stream("POST", route, json={**body, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: {"):
                        for item in json.loads(line[6:]).get("choices") or []:
                            streamed += item.get("token_ids") or []
            assert streamed == ids, route
        refused = http.post("/v1/responses", json={"input": "Hi", "return_token_ids": True})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "return_token_ids"
