"""The server app in-process (uvicorn in a thread) over a real engine with a fault hook: engine failures
mid-stream, client disconnects freeing KV slots at once, the shutdown grace period, the API key.
"""

from __future__ import annotations

import asyncio
import json
import math
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import uvicorn
from fastapi.testclient import TestClient

from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.sse import dumps, json_safe
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.profiles.settings import Settings, resolve_settings

CHAT = "/v1/chat/completions"
MESSAGES = [{"role": "user", "content": "Tell me a long story about a dragon."}]


class Faults:
    """A fault hook the tests arm: fail the decode step `at` of whichever request runs then."""

    def __init__(self) -> None:
        self.at: int | None = None

    def __call__(self, request_id: str, phase: str, index: int) -> None:
        if self.at is not None and phase == "decode" and index == self.at:
            raise RuntimeError("injected fault")


# -- pure helpers (no model) -------------------------------------------------------------------------
def test_json_safe_never_emits_infinity() -> None:
    value = {"logprob": -math.inf, "x": [math.nan, 1.5, {"y": math.inf}], "ok": -0.25}
    assert json_safe(value) == {"logprob": None, "x": [None, 1.5, {"y": None}], "ok": -0.25}
    text = dumps(value)
    assert "Infinity" not in text and "NaN" not in text
    assert json.loads(text)["logprob"] is None


# -- the app over a real engine ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def faults() -> Faults:
    return Faults()


@pytest.fixture(scope="module")
def settings() -> Settings:
    return resolve_settings({"temperature": "0"}, env={})


@pytest.fixture(scope="module")
def engine(default_model_path: Path, faults: Faults) -> Engine:
    return load_engine(default_model_path, EngineConfig(ctx_size=1024, max_num_seqs=4, fault_hook=faults))


@pytest.fixture(scope="module")
def served(engine: Engine, settings: Settings) -> Iterator[tuple[str, Any]]:
    app = create_app(engine, settings, AppOptions("test-model", aliases=("m",)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.02)
    assert server.started
    yield f"http://127.0.0.1:{port}", app
    server.should_exit = True
    thread.join(30)
    sock.close()


@pytest.fixture
def url(served: tuple[str, Any], faults: Faults, engine: Engine) -> Iterator[str]:
    faults.at = None
    yield served[0]
    faults.at = None
    _wait_idle(engine, 10)


def _wait_idle(engine: Engine, seconds: float) -> int:
    deadline = time.monotonic() + seconds
    while engine.active_sequences and time.monotonic() < deadline:
        time.sleep(0.02)
    return engine.active_sequences


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.mark.real_model
def test_engine_failure_mid_stream_ends_with_error_event(url: str, faults: Faults, engine: Engine) -> None:
    faults.at = 3
    body = {"messages": MESSAGES, "max_tokens": 10, "stream": True}
    with httpx.stream("POST", f"{url}{CHAT}", json=body, timeout=120) as response:
        assert response.status_code == 200
        events = [line[6:] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])["error"]
    assert "decode step 3" in error["message"] and error["type"] == "server_error"
    text = "".join(
        c["choices"][0]["delta"].get("content", "") for c in map(json.loads, events[:-2]) if c["choices"]
    )
    assert text  # the tokens produced before the failure were delivered
    # The official client raises instead of returning a truncated answer as if it were complete.
    with pytest.raises(openai.APIError, match="decode step 3"):
        for _ in _client(url).chat.completions.create(
            model="m", messages=MESSAGES, max_tokens=10, stream=True
        ):
            pass
    assert _wait_idle(engine, 5) == 0


@pytest.mark.real_model
def test_engine_failure_whole_response_is_500(url: str, faults: Faults) -> None:
    faults.at = 2
    response = httpx.post(f"{url}{CHAT}", json={"messages": MESSAGES, "max_tokens": 6}, timeout=120)
    assert response.status_code == 500
    assert "decode step 2" in response.json()["error"]["message"]
    responses = httpx.post(f"{url}/v1/responses", json={"input": "hi", "max_output_tokens": 6}, timeout=120)
    assert responses.status_code == 500


@pytest.mark.real_model
def test_engine_failure_in_responses_stream(url: str, faults: Faults) -> None:
    faults.at = 2
    events = list(
        _client(url).responses.create(model="m", input="Tell a story.", max_output_tokens=8, stream=True)
    )
    assert [e.type for e in events[-2:]] == ["error", "response.failed"]
    assert events[-1].response.status == "failed" and "decode step 2" in events[-1].response.error.message


@pytest.mark.real_model
def test_stream_disconnect_frees_the_slot_at_once(url: str, engine: Engine) -> None:
    # ignore_eos: a sampled reply that ended on its own after two chunks left no slot to free (seen once)
    body = {"messages": MESSAGES, "max_tokens": 500, "stream": True, "ignore_eos": True}
    with httpx.stream("POST", f"{url}{CHAT}", json=body, timeout=120) as response:
        contents = 0
        for line in response.iter_lines():
            contents += '"content"' in line
            if contents == 2:
                break
        assert engine.active_sequences == 1
    started = time.monotonic()
    assert _wait_idle(engine, 5) == 0
    assert time.monotonic() - started < 5


@pytest.mark.real_model
def test_whole_response_disconnect_frees_the_slot(url: str, engine: Engine) -> None:
    async def give_up() -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            task = asyncio.ensure_future(
                client.post(f"{url}{CHAT}", json={"messages": MESSAGES, "max_tokens": 500})
            )
            deadline = time.monotonic() + 60
            while not engine.active_sequences and time.monotonic() < deadline:
                await asyncio.sleep(0.02)
            await asyncio.sleep(0.3)
            task.cancel()  # closes the connection mid-request

    asyncio.run(give_up())
    assert _wait_idle(engine, 5) == 0


@pytest.mark.real_model
def test_api_key_guards_every_route_but_health(engine: Engine, settings: Settings) -> None:
    # No `with`: the lifespan (which would start a second engine loop) does not run; these routes
    # do not need it.
    client = TestClient(create_app(engine, settings, AppOptions("m", api_key="sesame")))
    assert client.get("/health").status_code == 200
    denied = client.get("/v1/models")
    assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
    assert client.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.post(CHAT, json={"messages": MESSAGES}).status_code == 401
    allowed = client.get("/v1/models", headers={"Authorization": "Bearer sesame"})
    assert allowed.status_code == 200 and allowed.json()["data"][0]["id"] == "m"


@pytest.mark.real_model
def test_shutdown_refuses_new_requests_and_cancels_after_grace(
    url: str, served: tuple[str, Any], engine: Engine
) -> None:
    app = served[1]
    body = {"messages": MESSAGES, "max_tokens": 500, "stream": True}
    with httpx.stream("POST", f"{url}{CHAT}", json=body, timeout=120) as response:
        lines = response.iter_lines()
        for line in lines:
            if '"content"' in line:
                break
        app.state.ctx.bridge.begin_shutdown(app.state.loop, 0.5)
        refused = httpx.post(f"{url}{CHAT}", json={"messages": MESSAGES, "max_tokens": 2}, timeout=30)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "server_shutting_down"
        assert httpx.get(f"{url}/health", timeout=30).status_code == 503
        rest = [line for line in lines if line.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert "shutting down" in json.loads(rest[-2][6:])["error"]["message"]
    assert _wait_idle(engine, 5) == 0
    bridge = app.state.ctx.bridge  # what the shutdown line reports
    assert (bridge.in_flight_at_shutdown, bridge.cancelled_in_shutdown) == (1, 1)


@pytest.mark.real_model
def test_a_model_it_does_not_serve_is_404_and_aliases_are_served(engine: Engine, settings: Settings) -> None:
    """As OpenAI and vLLM: a request naming another model is not answered by this one."""
    client = TestClient(create_app(engine, settings, AppOptions("smol", aliases=("gpt-4o-mini",))))
    assert [m["id"] for m in client.get("/v1/models").json()["data"]] == ["smol", "gpt-4o-mini"]
    assert client.get("/v1/models/gpt-4o-mini").status_code == 200
    routes = (
        (CHAT, {"messages": MESSAGES, "max_tokens": 1}),
        ("/v1/completions", {"prompt": "Hi", "max_tokens": 1}),
        ("/v1/responses", {"input": "Hi", "max_output_tokens": 1}),
    )
    for route, body in routes:
        response = client.post(route, json={**body, "model": "gpt-4"})
        assert response.status_code == 404, response.text
        error = response.json()["error"]
        assert (
            error["code"] == "model_not_found" and error["param"] == "model" and "gpt-4" in error["message"]
        )
    assert client.get("/v1/models/gpt-4").json()["error"]["code"] == "model_not_found"


@pytest.mark.real_model
def test_accept_any_model_answers_every_name_with_the_served_model(
    engine: Engine, settings: Settings
) -> None:
    """--accept-any-model (llama-server's way): a hard-wired name is served by the one model, and the
    answer names the served model."""
    with TestClient(create_app(engine, settings, AppOptions("smol", accept_any_model=True))) as client:
        response = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1, "model": "gpt-4"})
        assert response.status_code == 200, response.text
        assert response.json()["model"] == "smol"
        assert client.get("/v1/models/gpt-4").status_code == 200


@pytest.mark.real_model
def test_a_full_queue_is_shed_with_503_and_retry_after(default_model_path: Path, settings: Settings) -> None:
    """max_queue: beyond it a request gets 503 `server_overloaded` with Retry-After (not an unbounded
    queue), /health shows the queue and the KV slots, and the queued request still completes."""
    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=1, max_queue=1))
    try:
        client = TestClient(create_app(engine, settings, AppOptions("m")))  # no lifespan: nothing steps
        queued = engine.submit(Request(prompt_ids=(1, 2, 3), max_tokens=2))
        health = client.get("/health").json()
        assert (health["waiting_sequences"], health["max_queue"]) == (1, 1)
        assert (health["kv_slots_used"], health["kv_slots_total"]) == (0, 1)
        shed = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 1})
        assert shed.status_code == 503, shed.text
        assert shed.json()["error"]["code"] == "server_overloaded"
        assert int(shed.headers["retry-after"]) >= 1
        assert len(queued.result().token_ids) == 2
        assert client.get("/health").json()["waiting_sequences"] == 0
    finally:
        engine.shutdown()


@pytest.mark.real_model
def test_metrics_count_requests_tokens_and_statuses(default_model_path: Path, settings: Settings) -> None:
    """/metrics in Prometheus text: a finished request moves the request, token and latency series,
    and each HTTP answer is counted by route and status."""
    from prometheus_client.parser import text_string_to_metric_families

    engine = load_engine(default_model_path, EngineConfig(ctx_size=256, max_num_seqs=2))
    with TestClient(create_app(engine, settings, AppOptions("m"))) as client:  # its own engine loop

        def scrape() -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
            response = client.get("/metrics")
            assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
            return {
                (s.name, tuple(sorted(s.labels.items()))): s.value
                for family in text_string_to_metric_families(response.text)
                for s in family.samples
            }

        def value(samples: dict, name: str, **labels: str) -> float:
            return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))

        before = scrape()
        answer = client.post(CHAT, json={"messages": MESSAGES, "max_tokens": 3}).json()
        assert client.post(CHAT, json={"messages": []}).status_code == 400
        after = scrape()
    usage = answer["usage"]
    grew = [
        value(after, name, **labels) - value(before, name, **labels)
        for name, labels in (
            ("infer:request_success_total", {"finished_reason": answer["choices"][0]["finish_reason"]}),
            ("infer:generation_tokens_total", {}),
            ("infer:prompt_tokens_total", {}),
            ("infer:time_to_first_token_seconds_count", {}),
            ("infer:http_requests_total", {"path": CHAT, "status": "200"}),
            ("infer:http_requests_total", {"path": CHAT, "status": "400"}),
        )
    ]
    assert grew == [1, usage["completion_tokens"], usage["prompt_tokens"], 1, 1, 1]
    assert value(after, "infer:num_requests_running") == 0
    assert 0 <= value(after, "infer:kv_cache_usage_perc") <= 1


@pytest.mark.real_model
def test_embeddings_are_a_501_that_says_why(url: str) -> None:
    """The official client's embeddings call gets a clear 501, not a bare 404."""
    with pytest.raises(openai.APIStatusError) as caught:
        _client(url).embeddings.create(model="any", input="hello")
    assert caught.value.status_code == 501
    error = caught.value.body
    assert isinstance(error, dict) and error.get("code") == "not_implemented", error
    assert "embeddings are not implemented" in str(error.get("message"))
