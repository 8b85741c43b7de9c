"""A burst against a bounded queue (issue 20's acceptance): 500 requests at once against `infer serve
--max-queue 100 --max-num-seqs 4` on the default model. The excess gets 503 `server_overloaded` with
Retry-After, every admitted request completes with the very tokens it gets alone, and the server is
alive and idle afterwards."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from infer.cli.serve.launch import ServerProcess, start_server

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

BURST, MAX_QUEUE, SLOTS, TOKENS = 500, 100, 4, 4


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    process = start_server(
        [
            "-m",
            str(default_model_path),
            "-c",
            "256",
            "--max-num-seqs",
            str(SLOTS),
            "--max-queue",
            str(MAX_QUEUE),
        ]
    )
    yield process
    assert process.stop() == 0, process.stderr


def _body(i: int) -> dict:
    return {
        "prompt": f"Item {i}: the weather today is",
        "max_tokens": TOKENS,
        "temperature": 0.8,
        "seed": 1000 + i,
        "ignore_eos": True,
        "return_token_ids": True,
    }


async def _burst(url: str) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=BURST, max_keepalive_connections=0)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        return await asyncio.gather(*(client.post("/v1/completions", json=_body(i)) for i in range(BURST)))


def test_a_burst_is_shed_past_the_queue_and_the_rest_is_served_exactly(server: ServerProcess) -> None:
    replies = asyncio.run(_burst(server.url))
    served = {i: r.json() for i, r in enumerate(replies) if r.status_code == 200}
    shed = [r for r in replies if r.status_code == 503]
    assert len(served) + len(shed) == BURST, sorted({r.status_code for r in replies})
    assert shed, "a burst five times the queue must shed something"
    # The queue was used, not refused early. Not MAX_QUEUE + SLOTS: when the whole burst is submitted
    # before the step thread hands out the first slot, only the queue's 100 are in (a CI run saw 103).
    assert len(served) >= MAX_QUEUE
    for reply in shed:
        assert reply.json()["error"]["code"] == "server_overloaded"
        assert int(reply.headers["retry-after"]) >= 1
    for body in served.values():
        choice = body["choices"][0]
        assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == TOKENS
    with httpx.Client(base_url=server.url, timeout=300) as client:
        for i in random.Random(0).sample(sorted(served), 8):  # the same tokens alone as in the burst
            alone = client.post("/v1/completions", json=_body(i)).json()
            assert alone["choices"][0]["token_ids"] == served[i]["choices"][0]["token_ids"], i
        health = client.get("/health").json()
    assert health["waiting_sequences"] == 0 and health["kv_slots_used"] == 0
