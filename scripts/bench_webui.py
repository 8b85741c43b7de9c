#!/usr/bin/env python
"""What the chat page costs `infer serve` (issue 35: nothing beyond 50 ms at start-up, nothing per request).

    python scripts/bench_webui.py [--rounds 3] [-n 32] [--concurrency 1,4]

Four figures, with the page (the default) and with `--no-webui`, rounds alternating so load drift on
the machine hits both alike:
  * in-process: `create_app` (the only start-up work the page adds: two routes), the median of 300
    builds, and `GET /v1/models` through the whole app (middleware, routing; no socket), the median of
    3,000 requests, each way over one loaded engine (`--rounds 0`: only these);
  * start-up: spawn to "listening" of a real `infer serve` (model load included), per round;
  * paired requests: both servers up at once, one streamed 16-token greedy chat request to each in
    turn (`--pairs`), so load drift hits both alike: median TTFT, e2e and paired difference;
  * request latency: `infer bench --server URL -p 64 -n N --concurrency ...` against each server
    (TTFT, ITL and e2e, t/s), per round; then `infer bench compare` of the two sides' medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from infer.cli.model_store import ensure_default_model
from infer.cli.serve.app import AppOptions, create_app
from infer.cli.serve.launch import start_server
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.profiles.settings import resolve_settings

CLI = [sys.executable, "-c", "from infer.cli.main import main; main()"]


def app_figures(repeats: int) -> dict[str, dict[str, float]]:
    """Per side: the median milliseconds of one `create_app` and the median microseconds of one
    `GET /v1/models` through the whole app (middleware, routing) in-process, no socket."""
    engine = load_engine(ensure_default_model(), EngineConfig(ctx_size=256, max_num_seqs=2))
    settings = resolve_settings({}, env={})
    builds: dict[str, list[float]] = {"page": [], "no page": []}
    requests: dict[str, list[float]] = {"page": [], "no page": []}
    for index, webui in enumerate((True, False) * 4):  # alternating; the first pair only warms up
        side = "page" if webui else "no page"
        for _ in range(repeats):
            started = time.perf_counter()
            app = create_app(engine, settings, AppOptions("m", webui=webui))
            elapsed = (time.perf_counter() - started) * 1000
            if index >= 2:
                builds[side].append(elapsed)
        timings = asyncio.run(_request_us(app, repeats * 10))
        if index >= 2:
            requests[side] += timings
    return {
        side: {
            "create_app_ms": statistics.median(builds[side]),
            "request_us": statistics.median(requests[side]),
        }
        for side in builds
    }


async def _request_us(app: object, count: int) -> list[float]:
    transport = httpx.ASGITransport(app=app)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        times = []
        for _ in range(count):
            started = time.perf_counter()
            response = await client.get("/v1/models")
            times.append((time.perf_counter() - started) * 1e6)
            assert response.status_code == 200
    return times


def bench_server(url: str, n: int, levels: str, path: Path) -> dict:
    command = [*CLI, "bench", "--server", url, "-p", "64", "-n", str(n), "--concurrency", levels]
    command += ["--concurrency-prompt", "32", "-r", "3", "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3600, check=True)
    path.write_text(done.stdout)
    return json.loads(done.stdout)


def timed_chat(client: httpx.Client, url: str) -> tuple[float, float]:
    """(TTFT, e2e) in ms of one streamed greedy chat request of 16 tokens."""
    body = {
        "messages": [{"role": "user", "content": "Count from one to twenty."}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
    }
    started = time.perf_counter()
    first = None
    with client.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if first is None and '"content"' in line:
                first = time.perf_counter()
    ended = time.perf_counter()
    return ((first or ended) - started) * 1000, (ended - started) * 1000


def paired(requests: int) -> None:
    """Both servers up at once, requests sent to them in turn (ABBA), so the load on the machine at
    any moment hits both alike: median TTFT and e2e of each, and the median paired difference."""
    servers = {"page": start_server(["-t", "2"]), "no page": start_server(["--no-webui", "-t", "2"])}
    times: dict[str, list[tuple[float, float]]] = {side: [] for side in servers}
    try:
        with httpx.Client() as client:
            for server in servers.values():  # warm-up, not counted
                timed_chat(client, server.url or "")
            for index in range(requests):
                order = ["page", "no page"] if index % 2 == 0 else ["no page", "page"]
                for side in order:
                    times[side].append(timed_chat(client, servers[side].url or ""))
    finally:
        for server in servers.values():
            server.stop()
    for i, name in enumerate(("TTFT", "e2e")):
        page = [t[i] for t in times["page"]]
        bare = [t[i] for t in times["no page"]]
        diff = statistics.median(a - b for a, b in zip(page, bare, strict=True))
        print(
            f"paired {name}: page {statistics.median(page):.1f} ms, "
            f"no page {statistics.median(bare):.1f} ms, "
            f"median difference {diff:+.1f} ms over {requests} pairs"
        )


def median_run(paths: list[Path]) -> dict:
    """One bench JSON whose every figure is the median over `paths` (the rounds of one side)."""
    runs = [json.loads(p.read_text()) for p in paths]
    merged = {**runs[0], "results": []}
    for index, first in enumerate(runs[0]["results"]):
        records = [run["results"][index] for run in runs]
        record = {**first, "tps_mean": statistics.median(r["tps_mean"] for r in records)}
        for key in ("ttft_ms", "itl_ms", "e2e_ms"):
            if all(r.get(key) for r in records):
                record[key] = {s: statistics.median(r[key][s] for r in records) for s in first[key]}
        merged["results"].append(record)
    return merged


def main() -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("-n", type=int, default=32)
    parser.add_argument("--concurrency", default="1,4")
    parser.add_argument("--pairs", type=int, default=100, help="Paired requests (0: none).")
    args = parser.parse_args()
    for side, figures in app_figures(100).items():
        print(
            f"{side}: create_app {figures['create_app_ms']:.2f} ms, "
            f"GET /v1/models in-process {figures['request_us']:.0f} us",
            flush=True,
        )
    if args.pairs:
        paired(args.pairs)
    if args.rounds == 0:
        return
    folder = Path(tempfile.mkdtemp(prefix="bench_webui_"))
    startup: dict[str, list[float]] = {"page": [], "no page": []}
    runs: dict[str, list[Path]] = {"page": [], "no page": []}
    for round_ in range(args.rounds):
        sides = [("page", []), ("no page", ["--no-webui"])]
        for side, extra in sides if round_ % 2 == 0 else sides[::-1]:  # neither side always first
            server = start_server([*extra, "-t", "2"])
            startup[side].append(server.startup_seconds)
            try:
                path = folder / f"{side.replace(' ', '_')}_{round_}.json"
                bench_server(server.url or "", args.n, args.concurrency, path)
                runs[side].append(path)
            finally:
                server.stop()
            print(f"round {round_ + 1} {side}: start-up {server.startup_seconds:.2f} s", flush=True)
    for side, values in startup.items():
        print(f"start-up {side}: median {statistics.median(values):.2f} s over {values}")
    medians = []
    for side in ("no page", "page"):
        path = folder / f"{side.replace(' ', '_')}_median.json"
        path.write_text(json.dumps(median_run(runs[side])))
        medians.append(str(path))
    compare = [*CLI, "bench", "compare", *medians]
    print(subprocess.run(compare, capture_output=True, text=True, timeout=600, env=None).stdout)
    print(f"runs kept in {folder}")


if __name__ == "__main__":
    main()
