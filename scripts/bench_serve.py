#!/usr/bin/env python
"""Serving throughput side by side: the bare engine, `infer serve`, and llama.cpp's `llama-server`.

    python scripts/bench_serve.py [--concurrency 1,4,16,64] [-n 64] [--prompt 32] [--no-llamacpp]

Every figure comes from one tool, `infer bench`'s concurrent decode sweep (C streams, each a
`--prompt`-token prompt and `-n` generated tokens, aggregate tok/s and TTFT percentiles):
  * bare engine: `infer bench` on a local engine (the step loop with no HTTP in between);
  * infer serve: `infer bench --server URL` against `infer serve --max-num-seqs max(C)`;
  * llama-server: `infer bench --server URL` against `llama-server -np C` (built from the
    llama-cpp-python sdist into the cache folder by scripts/llamacpp_build.py), same GGUF, prompts
    and lengths, one server per level since -np fixes its parallel slots.
Prints the table and the ratios issue 20 sets targets on: infer serve >= 0.9x the bare engine at 16
and 64 streams; >= 1.5x llama-server's tok/s at 16 streams with TTFT p99 no worse.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))

from llamacpp_build import cpuinfo_flags, default_cache_dir, ensure_server_built

from infer.cli.model_store import ensure_default_model
from infer.cli.serve.launch import start_server

Row = dict[str, float]


def infer_bench(levels: list[int], n: int, prompt: int, extra: list[str]) -> dict[int, Row]:
    """`infer bench`'s concurrency sweep (local engine, or a server through `extra`): per level,
    aggregate tok/s and TTFT p50/p99 in ms."""
    command = [
        sys.executable, "-c", "from infer.cli.main import main; main()", "bench",
        "--concurrency", ",".join(map(str, levels)), "--concurrency-prompt", str(prompt),
        "-n", str(n), "-p", "16", "-r", "1", "--json", *extra,
    ]  # fmt: skip
    proc = subprocess.run(command, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"infer bench failed: {proc.stderr.strip().splitlines()[-1:]}")
    rows: dict[int, Row] = {}
    for record in json.loads(proc.stdout)["results"]:
        if record["kind"] == "conc":
            ttft = record.get("ttft_ms") or {}
            rows[record["concurrency"]] = {
                "tps": record["tps_mean"],
                "ttft_p50": ttft.get("p50", float("nan")),
                "ttft_p99": ttft.get("p99", float("nan")),
                "errors": record["errors"],
            }
    return rows


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def llama_server_level(binary: Path, model: Path, level: int, n: int, prompt: int) -> Row:
    """One level against `llama-server -np level` on 2 threads (a fresh server per level)."""
    port = free_port()
    ctx = level * (prompt + n + 64)
    args = [str(binary), "-m", str(model), "--host", "127.0.0.1", "--port", str(port), "-np", str(level)]
    args += ["-c", str(ctx), "-t", str(os.cpu_count() or 2), "--log-disable"]
    server = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise SystemExit("llama-server did not become healthy in 120 s")
        return infer_bench([level], n, prompt, ["--server", url, "--api", "completions"])[level]
    finally:
        server.terminate()
        server.wait(timeout=30)


def main() -> int:
    """Run the three columns and print the table and the target ratios."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("-n", type=int, default=64, help="tokens generated per request")
    parser.add_argument("--prompt", type=int, default=32, help="prompt tokens per request")
    parser.add_argument("--no-llamacpp", action="store_true", help="skip the llama-server column")
    args = parser.parse_args()
    levels = [int(c) for c in args.concurrency.split(",") if c.strip()]
    model = ensure_default_model()
    print("bare engine ...", file=sys.stderr)
    bare = infer_bench(levels, args.n, args.prompt, ["-m", str(model)])
    print("infer serve ...", file=sys.stderr)
    server = start_server(["-m", str(model), "-c", "4096", "--max-num-seqs", str(max(levels))])
    try:
        served = infer_bench(levels, args.n, args.prompt, ["--server", server.url, "--api", "completions"])
    finally:
        server.stop()
    llama: dict[int, Row] = {}
    if not args.no_llamacpp:
        flags = cpuinfo_flags(Path("/proc/cpuinfo").read_text())
        binary = ensure_server_built(default_cache_dir(), flags)
        for level in levels:
            print(f"llama-server -np {level} ...", file=sys.stderr)
            llama[level] = llama_server_level(binary, model, level, args.n, args.prompt)

    print(
        f"default model, prompt {args.prompt} + {args.n} generated tokens per stream, {os.cpu_count()} cores"
    )
    head = f"{'streams':>7}  {'bare tok/s':>10}  {'serve tok/s':>11}  {'serve/bare':>10}  "
    print(head + f"{'llama tok/s':>11}  {'serve/llama':>11}  {'TTFT p99 serve':>14}  {'TTFT p99 llama':>14}")
    for level in levels:
        b, s, ll = bare[level], served[level], llama.get(level)
        print(
            f"{level:>7}  {b['tps']:>10.1f}  {s['tps']:>11.1f}  {s['tps'] / b['tps']:>9.2f}x  "
            + (f"{ll['tps']:>11.1f}  {s['tps'] / ll['tps']:>10.2f}x  " if ll else f"{'-':>11}  {'-':>11}  ")
            + f"{s['ttft_p99']:>12.0f}ms  "
            + (f"{ll['ttft_p99']:>12.0f}ms" if ll else f"{'-':>14}")
        )
    errors = sum(r["errors"] for r in [*bare.values(), *served.values(), *llama.values()])
    print("targets: serve >= 0.9x bare at 16 and 64 streams; >= 1.5x llama-server at 16, TTFT p99 no worse")
    print(f"failed requests: {errors}")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
