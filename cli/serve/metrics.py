"""`/metrics` in the Prometheus text format, with vLLM's metric names under an `infer:` prefix.

The counters and histograms are fed from what the server already sees: each request's DoneEvent
(tokens, timings, finish reason, speculation counters) and each HTTP answer's status; the gauges
read the engine when scraped. Every app has its own registry, so two apps in one process (tests)
never share counts.
"""

from __future__ import annotations

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from infer.engine import DoneEvent, Engine

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)
"""Seconds: from one decode step to a long generation."""
_TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.08, 0.15, 0.3, 0.6, 1.0, 2.5)
"""Seconds between two tokens of one request."""


class ServerMetrics:
    """The server's Prometheus metrics (one registry per app)."""

    content_type = CONTENT_TYPE_LATEST
    """The media type of `render()`'s output."""

    def __init__(self, engine: Engine, model_id: str) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_id}
        r = self.registry

        def gauge(name: str, doc: str, read: object) -> None:
            g = Gauge(name, doc, list(labels), registry=r)
            g.labels(**labels).set_function(read)  # type: ignore[arg-type]

        gauge(
            "infer:num_requests_running",
            "Sequences holding a KV slot.",
            lambda: len(engine.scheduler.running),
        )
        gauge(
            "infer:num_requests_waiting", "Requests waiting for a KV slot.", lambda: engine.waiting_sequences
        )
        gauge(
            "infer:kv_cache_usage_perc",
            "Fraction of KV-cache slots in use (0..1).",
            lambda: 1.0 - engine.cache.free_slots / max(engine.cache.num_slots, 1),
        )
        self._labels = labels
        self.requests = Counter(
            "infer:request_success",
            "Finished requests by finish reason.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self.http = Counter(
            "infer:http_requests", "HTTP answers by route and status.", ["path", "status"], registry=r
        )
        self.prompt_tokens = Counter(
            "infer:prompt_tokens", "Prompt tokens processed.", list(labels), registry=r
        )
        self.generation_tokens = Counter(
            "infer:generation_tokens", "Tokens generated.", list(labels), registry=r
        )
        self.prefix_queries = Counter(
            "infer:prefix_cache_queries",
            "Prompt tokens looked up in the prefix cache.",
            list(labels),
            registry=r,
        )
        self.prefix_hits = Counter(
            "infer:prefix_cache_hits", "Prompt tokens the prefix cache supplied.", list(labels), registry=r
        )
        self.draft_tokens = Counter(
            "infer:spec_decode_num_draft_tokens", "Speculative tokens drafted.", list(labels), registry=r
        )
        self.accepted_tokens = Counter(
            "infer:spec_decode_num_accepted_tokens", "Speculative tokens accepted.", list(labels), registry=r
        )
        self.ttft = Histogram(
            "infer:time_to_first_token_seconds",
            "Time to first token.",
            list(labels),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "infer:e2e_request_latency_seconds",
            "Submit to last token.",
            list(labels),
            buckets=_LATENCY_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            "infer:inter_token_latency_seconds",
            "Mean time between tokens of each request.",
            list(labels),
            buckets=_TOKEN_GAP_BUCKETS,
            registry=r,
        )

    def observe(self, done: DoneEvent) -> None:
        """Count one finished request."""
        labels = self._labels
        self.requests.labels(**labels, finished_reason=done.finish_reason).inc()
        self.prompt_tokens.labels(**labels).inc(done.usage.prompt_tokens)
        self.prefix_queries.labels(**labels).inc(done.usage.prompt_tokens)
        self.prefix_hits.labels(**labels).inc(done.usage.cached_prompt_tokens)
        self.generation_tokens.labels(**labels).inc(done.usage.completion_tokens)
        self.draft_tokens.labels(**labels).inc(done.counters.get("draft_tokens", 0))
        self.accepted_tokens.labels(**labels).inc(done.counters.get("accepted_tokens", 0))
        t = done.timings
        if done.usage.completion_tokens:
            self.ttft.labels(**labels).observe(t.ttft_s)
            self.e2e.labels(**labels).observe(t.ttft_s + t.decode_s)
        if done.usage.completion_tokens > 1:
            self.itl.labels(**labels).observe(t.decode_s / (done.usage.completion_tokens - 1))

    def render(self) -> bytes:
        """The current values in the Prometheus text format."""
        return generate_latest(self.registry)


class CountStatuses:
    """ASGI middleware: count every HTTP answer by route template and status in `metrics`."""

    def __init__(self, app: ASGIApp, *, metrics: ServerMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def counting_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                route = scope.get("route")
                path = getattr(route, "path", None) or "unmatched"  # templates only: bounded labels
                self.metrics.http.labels(path=path, status=str(message["status"])).inc()
            await send(message)

        await self.app(scope, receive, counting_send)
