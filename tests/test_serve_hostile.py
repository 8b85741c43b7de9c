"""Issue 19 through a real `infer serve` on a tiny synthetic model: extreme sampler settings (rows 1-4),
hostile chat templates (rows 5-8), SIGTERM with a stream in flight (row 9), lone surrogates in `stop`
(row 11), an empty body (row 12) and the OpenAPI document (row 13). Property tests drive every float
field through the server, too."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as hs

from infer.cli.serve.launch import ServerProcess, start_server
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
FLOAT_FIELDS = [f for f, t in SamplingParams.field_input_types().items() if t is float]
EXTREMES = [
    0.0, 5e-324, 1e-130, 1e-45, 1e-5, 0.5, 1.0, 1e4, 1e6, 3e38, 1e39, 1e308, -1e-45, -1.0, -1e308,
]  # fmt: skip
NESTED_LOOPS = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"


def _children(pid: int) -> list[int]:
    """Live child processes of `pid` (Linux /proc)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == pid and fields[0] != "Z":
            out.append(int(entry.name))
    return out


@pytest.fixture(scope="module")
def server(tiny_server: ServerProcess) -> ServerProcess:
    return tiny_server


@pytest.fixture(scope="module")
def http(tiny_http: httpx.Client) -> httpx.Client:
    return tiny_http


def _error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    if param is not None:
        assert error["param"] == param, error
    return error


# -- rows 1-4: sampler settings --------------------------------------------------------------------------
@pytest.mark.parametrize("huge", [1e308, 1e39, 3e38])
def test_row1_huge_logit_bias_is_400_whole_and_streamed(http: httpx.Client, huge: float) -> None:
    body = {"prompt": "hi", "max_tokens": 4, "temperature": 0.8, "logit_bias": {"5": huge}}
    _error(http.post(COMPLETIONS, json=body), 400, "logit_bias")
    chat = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "logit_bias": {"5": huge}}
    _error(http.post(CHAT, json=chat), 400, "logit_bias")  # refused before the stream starts


def test_row2_tiny_temperature_is_greedy(http: httpx.Client) -> None:
    base = {"prompt": "hello", "max_tokens": 6, "ignore_eos": True}
    greedy = http.post(COMPLETIONS, json={**base, "temperature": 0}).json()["choices"][0]["text"]
    tiny = http.post(COMPLETIONS, json={**base, "temperature": 1e-45})
    assert tiny.status_code == 200 and tiny.json()["choices"][0]["text"] == greedy


@pytest.mark.parametrize("tiny", [1e-40, 5.46e-130])
def test_row3_tiny_repeat_penalty_is_400(http: httpx.Client, tiny: float) -> None:
    _error(http.post(COMPLETIONS, json={"prompt": "hi", "repeat_penalty": tiny}), 400, "repeat_penalty")


def test_row4_many_logit_bias_entries_do_not_freeze_the_server(
    http: httpx.Client, server: ServerProcess
) -> None:
    results: dict[str, Any] = {}

    def big() -> None:
        bias = {str(i): 1.0 for i in range(40_000)}  # 40,000 entries (this vocabulary has 316 tokens)
        started = time.monotonic()
        results["big"] = httpx.post(f"{server.url}{COMPLETIONS}", json={"prompt": "a", "max_tokens": 1,
                                    "logit_bias": bias}, timeout=60)  # fmt: skip
        results["seconds"] = time.monotonic() - started

    thread = threading.Thread(target=big)
    thread.start()
    health_times = []
    while thread.is_alive():
        started = time.monotonic()
        assert http.get("/health").status_code == 200
        health_times.append(time.monotonic() - started)
    thread.join()
    _error(results["big"], 400, "logit_bias")
    assert results["seconds"] < 10, results["seconds"]
    assert max(health_times) < 5, health_times
    # within the vocabulary, every token biased: accepted, one vectorised add per step
    full = {str(i): -1.0 for i in range(316)}
    ok = http.post(COMPLETIONS, json={"prompt": "a", "max_tokens": 2, "logit_bias": full})
    assert ok.status_code == 200, ok.text
    banned = {str(i): -1e999 for i in range(316)}  # -1e999 parses as -inf: every token banned
    raw = json.dumps({"prompt": "a", "max_tokens": 2, "logit_bias": banned}).replace("-Infinity", "-1e999")
    _error(
        http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"}), 400, "logit_bias"
    )


SERVER_PROPERTY = settings(
    max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck)
)


@SERVER_PROPERTY
@given(
    values=hs.dictionaries(hs.sampled_from(FLOAT_FIELDS), hs.sampled_from(EXTREMES), min_size=1, max_size=3),
    stream=hs.booleans(),
    mirostat=hs.sampled_from([0, 1, 2]),
)
def test_every_float_field_through_the_server_is_400_or_200(
    http: httpx.Client, values: dict[str, float], stream: bool, mirostat: int
) -> None:
    body = {"prompt": "hi there", "max_tokens": 3, "stream": stream, "mirostat": mirostat, **values}
    response = http.post(COMPLETIONS, json=body)
    if response.status_code == 400:
        error = response.json()["error"]
        assert error["param"] in values, (values, error)
        return
    assert response.status_code == 200, (values, response.text)
    if stream:
        assert '"error"' not in response.text, (values, response.text[-300:])
        assert response.text.rstrip().endswith("data: [DONE]")
    else:
        assert response.json()["choices"][0]["finish_reason"] in ("stop", "length")


# -- rows 11-12: input text ---------------------------------------------------------------------------
def test_row11_lone_surrogate_in_stop_is_400(http: httpx.Client) -> None:
    for stop in ('"\\ud800"', '["ok", "\\udfff"]'):
        raw = '{"prompt": "hi", "max_tokens": 2, "stop": ' + stop + "}"
        _error(http.post(COMPLETIONS, content=raw, headers={"content-type": "application/json"}), 400, "stop")


@pytest.mark.parametrize(
    ("route", "param"), [(CHAT, "messages"), (COMPLETIONS, "prompt"), ("/v1/responses", "input")]
)
def test_row12_empty_body_names_the_field_to_send(http: httpx.Client, route: str, param: str) -> None:
    error = _error(http.post(route, content=b"", headers={"content-type": "application/json"}), 400, param)
    assert "empty" in error["message"]
    _error(http.post(route), 400, param)


# -- row 13: the OpenAPI document ---------------------------------------------------------------------
def test_row13_openapi_describes_real_responses(http: httpx.Client) -> None:
    document = http.get("/openapi.json").json()
    assert "422" not in json.dumps(document["paths"])
    schemas = document["components"]["schemas"]
    assert "HTTPValidationError" not in schemas
    for path in (CHAT, COMPLETIONS, "/v1/responses"):
        responses = document["paths"][path]["post"]["responses"]
        assert responses["200"]["content"]["application/json"]["schema"]["$ref"].endswith(
            ("ChatCompletion", "Completion", "ResponseObject")
        )
        assert "text/event-stream" in responses["200"]["content"]
        for status in ("400", "401", "404", "405", "413", "503"):
            assert responses[status]["content"]["application/json"]["schema"]["$ref"].endswith(
                "ErrorResponse"
            )
    chat = schemas["ChatCompletionRequest"]["properties"]
    assert chat["top_p"]["exclusiveMinimum"] == 0 and chat["top_p"]["maximum"] == 1
    assert chat["repeat_penalty"]["minimum"] == 1e-6 and chat["repeat_penalty"]["maximum"] == 1e6
    assert chat["temperature"]["maximum"] == 1e4 and "minimum" not in chat["temperature"]
    bias_values = chat["logit_bias"]["anyOf"][0]["additionalProperties"]
    assert bias_values["minimum"] == -1e4 and bias_values["maximum"] == 1e4
    # the documented 200 body is what the server sends
    reply = http.post(COMPLETIONS, json={"prompt": "hi", "max_tokens": 2}).json()
    for key in schemas["Completion"]["required"]:
        assert key in reply, key


# -- rows 5-9: a model with a hostile chat template, then SIGTERM -------------------------------------
@pytest.fixture(scope="module")
def hostile_server(tiny_hf_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("hostile") / "model"
    shutil.copytree(tiny_hf_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    # the template's own messages pick the attack, so one model carries the whole corpus
    config["chat_template"] = (
        "{% set attack = messages[-1]['content'] %}"
        "{% if attack == 'range' %}{% for i in range(1000000000) %}{% endfor %}"
        "{% elif attack == 'recursion' %}{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
        "{% elif attack == 'loops' %}" + NESTED_LOOPS + "{% elif attack == 'bomb' %}{{ 'x' * 10000000000 }}"
        "{% elif attack == 'doubling' %}{% set ns = namespace(s='x') %}{% for i in range(40) %}"
        "{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}"
        "{% else %}{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "<|im_start|>assistant\n{% endif %}"
    )
    config_path.write_text(json.dumps(config))
    process = start_server(["-m", str(folder), "-c", "1024", "--shutdown-grace", "20"])
    yield process
    process.stop()


@pytest.mark.parametrize("attack", ["range", "recursion", "loops", "bomb", "doubling"])
def test_rows5_to_8_hostile_templates_are_400_invalid_chat_template(
    hostile_server: ServerProcess, attack: str
) -> None:
    url = hostile_server.url
    started = time.monotonic()
    body = {"messages": [{"role": "user", "content": attack}], "max_tokens": 2}
    error = _error(httpx.post(f"{url}{CHAT}", json=body, timeout=60), 400, "messages")
    assert error["code"] == "invalid_chat_template" and "\n" not in error["message"], error
    assert time.monotonic() - started < 10
    responses = httpx.post(f"{url}/v1/responses", json={"input": attack, "max_output_tokens": 2}, timeout=60)
    assert _error(responses, 400, "input")["code"] == "invalid_chat_template"
    # nothing keeps running: at most the one (idle) template worker is left, and it is small
    children = _children(hostile_server.popen.pid)
    assert len(children) <= 1, children
    for child in children:
        rss_kb = int(
            next(
                line
                for line in Path(f"/proc/{child}/status").read_text().splitlines()
                if line.startswith("VmRSS")
            ).split()[1]
        )
        assert rss_kb < 300_000, rss_kb
    ok = httpx.post(f"{url}{CHAT}", json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert ok.status_code == 200, ok.text


def test_row7_a_client_that_leaves_during_a_render_leaves_nothing_running(
    hostile_server: ServerProcess,
) -> None:
    body = {"messages": [{"role": "user", "content": "loops"}], "max_tokens": 2}
    with pytest.raises(httpx.TimeoutException):
        httpx.post(f"{hostile_server.url}{CHAT}", json=body, timeout=0.5)
    time.sleep(4)  # the render's 2 s limit, then the worker is killed
    assert len(_children(hostile_server.popen.pid)) <= 1
    assert httpx.get(f"{hostile_server.url}/health", timeout=10).json()["status"] == "ok"


def test_row9_sigterm_drains_with_503_and_retry_after(hostile_server: ServerProcess) -> None:
    url = hostile_server.url
    assert url is not None
    # long enough that the stream is still in flight when the new request below arrives, even with the
    # other test worker busy beside it (150 tokens finished first once: the server had exited, refused)
    body = {"prompt": "once upon a time", "max_tokens": 900, "ignore_eos": True, "stream": True}
    lines: list[str] = []
    with httpx.stream("POST", f"{url}{COMPLETIONS}", json=body, timeout=60) as response:
        iterator = response.iter_lines()
        for line in iterator:
            lines.append(line)
            if '"text"' in line:
                break
        hostile_server.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        health = httpx.get(f"{url}/health", timeout=5)
        while health.status_code == 200 and time.monotonic() < deadline:
            health = httpx.get(f"{url}/health", timeout=5)
        assert health.status_code == 503 and health.json()["status"] == "shutting_down"
        assert health.headers["retry-after"].isdigit()
        refused = httpx.post(f"{url}{COMPLETIONS}", json={"prompt": "hi", "max_tokens": 2}, timeout=10)
        assert refused.status_code == 503 and refused.headers["retry-after"].isdigit()
        assert refused.json()["error"]["code"] == "server_shutting_down"
        lines.extend(iterator)
    data = [line for line in lines if line.startswith("data: ")]
    assert data[-1] == "data: [DONE]"
    assert any('"finish_reason":"length"' in line for line in data), data[-3:]  # it finished in the grace
    assert hostile_server.popen.wait(60) == 0, hostile_server.stderr
    assert "Traceback" not in hostile_server.stderr
