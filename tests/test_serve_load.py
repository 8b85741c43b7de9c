"""Load on a real `infer serve` process: 32 concurrent streaming clients, 8 of which hang up early;
then a SIGTERM while a stream is in flight (it finishes, new requests are refused, exit status 0).

Bounded: 127.0.0.1 only, a fixed number of clients, every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from infer.cli.serve.launch import ServerProcess, start_server

pytestmark = [pytest.mark.real_model, pytest.mark.slow]  # a server process on the real model

CLIENTS = 32
HANG_UPS = 8
MAX_TOKENS = 8
PROMPTS = [
    "Name a fruit.",
    "What is two plus two?",
    "Say hello to Bob.",
    "Describe the colour blue.",
]


@pytest.fixture(scope="module")
def server(default_model_path: Path) -> Iterator[ServerProcess]:
    # One BLAS thread: on a small shared machine OpenBLAS's multi-threaded GEMM (which it switches to
    # for batches of ~16 rows and more) stalls when the cores are oversubscribed, making a 32-row decode
    # step 10-20x slower. This test is about correctness under concurrency, not BLAS scaling.
    process = start_server(
        [
            "-m",
            str(default_model_path),
            "-c",
            "1024",
            "--max-num-seqs",
            "32",
            "--temp",
            "0",
            "-t",
            "1",
            "--alias",
            "any",
        ]
    )
    yield process
    process.stop()  # the SIGTERM test normally stopped it already


def _messages(prompt: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": prompt}]


def _health(url: str) -> dict[str, Any]:
    return httpx.get(f"{url}/health", timeout=30).json()


def _wait_idle(url: str, seconds: float) -> dict[str, Any]:
    deadline = time.monotonic() + seconds
    health = _health(url)
    while (health["active_sequences"] or health["in_flight"]) and time.monotonic() < deadline:
        time.sleep(0.05)
        health = _health(url)
    return health


def test_concurrent_streams_with_hang_ups(server: ServerProcess) -> None:
    assert server.url is not None
    url = server.url
    sync = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
    # Each prompt's own, non-concurrent greedy answer (the server default is --temp 0).
    expected = {
        p: sync.chat.completions.create(model="any", messages=_messages(p), max_tokens=MAX_TOKENS)
        .choices[0]
        .message.content
        for p in PROMPTS
    }

    async def one_client(i: int, client: openai.AsyncOpenAI) -> tuple[int, str, str | None]:
        prompt = PROMPTS[i % len(PROMPTS)]
        hang_up = i < HANG_UPS
        # The clients that hang up ask for a long answer, so only a cancel can free their slots soon.
        stream = await client.chat.completions.create(
            model="any", messages=_messages(prompt), max_tokens=400 if hang_up else MAX_TOKENS, stream=True
        )
        text, finish, content_chunks = [], None, 0
        async for chunk in stream:
            if not chunk.choices:
                continue
            choice = chunk.choices[0]
            if choice.delta.content:
                text.append(choice.delta.content)
                content_chunks += 1
            finish = choice.finish_reason or finish
            if hang_up and content_chunks == 2:
                await stream.close()  # the client goes away mid-stream
                break
        return i, "".join(text), finish

    async def run_all() -> list[tuple[int, str, str | None]]:
        async with openai.AsyncOpenAI(
            base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300
        ) as client:
            return await asyncio.wait_for(
                asyncio.gather(*(one_client(i, client) for i in range(CLIENTS))), timeout=400
            )

    started = time.monotonic()
    results = asyncio.run(run_all())
    finished = time.monotonic()
    for i, text, finish in results:
        prompt = PROMPTS[i % len(PROMPTS)]
        if i < HANG_UPS:
            assert expected[prompt].startswith(text), (i, text)
            continue
        assert finish in ("stop", "length"), (i, finish)
        assert text == expected[prompt], (i, prompt, text, expected[prompt])
    # The hung-up requests (400 tokens asked) must already be gone: cancelled, not run to the end.
    health = _wait_idle(url, 10)
    assert health["active_sequences"] == 0 and health["in_flight"] == 0, health
    assert time.monotonic() - finished < 10
    print(f"\n{CLIENTS} clients in {finished - started:.1f} s")


def test_sigterm_finishes_in_flight_then_exits_zero(server: ServerProcess) -> None:
    assert server.url is not None
    url = server.url
    with httpx.Client(base_url=url, timeout=120) as http:
        body = {"messages": _messages(PROMPTS[0]), "max_tokens": 12, "stream": True, "ignore_eos": True}
        with http.stream("POST", "/v1/chat/completions", json=body) as response:
            assert response.status_code == 200
            lines = response.iter_lines()
            seen = []
            for line in lines:
                seen.append(line)
                if '"content"' in line:
                    break
            server.popen.send_signal(signal.SIGTERM)
            # New connections are refused (or answered 503) once shutdown began.
            deadline = time.monotonic() + 10
            refused = False
            while not refused and time.monotonic() < deadline:
                try:
                    status = httpx.get(f"{url}/health", timeout=5).status_code
                    refused = status == 503
                except httpx.TransportError:
                    refused = True
                time.sleep(0.05)
            assert refused
            seen.extend(lines)
    assert seen[-1] == "data: [DONE]" or seen[-2] == "data: [DONE]", seen[-3:]
    assert any('"finish_reason":"length"' in line for line in seen), seen[-3:]
    assert not any('"error"' in line for line in seen)
    assert server.popen.wait(60) == 0, server.stderr
