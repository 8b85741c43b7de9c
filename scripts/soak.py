#!/usr/bin/env python
"""Soak `infer serve`: a mixed hostile load for a set time, then checks that nothing leaked or broke.

Starts `infer serve` on 127.0.0.1 and runs `--clients` concurrent clients for `--minutes`, each picking
at random: a greedy request (whole or streamed) whose text must equal its solo reference, a seeded
sampled stream, a stream it hangs up on after a few chunks, a whole request it cancels mid-flight, a
hostile body (extreme floats, lone surrogates, huge logit_bias, broken JSON, an empty body, ...) that
must be answered 4xx, or a /health or /v1/models probe. At the end:

* no KV slot is held (`/health`: `active_sequences` and `in_flight` both 0);
* the server's RSS grew by less than `--max-rss-growth` (5 %) from the end of the warm-up (the median
  of the first 15 one-second samples after it against the median of the last 15 under load: single
  samples swing by 10 % with the requests in flight);
* every greedy completion equalled its solo reference;
* no 5xx, no transport error on a request that was not hung up, no traceback in the server's log;
* SIGTERM ends the server with exit status 0.

    python scripts/soak.py                          # 30 minutes on the default model
    python scripts/soak.py --minutes 2 --tiny       # CI: 2 minutes on a tiny synthetic model
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import statistics
import sys
import tempfile
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from infer.cli.serve.launch import ServerProcess, start_server

PROMPTS = [
    "Name three fruits.",
    "What is the capital of France?",
    "Write a haiku about rain.",
    "Count from one to five.",
    "Describe a cat in one sentence.",
    "Why is the sky blue?",
]
GREEDY_TOKENS = 12

HOSTILE_BODIES: list[tuple[str, str | bytes]] = [
    ("/v1/completions", '{"prompt": "hi", "logit_bias": {"5": 1e308}}'),
    ("/v1/completions", '{"prompt": "hi", "repeat_penalty": 1e-40, "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": "hi", "temperature": 1e-45, "max_tokens": 2}'),
    ("/v1/completions", '{"prompt": "hi", "temperature": 1e39}'),
    ("/v1/completions", '{"prompt": "hi", "stop": ["\\ud800"]}'),
    ("/v1/completions", '{"prompt": "a\\udfff"}'),
    ("/v1/completions", '{"prompt": "hi", "mirostat": 2, "mirostat_tau": 1e308}'),
    ("/v1/completions", '{"prompt": "hi", "dry_multiplier": 1e300, "max_tokens": 2}'),
    ("/v1/chat/completions", ""),
    ("/v1/chat/completions", "{"),
    ("/v1/chat/completions", "[" * 50_000 + "]" * 50_000),
    ("/v1/chat/completions", '{"messages": [{"role": "wizard", "content": "x"}]}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "n": 0}'),
    ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": "ten"}'),
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "\xff"}]}'),
    ("/v1/responses", '{"input": []}'),
    ("/v1/responses", '{"input": "hi", "max_output_tokens": -3}'),
]


def _many_biases() -> str:
    return json.dumps({"prompt": "x", "max_tokens": 1, "logit_bias": {str(i): 1.0 for i in range(40_000)}})


@dataclass
class SoakReport:
    """The soak's figures."""

    seconds: float = 0.0
    requests: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    statuses: dict[str, int] = field(default_factory=dict)
    hang_ups: int = 0
    cancellations: int = 0
    greedy_checked: int = 0
    greedy_mismatches: list[str] = field(default_factory=list)
    server_errors_5xx: int = 0
    unexpected: list[str] = field(default_factory=list)
    slots_held_at_end: int = -1
    in_flight_at_end: int = -1
    rss_warm_mb: float = 0.0
    """Median RSS of the first `RSS_WINDOW` samples after the warm-up (MiB)."""
    rss_end_mb: float = 0.0
    """Median RSS of the last `RSS_WINDOW` samples under load (MiB)."""
    rss_idle_mb: float = 0.0
    """RSS once the load stopped and the server answered its last greedy checks (MiB)."""
    rss_peak_mb: float = 0.0
    rss_growth_pct: float = 0.0
    rss_samples_mb: list[float] = field(default_factory=list)
    """One sample a second while the clients run."""
    server_tracebacks: int = 0
    exit_status: int | None = None

    def problems(self, max_rss_growth_pct: float) -> list[str]:
        """Every acceptance condition that failed."""
        out = []
        if self.slots_held_at_end != 0 or self.in_flight_at_end != 0:
            out.append(
                f"held at the end: {self.slots_held_at_end} sequences, {self.in_flight_at_end} in flight"
            )
        if self.rss_growth_pct >= max_rss_growth_pct:
            out.append(f"RSS grew {self.rss_growth_pct:.1f} % after warm-up (limit {max_rss_growth_pct} %)")
        if self.greedy_mismatches:
            out.append(f"{len(self.greedy_mismatches)} greedy completions differ from their solo reference")
        if self.server_errors_5xx:
            out.append(f"{self.server_errors_5xx} responses were 5xx")
        if self.unexpected:
            out.append(f"{len(self.unexpected)} unexpected outcomes, e.g. {self.unexpected[:3]}")
        if self.server_tracebacks:
            out.append(f"{self.server_tracebacks} tracebacks in the server log")
        if self.exit_status != 0:
            out.append(f"server exit status {self.exit_status}")
        return out


RSS_WINDOW = 15
"""Samples (one a second) whose median stands for the RSS at the start and at the end of the measured part."""


def rss_growth(samples: list[float], warm_index: int) -> tuple[float, float, float]:
    """(warm, end, growth %) of an RSS series whose warm-up ends at `warm_index`: medians of a window each.

    Medians of windows, not single samples: under load the RSS swings with the requests in flight (a
    2-minute CI soak once read 150 MiB at the end of its warm-up and 158 at the end, on a plateau of 160
    with peaks of 185), while a leak moves the whole window. With fewer than 2 * RSS_WINDOW samples after
    the warm-up the two windows overlap and the figure understates growth (a run under a minute long).
    """
    measured = samples[warm_index:] or samples[-1:]
    if not measured:
        return 0.0, 0.0, 0.0
    warm = statistics.median(measured[:RSS_WINDOW])
    end = statistics.median(measured[-RSS_WINDOW:])
    return warm, end, 100.0 * (end - warm) / warm if warm else 0.0


def rss_mb(pid: int) -> float:
    """Resident memory of `pid` in MiB (Linux /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Soak:
    """One soak run against a started server."""

    def __init__(self, server: ServerProcess, *, seed: int) -> None:
        assert server.url is not None
        self.server = server
        self.url = server.url
        self.rng = random.Random(seed)
        self.report = SoakReport()
        self.references: dict[str, str] = {}
        self.kinds: Counter[str] = Counter()
        self.statuses: Counter[str] = Counter()

    # -- outcomes ----------------------------------------------------------------------------------
    def _status(self, kind: str, status: int) -> None:
        self.kinds[kind] += 1
        self.statuses[str(status)] += 1
        if status >= 500:
            self.report.server_errors_5xx += 1
            self.report.unexpected.append(f"{kind}: HTTP {status}")

    def _greedy_body(self, prompt: str, stream: bool) -> dict[str, Any]:
        return {
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": GREEDY_TOKENS,
            "temperature": 0,
            "ignore_eos": True,
            "stream": stream,
        }

    async def references_alone(self, client: httpx.AsyncClient) -> None:
        """Each prompt's greedy completion with nothing else running."""
        for prompt in PROMPTS:
            reply = await client.post("/v1/chat/completions", json=self._greedy_body(prompt, False))
            reply.raise_for_status()
            self.references[prompt] = reply.json()["choices"][0]["message"]["content"]

    def _compare(self, prompt: str, text: str) -> None:
        self.report.greedy_checked += 1
        if text != self.references[prompt]:
            self.report.greedy_mismatches.append(f"{prompt!r}: {text!r} != {self.references[prompt]!r}")

    # -- the actions -------------------------------------------------------------------------------
    async def greedy_whole(self, client: httpx.AsyncClient) -> None:
        prompt = self.rng.choice(PROMPTS)
        reply = await client.post("/v1/chat/completions", json=self._greedy_body(prompt, False))
        self._status("greedy_whole", reply.status_code)
        if reply.status_code == 200:
            self._compare(prompt, reply.json()["choices"][0]["message"]["content"])

    async def greedy_stream(self, client: httpx.AsyncClient) -> None:
        prompt = self.rng.choice(PROMPTS)
        pieces = []
        async with client.stream(
            "POST", "/v1/chat/completions", json=self._greedy_body(prompt, True)
        ) as reply:
            self._status("greedy_stream", reply.status_code)
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    data = json.loads(line[6:])
                    if "error" in data:
                        self.report.unexpected.append(f"greedy_stream error event: {data['error']}")
                    for choice in data.get("choices", []):
                        pieces.append(choice.get("delta", {}).get("content") or "")
        if reply.status_code == 200:
            self._compare(prompt, "".join(pieces))

    async def sampled_stream(self, client: httpx.AsyncClient) -> None:
        body = {
            "prompt": self.rng.choice(PROMPTS),
            "max_tokens": self.rng.randint(4, 24),
            "temperature": self.rng.choice([0.5, 0.9, 1.3]),
            "seed": self.rng.randrange(2**31),
            "stream": True,
            "repeat_penalty": self.rng.choice([1.0, 1.1]),
            "mirostat": self.rng.choice([0, 0, 2]),
        }
        async with client.stream("POST", "/v1/completions", json=body) as reply:
            self._status("sampled_stream", reply.status_code)
            async for line in reply.aiter_lines():
                if '"error"' in line:
                    self.report.unexpected.append(f"sampled_stream error event: {line[:200]}")

    async def hang_up(self, client: httpx.AsyncClient) -> None:
        body = self._greedy_body(self.rng.choice(PROMPTS), True) | {"max_tokens": 200}
        chunks = self.rng.randint(1, 4)
        async with client.stream("POST", "/v1/chat/completions", json=body) as reply:
            self._status("hang_up", reply.status_code)
            async for line in reply.aiter_lines():
                if line.startswith("data: {"):
                    chunks -= 1
                    if chunks <= 0:
                        break  # leaving the block closes the connection mid-stream
        self.report.hang_ups += 1

    async def cancel(self, client: httpx.AsyncClient) -> None:
        # On a client of its own: httpcore 1.0.9 can leave a cancelled request's connection in the
        # pool for good (encode/httpcore#1093), and enough of those fill a shared pool until every
        # later request fails with PoolTimeout against a healthy server. Closing the client drops it.
        body = {"prompt": self.rng.choice(PROMPTS), "max_tokens": 200, "ignore_eos": True}
        async with httpx.AsyncClient(base_url=self.url, timeout=client.timeout) as own:
            task = asyncio.ensure_future(own.post("/v1/completions", json=body))
            await asyncio.sleep(self.rng.uniform(0.05, 1.0))
            if task.done():
                self._status("cancel", task.result().status_code)
                return
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, httpx.HTTPError):
                await task
        self.kinds["cancel"] += 1
        self.report.cancellations += 1

    async def hostile(self, client: httpx.AsyncClient) -> None:
        if self.rng.random() < 0.05:
            route, body = "/v1/completions", _many_biases()
        else:
            route, body = self.rng.choice(HOSTILE_BODIES)
        raw = body if isinstance(body, bytes) else body.encode("utf-8", "surrogatepass")
        reply = await client.post(route, content=raw, headers={"content-type": "application/json"})
        self._status("hostile", reply.status_code)
        if reply.status_code != 200 and not 400 <= reply.status_code < 500:
            self.report.unexpected.append(f"hostile {route} {raw[:60]!r}: HTTP {reply.status_code}")
        if reply.status_code >= 400 and "error" not in reply.json():
            self.report.unexpected.append(f"hostile {route}: no error body")

    async def probe(self, client: httpx.AsyncClient) -> None:
        path = self.rng.choice(["/health", "/v1/models", "/openapi.json"])
        reply = await client.get(path)
        self._status("probe", reply.status_code)

    ACTIONS = (
        ("greedy_whole", 3),
        ("greedy_stream", 3),
        ("sampled_stream", 2),
        ("hang_up", 2),
        ("cancel", 1),
        ("hostile", 3),
        ("probe", 1),
    )

    async def client_loop(self, client: httpx.AsyncClient, deadline: float) -> None:
        names = [name for name, _ in self.ACTIONS]
        weights = [weight for _, weight in self.ACTIONS]
        while time.monotonic() < deadline:
            name = self.rng.choices(names, weights)[0]
            try:
                await getattr(self, name)(client)
            except httpx.HTTPError as exc:
                self.report.unexpected.append(f"{name}: {type(exc).__name__}: {exc}")
            self.report.requests += 1

    async def run(self, seconds: float, clients: int, warmup: float) -> None:
        limits = httpx.Limits(max_connections=clients * 2)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as client:
            await self.references_alone(client)
            started = time.monotonic()
            deadline = started + seconds
            samples: list[float] = []

            warm_index: list[int] = []  # the index of the first sample after the warm-up

            async def sample_rss() -> None:
                while time.monotonic() < deadline:
                    if not warm_index and time.monotonic() - started >= warmup:
                        warm_index.append(len(samples))
                    samples.append(rss_mb(self.server.popen.pid))
                    await asyncio.sleep(1.0)

            await asyncio.gather(sample_rss(), *(self.client_loop(client, deadline) for _ in range(clients)))
            self.report.seconds = time.monotonic() - started
            # idle: every hung-up or cancelled request must be gone within a few seconds
            health: dict[str, Any] = {}
            for _ in range(100):
                health = (await client.get("/health")).json()
                if not health["active_sequences"] and not health["in_flight"]:
                    break
                await asyncio.sleep(0.1)
            self.report.slots_held_at_end = health["active_sequences"]
            self.report.in_flight_at_end = health["in_flight"]
            # greedy once more, alone: the server still answers exactly as at the start
            for prompt in PROMPTS[:2]:
                reply = await client.post("/v1/chat/completions", json=self._greedy_body(prompt, False))
                self._compare(prompt, reply.json()["choices"][0]["message"]["content"])
        self.report.rss_idle_mb = rss_mb(self.server.popen.pid)
        self.report.rss_peak_mb = max(samples, default=0.0)
        self.report.rss_samples_mb = samples
        growth = rss_growth(samples, warm_index[0] if warm_index else len(samples) // 2)
        self.report.rss_warm_mb, self.report.rss_end_mb, self.report.rss_growth_pct = growth
        self.report.by_kind = dict(self.kinds)
        self.report.statuses = dict(self.statuses)


def tiny_model(folder: Path) -> Path:
    """A tiny synthetic GGUF (the test suite's generator) in `folder`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic import write_tiny_model

    return write_tiny_model(folder).gguf_path


def soak(
    model: str | None, *, seconds: float, clients: int, seed: int, warmup: float, ctx_size: int = 1024
) -> SoakReport:
    """Start a server on `model` (None: the default model), soak it, stop it; the report."""
    args = ["-c", str(ctx_size), "--max-num-seqs", str(max(clients, 4)), "--shutdown-grace", "10"]
    if model is not None:
        args = ["-m", model, *args]
    server = start_server(args)
    runner = Soak(server, seed=seed)
    try:
        asyncio.run(runner.run(seconds, clients, warmup))
    finally:
        runner.report.exit_status = server.stop()
        runner.report.server_tracebacks = server.stderr.count("Traceback")
    return runner.report


def default_warmup(seconds: float) -> float:
    """The warm-up of a run of `seconds`: a fifth, at least a minute (never past half the run), at most two.

    On the tiny model the server's RSS climbs for about 40 s under this load (allocator arenas, the prefix
    cache filling) and then stays flat for the rest of a 6-minute run; a warm-up shorter than that climb
    reads the climb as a leak.
    """
    return min(max(seconds / 5, min(60.0, seconds / 2)), 120.0)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, soak, print the figures; exit 1 when an acceptance condition failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--model", help="model to serve (default: the default model)")
    parser.add_argument("--tiny", action="store_true", help="serve a tiny synthetic model (CI)")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument(
        "--warmup-minutes",
        type=float,
        help="default: a fifth of the run, at least 1 (the RSS climbs for ~40 s), at most 2",
    )
    parser.add_argument("--max-rss-growth", type=float, default=5.0, help="percent after warm-up")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    seconds = args.minutes * 60
    warmup = args.warmup_minutes * 60 if args.warmup_minutes is not None else default_warmup(seconds)
    with tempfile.TemporaryDirectory() as tmp:
        model = str(tiny_model(Path(tmp) / "tiny")) if args.tiny else args.model
        report = soak(model, seconds=seconds, clients=args.clients, seed=args.seed, warmup=warmup,
                      ctx_size=256 if args.tiny else 1024)  # fmt: skip
    problems = report.problems(args.max_rss_growth)
    if args.json:
        print(json.dumps(asdict(report) | {"problems": problems}, indent=2))
    else:
        print(
            f"soak: {report.seconds / 60:.1f} min, {report.requests} requests {report.by_kind}, "
            f"statuses {report.statuses}, {report.hang_ups} hang-ups, {report.cancellations} cancellations, "
            f"{report.greedy_checked} greedy checked ({len(report.greedy_mismatches)} mismatches), "
            f"5xx {report.server_errors_5xx}, slots held at end {report.slots_held_at_end} "
            f"(in flight {report.in_flight_at_end}), "
            f"RSS {report.rss_warm_mb:.0f} -> {report.rss_end_mb:.0f} MiB "
            f"({report.rss_growth_pct:+.1f} %, peak {report.rss_peak_mb:.0f}, "
            f"idle {report.rss_idle_mb:.0f}), "
            f"tracebacks {report.server_tracebacks}, exit {report.exit_status}"
        )
        for problem in problems:
            print(f"  FAIL: {problem}")
        for item in report.unexpected[:10]:
            print(f"  unexpected: {item}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
