"""The server's access log (cli/serve/access_log.py): one stderr line per request with the figures the
response's own `usage` gives, `--log-format json`, `--quiet`, and the shutdown line of a real process."""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.launch import start_server
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.profiles.settings import resolve_settings

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

BODY = {"prompt": "hello the sea", "max_tokens": 6, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Iterator[Engine]:
    engine = load_engine(tiny_gguf, EngineConfig(ctx_size=128, max_num_seqs=4))
    yield engine
    engine.shutdown()


def serve(engine: Engine, **options: object) -> TestClient:
    settings = resolve_settings({}, env={})
    return TestClient(create_app(engine, settings, AppOptions("tiny", **options)))  # type: ignore[arg-type]


def test_a_line_per_request_with_the_usage_the_response_reports(
    engine: Engine, capsys: pytest.CaptureFixture[str]
) -> None:
    with serve(engine) as client:
        capsys.readouterr()
        usage = client.post("/v1/completions", json=BODY).json()["usage"]
        streamed = client.post(
            "/v1/completions",
            json={**BODY, "n": 2, "stream": True, "stream_options": {"include_usage": True}},
        )
        chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
        stream_usage = chunks[-1]["usage"]
        assert client.get("/v1/nothing-here").status_code == 404
        lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 3, lines
    first = re.fullmatch(
        r"infer serve: POST /v1/completions 200 \S+ prompt (\d+) completion (\d+) ttft \d+ ms "
        r"total \d+ ms finish length",
        lines[0],
    )
    assert first, lines[0]
    assert (
        (int(first[1]), int(first[2]))
        == (usage["prompt_tokens"], usage["completion_tokens"])
        == (
            usage["prompt_tokens"],
            6,
        )
    )
    figures = f"prompt {stream_usage['prompt_tokens']} completion {stream_usage['completion_tokens']} "
    assert figures in lines[1]
    assert stream_usage["completion_tokens"] == 12
    assert re.fullmatch(r"infer serve: GET /v1/nothing-here 404 \S+ total \d+ ms", lines[2]), lines[2]


def test_json_lines_and_quiet(engine: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    with serve(engine, log_format="json") as client:
        capsys.readouterr()
        usage = client.post("/v1/completions", json=BODY).json()["usage"]
        (line,) = capsys.readouterr().err.splitlines()
    entry = json.loads(line)
    assert entry["event"] == "request" and entry["method"] == "POST" and entry["path"] == "/v1/completions"
    assert (entry["status"], entry["finish_reason"]) == (200, "length")
    assert (entry["prompt_tokens"], entry["completion_tokens"]) == (
        usage["prompt_tokens"],
        usage["completion_tokens"],
    )
    assert 0 < entry["ttft_ms"] <= entry["total_ms"]
    with serve(engine, quiet=True) as client:
        capsys.readouterr()
        assert client.post("/v1/completions", json=BODY).status_code == 200
        assert capsys.readouterr().err == ""


def test_the_process_logs_each_request_and_what_shutdown_drained(tiny_gguf: Path) -> None:
    process = start_server(["-m", str(tiny_gguf), "-c", "128", "--shutdown-grace", "30"])
    assert process.url is not None
    with httpx.Client(base_url=process.url, timeout=60) as http:
        assert http.post("/v1/completions", json=BODY).status_code == 200
        body = {**BODY, "max_tokens": 40, "stream": True}
        with http.stream("POST", "/v1/completions", json=body) as response:
            lines = response.iter_lines()
            for line in lines:
                if '"text"' in line:
                    break
            process.popen.send_signal(signal.SIGTERM)
            rest = list(lines)
    assert "data: [DONE]" in rest and not any('"error"' in line for line in rest)
    assert process.stop() == 0, process.stderr
    log = process.stderr.splitlines()
    requests = [line for line in log if line.startswith("infer serve: POST /v1/completions 200")]
    assert len(requests) == 2 and "completion 6 " in requests[0] and "completion 40 " in requests[1], log
    # the tiny model may finish the stream before the signal lands: 0 or 1 in flight, none cancelled
    shutdown = re.fullmatch(
        r"infer serve: shut down: ([01]) engine requests in flight, \1 finished, 0 cancelled; "
        r"served 2 HTTP requests, 46 tokens in \d+ s",
        log[-1],
    )
    assert shutdown, log
