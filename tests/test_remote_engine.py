"""`backend: remote`: generate, stream, chat, bench and gate against a server named by a profile.

Fast tests run against the fake OpenAI server in this process (`tests/fake_openai.py`), posing as
each engine through `/v1/models` `owned_by`: settings resolution, the sampler fields each engine is
sent or refused (before any request is sent), a server error (one line, exit 2), a stream cut
half-way (the text kept, exit 1, `finish_reason` error), and a bless refused on a server whose two
runs of an anchor differ. The slow tests run the commands against a real `infer serve` and a real
llama.cpp `llama-server`; the latter is taken from the build cache `scripts/llamacpp_build.py
--server` fills (`.ci/run` builds it once, ~10 minutes on 2 cores) and skipped, saying so, where no
build is cached.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from cli_process import ROOT, infer_cli
from fake_openai import FakeServer, fake_openai_server
from typer.testing import CliRunner

from infer.cli.main import app
from infer.cli.remote.engines import KINDS, LLAMA_SERVER, OPENAI, VLLM, map_sampler
from infer.profiles.settings import SettingsError, resolve_settings

sys.path.insert(0, str(ROOT / "scripts"))
import llamacpp_build as lb


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with fake_openai_server() as server:
        yield server


def _profile(tmp_path: Path, url: str, **extra: Any) -> Path:
    path = tmp_path / "remote.yaml"
    body = {"description": "a server", "backend": "remote", "server_url": url, **extra}
    path.write_text(json.dumps(body), encoding="utf-8")
    return path


def _invoke(*args: str, env: dict[str, str] | None = None, stdin: str | None = None) -> Any:
    return CliRunner().invoke(app, list(args), env={"COLUMNS": "200", **(env or {})}, input=stdin)


# -- settings ----------------------------------------------------------------------------------------


def test_a_server_url_selects_the_remote_backend_and_contradictions_are_refused() -> None:
    settings = resolve_settings({"server_url": "http://127.0.0.1:9"}, env={})
    assert settings.backend == "remote" and str(settings.source("backend")) == "flag --server"
    from_env = resolve_settings({}, env={"INFER_SERVER_URL": "http://127.0.0.1:9"})
    assert from_env.backend == "remote" and from_env.api_key_env == "INFER_API_KEY"
    with pytest.raises(SettingsError, match="backend remote needs server_url"):
        resolve_settings({"backend": "remote"}, env={})
    with pytest.raises(SettingsError, match="flag --backend: backend cpu runs locally"):
        resolve_settings({"backend": "cpu"}, env={"INFER_SERVER_URL": "http://127.0.0.1:9"})
    with pytest.raises(SettingsError, match="http:// or https://"):
        resolve_settings({"server_url": "127.0.0.1:9"}, env={})


def test_each_engine_gets_the_sampler_under_its_names_or_a_refusal() -> None:
    def mapped(kind: str, **flags: Any) -> dict[str, Any]:
        settings = resolve_settings({"server_url": "http://h", **flags}, env={})
        return map_sampler(KINDS[kind], settings.sampling, settings).fields

    llama = mapped(LLAMA_SERVER, xtc_probability="0.5", dry_multiplier="0.8")
    assert llama["xtc_probability"] == 0.5 and llama["xtc_threshold"] == 0.1
    assert llama["dry_multiplier"] == 0.8 and llama["dry_sequence_breakers"] == ["\n", ":", '"', "*"]
    assert llama["top_k"] == 40 and llama["samplers"][0] == "penalties"
    vllm = mapped(VLLM, top_k="0", repeat_penalty="1.1", repeat_last_n="-1")
    assert vllm["top_k"] == -1 and vllm["repetition_penalty"] == 1.1 and "repeat_penalty" not in vllm
    with pytest.raises(SettingsError, match=r"flag --xtc-probability: sampler.xtc_probability .* vLLM"):
        mapped(VLLM, xtc_probability="0.5")
    with pytest.raises(SettingsError, match="whole prompt and output, not the last 64"):
        mapped(VLLM, repeat_penalty="1.1")
    # A plain OpenAI server: infer's own default top_k / min_p are left to it, a chosen one is refused.
    settings = resolve_settings({"server_url": "http://h"}, env={})
    plain = map_sampler(KINDS[OPENAI], settings.sampling, settings)
    assert "top_k" not in plain.fields and plain.left_to_server == ["top_k 40", "min_p 0.05"]
    with pytest.raises(SettingsError, match="flag --top-k"):
        mapped(OPENAI, top_k="5")


# -- against the fake server -------------------------------------------------------------------------


def test_generate_streams_from_a_server_named_by_a_profile(fake: FakeServer, tmp_path: Path) -> None:
    fake.owner = "vllm"
    profile = _profile(tmp_path, fake.url, model="fake-model", sampler={"temperature": 0.5, "seed": 7})
    result = _invoke("generate", "--profile", str(profile), "Hello", "-n", "4", "--json", "--stop", "zz")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["text"] == "abcd" and payload["finish_reason"] == "length"
    assert payload["server"]["engine"] == "vllm" and payload["server"]["usage"]["completion_tokens"] == 4
    body = fake.bodies[-1]
    assert body["messages"] == [{"role": "user", "content": "Hello"}] and body["stream"] is True
    assert body["temperature"] == 0.5 and body["seed"] == 7 and body["max_tokens"] == 4
    assert body["stop"] == ["zz"] and body["top_k"] == 40 and body["min_p"] == 0.05
    raw = _invoke("generate", "--server", fake.url, "--raw", "Hi", "-n", "2")
    assert raw.exit_code == 0 and raw.stdout.strip() == "abcd" and fake.bodies[-1]["prompt"] == "Hi"


def test_output_constraints_go_as_each_engine_takes_them(fake: FakeServer) -> None:
    schema = '{"type": "object", "properties": {"a": {"type": "integer"}}}'
    fake.owner = "vllm"
    assert _invoke("generate", "--server", fake.url, "Hi", "--json-schema", schema).exit_code == 0
    sent = fake.bodies[-1]["response_format"]
    assert sent["type"] == "json_schema" and sent["json_schema"]["schema"]["properties"]["a"]
    assert _invoke("generate", "--server", fake.url, "Hi", "--regex", "[0-9]+").exit_code == 0
    assert fake.bodies[-1]["structured_outputs"] == {"regex": "[0-9]+"}
    fake.owner = "llamacpp"
    assert _invoke("generate", "--server", fake.url, "Hi", "--json-schema", schema).exit_code == 0
    assert fake.bodies[-1]["json_schema"]["type"] == "object"
    sent_before = len(fake.bodies)
    refused = _invoke("generate", "--server", fake.url, "Hi", "--regex", "[0-9]+")
    assert refused.exit_code == 2 and "llama.cpp llama-server (it takes no such constraint)" in refused.stderr
    assert len(fake.bodies) == sent_before


def test_unhonourable_settings_are_refused_before_anything_is_sent(fake: FakeServer) -> None:
    fake.owner = "vllm"
    for flags, words in (
        (["--xtc-probability", "0.5"], "cannot be honoured by vLLM"),
        (["--mirostat", "2"], "cannot be honoured by vLLM"),
        (["-t", "2"], "not used by backend remote"),
        (["--spec-method", "prompt_lookup"], "not used by backend remote"),
        (["--no-parse-special"], "--no-parse-special cannot be honoured"),
    ):
        result = _invoke("generate", "--server", fake.url, "Hi", *flags)
        assert result.exit_code == 2, (flags, result.output)
        assert words in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    for flags in (["--temp", "0.5"], ["-c", "512"]):  # a server bench would not send them
        bench = _invoke("bench", "--server", fake.url, "-p", "4", "-n", "2", "-r", "1", *flags)
        assert bench.exit_code == 2 and flags[0] in bench.stderr, bench.output
    assert fake.bodies == []
    fake.owner = None  # a plain OpenAI server has no top_k field
    refused = _invoke("generate", "--server", fake.url, "Hi", "--top-k", "5")
    assert refused.exit_code == 2 and "an OpenAI-compatible server" in refused.stderr
    assert fake.bodies == []


def test_server_errors_and_a_cut_stream(fake: FakeServer) -> None:
    fake.mode = "500"
    failed = _invoke("generate", "--server", fake.url, "Hi")
    assert failed.exit_code == 2, failed.output
    assert failed.stderr.strip().splitlines() == [
        f"infer: error: POST {fake.url}/v1/chat/completions: HTTP 500: engine exploded"
    ]
    fake.mode = "cut"
    cut = _invoke("generate", "--server", fake.url, "Hi", "--json")
    assert cut.exit_code == 1, cut.output
    payload = json.loads(cut.stdout)
    assert payload["text"] == "ab" and payload["finish_reason"] == "error"
    assert "cut" in payload["error"]
    streamed = _invoke("stream", "--server", fake.url, "Hi")
    assert streamed.exit_code == 1 and streamed.stdout.startswith("ab")
    assert "finish error" in streamed.stderr
    down = _invoke("generate", "--server", f"http://127.0.0.1:{_free_port()}", "Hi")
    assert (
        down.exit_code == 2 and "could not use the server" in down.stderr and "cannot connect" in down.stderr
    )


def test_cancelling_closes_the_stream_and_keeps_the_text(fake: FakeServer) -> None:
    from infer.cli.remote.client import open_remote
    from infer.engine import DoneEvent, TokenEvent

    settings = resolve_settings({"server_url": fake.url}, env={})
    engine = open_remote(settings)
    try:
        request = engine.request(settings, prompt="Hi")
        stream = engine.submit(request)
        first = next(iter(stream))
        assert isinstance(first, TokenEvent) and first.text == "a"
        stream.cancel()  # what Ctrl-C in run_request does
        events = list(stream)
    finally:
        engine.shutdown()
    assert len(events) == 1 and isinstance(events[0], DoneEvent)
    assert events[0].finish_reason == "cancelled" and events[0].text == "a"
    assert events[0].seed == request.seed


def test_profiles_show_names_the_engine(fake: FakeServer, tmp_path: Path) -> None:
    fake.owner = "sglang"
    profile = _profile(tmp_path, fake.url)
    shown = _invoke("profiles", "show", str(profile))
    assert shown.exit_code == 0 and "backend: remote, SGLang at" in shown.stdout, shown.output
    document = json.loads(_invoke("profiles", "show", str(profile), "--json").stdout)
    assert document["remote"]["engine"] == "sglang" and document["remote"]["model"] == "fake-model"
    assert document["remote"]["sampler_fields"]["top_k"] == 40


def test_bless_refuses_an_anchor_the_server_does_not_reproduce(fake: FakeServer, tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    anchors = [
        {"name": name, "prompt": "Hello", "sampler": {"temperature": 0}, "n_predict": 3}
        for name in ("a", "b")
    ]
    path.write_text(json.dumps({"version": 1, "anchors": anchors}), encoding="utf-8")
    steady = _invoke("gate", str(path), "--bless", "--server", fake.url, "--tokenizer", "none")
    assert steady.exit_code == 0, steady.output
    assert len(fake.bodies) == 4 and all(body["cache_prompt"] is False for body in fake.bodies)
    fake.mode = "unstable"
    blessed = _invoke("gate", str(path), "--bless", "--server", fake.url, "--tokenizer", "none")
    assert blessed.exit_code == 2, blessed.output
    assert "a: not blessed" in blessed.stdout and "server not reproducible for this anchor" in blessed.stdout
    assert "different tokens from position 2" in blessed.stdout


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- against real servers ----------------------------------------------------------------------------

GREEDY_ANCHORS = ("greedy-capital", "greedy-code", "stop-string")


def _arrival(args: list[str]) -> tuple[list[float], float, str, int]:
    """Run `infer ARGS` and time each piece of stdout: (arrival times, exit time, stdout, exit code)."""
    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-c", "from infer.cli.main import main; main()", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    assert process.stdout is not None
    times, pieces = [], []
    while True:
        chunk = os.read(process.stdout.fileno(), 4096)
        if not chunk:
            break
        times.append(time.monotonic() - started)
        pieces.append(chunk)
    code = process.wait(timeout=300)
    return times, time.monotonic() - started, b"".join(pieces).decode(), code


def _commands_against(url: str, tmp_path: Path) -> None:
    """generate, stream, chat, bench and gate with `--profile` naming the server at `url`."""
    profile = str(_profile(tmp_path, url, sampler={"temperature": 0}))
    generated = infer_cli("generate", "--profile", profile, "Name a colour.", "-n", "8", "--json")
    assert generated.returncode == 0, generated.stderr
    payload = json.loads(generated.stdout)
    assert payload["text"] and payload["server"]["usage"]["completion_tokens"] == payload["completion_tokens"]
    # streamed: the first text arrives well before the answer ends
    times, ended, text, code = _arrival(
        ["stream", "--profile", profile, "--raw", "Once upon a time", "-n", "64", "--ignore-eos"]
    )
    assert code == 0 and len(text.strip()) > 20
    assert len(times) > 3 and times[0] < ended - 0.3, (times, ended)
    chat = subprocess.run(
        [
            sys.executable,
            "-c",
            "from infer.cli.main import main; main()",
            "chat",
            "--profile",
            profile,
            "-n",
            "8",
        ],
        input="Hello\n/exit\n",
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=300,
    )
    assert chat.returncode == 0 and chat.stdout.strip(), chat.stderr
    assert "finish length" in chat.stderr or "finish stop" in chat.stderr
    bench = infer_cli("bench", "--profile", profile, "-p", "16", "-n", "8", "-r", "1", "--json")
    assert bench.returncode == 0, bench.stderr
    assert {r["test"] for r in json.loads(bench.stdout)["results"]} == {"pp16", "tg8"}
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text((ROOT / "anchors" / "default.yaml").read_text(), encoding="utf-8")
    filters = [arg for name in GREEDY_ANCHORS for arg in ("--filter", name)]
    blessed = infer_cli("gate", str(anchors), "--bless", "--profile", profile, *filters)
    assert blessed.returncode == 0, blessed.stdout + blessed.stderr
    junit = tmp_path / "gate.xml"
    checked = infer_cli("gate", str(anchors), "--profile", profile, *filters, "--junit", str(junit))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert (
        'failures="0"' in junit.read_text()
        and f"{len(GREEDY_ANCHORS)}/{len(GREEDY_ANCHORS)}" in checked.stdout
    )


@pytest.mark.real_model
@pytest.mark.slow
def test_commands_against_infer_serve(tmp_path: Path, default_model_path: Path) -> None:
    from infer.cli.serve.launch import start_server

    server = start_server(["--profile", "cpu", "-t", "1"])
    try:
        _commands_against(server.url or "", tmp_path)
        # infer serve takes every sampler field, so it is sent one and nothing is refused
        done = infer_cli(
            "generate", "--server", server.url or "", "Hi", "-n", "4", "--xtc-probability", "0.3"
        )
        assert done.returncode == 0, done.stderr
    finally:
        server.stop()


def cached_llama_server() -> Path | None:
    """A finished `llama-server` build in the llamacpp_build cache (None when none is cached)."""
    for stamp in sorted(lb.default_cache_dir().glob(f"build-*/{lb.SERVER_COMPLETE}")):
        binary = stamp.parent / "bin" / lb.SERVER_TARGET
        if binary.is_file():
            return binary
    return None


@pytest.fixture(scope="module")
def llama_server(default_model_path: Path) -> Iterator[str]:
    """`llama-server -t 2 -c 4096` on the default GGUF (skipped when no build is cached)."""
    binary = cached_llama_server()
    if binary is None:
        pytest.skip(
            f"no llama-server build cached in {lb.default_cache_dir()}: "
            "`python scripts/llamacpp_build.py --server` builds it (~10 minutes on 2 cores)"
        )
    port = _free_port()
    args = [str(binary), "-m", str(default_model_path), "--host", "127.0.0.1", "--port", str(port)]
    process = subprocess.Popen(
        [*args, "-t", "2", "-c", "4096"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert process.poll() is None and time.monotonic() < deadline, "llama-server did not start"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.mark.real_model
@pytest.mark.slow
def test_commands_against_llama_server(llama_server: str, tmp_path: Path) -> None:
    _commands_against(llama_server, tmp_path)
    shown = infer_cli("profiles", "show", "--server", llama_server, "--json")
    assert json.loads(shown.stdout)["remote"]["engine"] == "llama-server"


@pytest.mark.real_model
@pytest.mark.slow
def test_bless_then_check_on_llama_server_passes_five_times(llama_server: str, tmp_path: Path) -> None:
    anchors = tmp_path / "anchors.yaml"
    anchors.write_text((ROOT / "anchors" / "default.yaml").read_text(), encoding="utf-8")
    blessed = infer_cli("gate", str(anchors), "--bless", "--server", llama_server)
    assert blessed.returncode == 0, blessed.stdout + blessed.stderr
    for attempt in range(5):
        checked = infer_cli("gate", str(anchors), "--server", llama_server, "--json")
        payload = json.loads(checked.stdout)
        statuses = [a["status"] for a in payload["anchors"]]
        assert checked.returncode == 0 and statuses == ["pass"] * 7, (attempt, checked.stderr)
