#!/usr/bin/env python
"""Throughput of `infer serve` at several concurrency levels: requests/s and tokens/s.

Starts a server on 127.0.0.1 (or uses `--url`), then for each level C runs C streaming clients, each
sending `--rounds` chat requests one after another (fixed length: `ignore_eos`, greedy), and prints a
table: requests/s, generated tokens/s, mean time to first token and mean request latency.

    python scripts/bench_serve.py                       # 1, 8 and 32 streams on the default model
    python scripts/bench_serve.py --url http://127.0.0.1:8080 --concurrency 1,4,16
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import httpx

from infer.cli.serve.launch import start_server

PROMPT = "Write a short story about a lighthouse keeper."


@dataclass
class LevelResult:
    """One concurrency level's figures."""

    concurrency: int
    requests: int
    errors: int
    seconds: float
    completion_tokens: int
    requests_per_s: float
    tokens_per_s: float
    mean_ttft_s: float
    mean_latency_s: float


async def _one_request(client: httpx.AsyncClient, max_tokens: int) -> tuple[int, float, float]:
    """(completion tokens, time to first token, latency) of one streamed chat request."""
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    started = time.perf_counter()
    first: float | None = None
    tokens = 0
    async with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            raise RuntimeError(f"HTTP {response.status_code}: {(await response.aread())[:200]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                raise RuntimeError(chunk["error"]["message"])
            if first is None and chunk.get("choices") and chunk["choices"][0]["delta"].get("content"):
                first = time.perf_counter() - started
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
    latency = time.perf_counter() - started
    return tokens, first if first is not None else latency, latency


async def run_level(url: str, concurrency: int, rounds: int, max_tokens: int) -> LevelResult:
    """C clients, each sending `rounds` requests back to back."""
    limits = httpx.Limits(max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        results: list[tuple[int, float, float]] = []
        errors = 0

        async def worker() -> None:
            nonlocal errors
            for _ in range(rounds):
                try:
                    results.append(await _one_request(client, max_tokens))
                except (RuntimeError, httpx.HTTPError) as exc:
                    errors += 1
                    print(f"  request failed: {exc}", file=sys.stderr)

        started = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        seconds = time.perf_counter() - started
    tokens = sum(r[0] for r in results)
    return LevelResult(
        concurrency=concurrency,
        requests=len(results),
        errors=errors,
        seconds=seconds,
        completion_tokens=tokens,
        requests_per_s=len(results) / seconds,
        tokens_per_s=tokens / seconds,
        mean_ttft_s=statistics.fmean(r[1] for r in results) if results else 0.0,
        mean_latency_s=statistics.fmean(r[2] for r in results) if results else 0.0,
    )


def print_table(results: list[LevelResult]) -> None:
    """A plain-text table on stdout."""
    header = (
        f"{'streams':>7} {'requests':>8} {'errors':>6} {'seconds':>8} {'req/s':>7} {'tok/s':>8} "
        f"{'TTFT s':>7} {'latency s':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.concurrency:>7} {r.requests:>8} {r.errors:>6} {r.seconds:>8.2f} {r.requests_per_s:>7.2f} "
            f"{r.tokens_per_s:>8.1f} {r.mean_ttft_s:>7.2f} {r.mean_latency_s:>9.2f}"
        )


def main() -> int:
    """Parse arguments, start (or reach) the server, run every level, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", help="an already running server (default: start one on 127.0.0.1)")
    parser.add_argument("--concurrency", default="1,8,32", help="comma-separated stream counts")
    parser.add_argument("--rounds", type=int, default=2, help="requests each client sends in turn")
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens generated per request")
    parser.add_argument("--json", action="store_true", help="print the figures as JSON instead of a table")
    parser.add_argument(
        "server_args",
        nargs=argparse.REMAINDER,
        help="after --, arguments for `infer serve` (default: -c 2048 --max-num-seqs 32)",
    )
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    server = None
    url = args.url
    if url is None:
        extra = [a for a in args.server_args if a != "--"] or [
            "-c",
            "2048",
            "--max-num-seqs",
            str(max(levels)),
        ]
        print(f"starting infer serve {' '.join(extra)} ...", file=sys.stderr)
        server = start_server(extra)
        url = server.url
        print(f"server ready at {url} after {server.startup_seconds:.1f} s", file=sys.stderr)
    assert url is not None
    try:
        # One short request first, so the first level does not pay for warm-up.
        asyncio.run(run_level(url, 1, 1, 2))
        results = []
        for level in levels:
            print(f"running {level} concurrent streams ...", file=sys.stderr)
            results.append(asyncio.run(run_level(url, level, args.rounds, args.max_tokens)))
    finally:
        if server is not None:
            server.stop()
    if args.json:
        print(json.dumps([asdict(r) for r in results], indent=2))
    else:
        print_table(results)
    return 1 if any(r.errors for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
