"""`infer bench --dataset` on a local engine: the serving run `infer.cli.bench.server` makes against a
server (the same dataset lines, arrival times, concurrency limits and figures), with every request
rendered here as `infer serve` renders it: a chat line (`--api chat`, the default; a prompt line is
one user message) through the model's chat template, its `tools` as `infer generate --tools` offers
them (the template's rendering or the generic tool prompt; the call grammar for `required` and a
named function, the lazy one for `auto`); a prompt line with `--api completions` as raw text.

Every request generates its `max_tokens` (`-n`, or the line's own) with EOS ignored, as the server
bench asks (a forced call still ends when its grammar is complete), under the run's sampler and seed.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Sequence

from infer.cli.bench.command import record_events
from infer.cli.bench.dataset import DatasetItem, arrival_offsets
from infer.cli.bench.stats import BenchResult, Trace, serving_sweep
from infer.cli.serve.errors import APIError
from infer.cli.serve.tools import read_tool_choice, tools_free
from infer.cli.tool_use import ToolRequestError, build_tool_request
from infer.engine import ChatTemplateError, Engine, EngineBusy, Request, RequestError, prompt_ids
from infer.profiles.requests import build_request
from infer.profiles.settings import Settings


class DatasetRequestError(ValueError):
    """A dataset line the engine cannot take (one line naming the line's index)."""


def dataset_requests(
    engine: Engine, settings: Settings, items: Sequence[DatasetItem], *, api: str, max_tokens: int, seed: int
) -> list[Request]:
    """The engine request of every item (DatasetRequestError naming the first one that fails)."""
    requests = []
    for number, item in enumerate(items, start=1):
        try:
            requests.append(_request(engine, settings, item, api=api, max_tokens=max_tokens, seed=seed))
        except (ToolRequestError, ChatTemplateError, APIError, ValueError) as exc:
            message = exc.message if isinstance(exc, APIError) else str(exc)
            raise DatasetRequestError(f"--dataset request {number}: {message}") from None
    return requests


def _request(
    engine: Engine, settings: Settings, item: DatasetItem, *, api: str, max_tokens: int, seed: int
) -> Request:
    limit = item.max_tokens or max_tokens
    if item.tools is not None:
        choice = read_tool_choice(item.tools, item.tool_choice, item.parallel_tool_calls, flat=False)
        assert choice is not None  # the dataset reader refuses an empty list
        request, _ = build_tool_request(
            engine, settings, item.as_messages(), choice=choice, ignore_eos=True, max_tokens=limit, seed=seed
        )
        return request
    tokenizer = engine.tokenizer
    if api == "chat":
        ids = prompt_ids(tokenizer, messages=tools_free(item.as_messages()))  # as the server hands them
    else:
        ids = prompt_ids(tokenizer, prompt=item.prompt)
    request = build_request(ids, settings, max_tokens=limit, ignore_eos=True, seed=seed)
    engine.validate(request)
    return request


def _run(
    engine: Engine, requests: Sequence[Request], rate: float, burstiness: float, limit: int | None, tag: str
) -> tuple[float, list[Trace]]:
    """Submit every request at its arrival time, at most `limit` in flight; (duration, traces)."""
    offsets = arrival_offsets(len(requests), rate, burstiness)
    gate = threading.Semaphore(limit) if limit else None
    traces = [Trace(0.0, prompt_tokens=len(r.prompt_ids)) for r in requests]
    engine.start()
    start = time.perf_counter()

    def one(index: int) -> None:
        time.sleep(max(0.0, start + offsets[index] - time.perf_counter()))
        request = dataclasses.replace(requests[index], request_id=f"{requests[index].request_id}-{tag}")
        if gate is not None:
            gate.acquire()
        trace = traces[index]
        try:
            trace.submitted = time.perf_counter()
            record_events(trace, engine.submit(request))
        except (RequestError, EngineBusy) as exc:  # recorded as a failed request, as a server's 4xx/503
            trace.error, trace.done = str(exc), time.perf_counter()
        finally:
            if gate is not None:
                gate.release()

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(len(requests))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    duration = time.perf_counter() - start
    engine.shutdown(cancel=False)
    return duration, traces


def serve_engine(
    engine: Engine,
    requests: Sequence[Request],
    levels: Sequence[int | None],
    max_tokens: int,
    rate: float,
    burstiness: float,
    slo: dict[str, float],
    repetitions: int,
    warmup: bool,
    advance: Callable[[str], None],
) -> list[BenchResult]:
    """Serving runs over the dataset's requests, as `ServerBench.serve` makes them against a server
    (`max_tokens`: the run's `-n`, reported as its n_gen)."""

    def run(level: int | None, warm_up: bool, tag: str) -> tuple[float, list[Trace]]:
        if warm_up:
            short = [dataclasses.replace(r, max_tokens=2) for r in requests[: max(level or 1, 1)]]
            return _run(engine, short, float("inf"), 1.0, level, tag)
        return _run(engine, requests, rate, burstiness, level, tag)

    return serving_sweep(
        run,
        levels=levels,
        num_prompts=len(requests),
        max_tokens=max_tokens,
        rate=rate,
        burstiness=burstiness,
        slo=slo,
        repetitions=repetitions,
        warmup=warmup,
        advance=advance,
    )


__all__ = ["DatasetRequestError", "dataset_requests", "serve_engine"]
