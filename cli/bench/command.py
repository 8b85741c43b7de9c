"""`infer bench`: llama-bench style throughput runs, plus a concurrency sweep with latency percentiles.

Tests (each repeated `-r` times after one warm-up run that is not counted):
  pp<P>          prefill P random prompt tokens; t/s = P / (time from scheduling to the first token)
  tg<N>          decode N tokens at batch 1 after a prompt of `-d` tokens (1 token when 0);
                 t/s = N / (time from the first to the last of N+1 tokens), so prefill is excluded
  pp<P>+tg<N>    (`-pg P,N`) the whole request: (P + N) / end-to-end time
  tg<N> c<C>     (`--concurrency`) C requests at once, each a `--concurrency-prompt`-token prompt and N
                 decoded tokens, through the background step loop; t/s = all tokens / wall time, plus
                 TTFT, inter-token and end-to-end latency (mean, p50, p90, p99) over every request
`-n` is the shared `-n/--n-predict` flag, read here as the list of decode lengths. Lists take commas
(`-p 128,512`). `--json` / `--jsonl` / `--csv` write to stdout alone; the table, progress and notices go
to stderr then (to stdout otherwise only the table). `--server URL` runs the same tests against an
OpenAI-compatible streaming endpoint instead of a local engine (see `infer.cli.bench.server`).
`--dataset FILE` adds a serving run over the file's prompts and chats (tools allowed), against the
server or on the local engine (`infer.cli.bench.engine_serve`).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.markup import escape

from infer.cli.bench.dataset import DatasetError, DatasetItem, load_dataset, parse_slo
from infer.cli.bench.options import BenchOptions
from infer.cli.bench.stats import (
    BenchResult,
    Trace,
    compare_to_baseline,
    comparison_table,
    latency_table,
    load_baseline,
    results_table,
    serving_table,
    to_csv,
)
from infer.cli.fingerprint import environment_fingerprint
from infer.cli.options import fail, resolve_or_fail, settings_errors, shared_flags, takes_options
from infer.cli.runtime import STDERR, counting_progress, open_engine
from infer.cli.server_client import api_key_from
from infer.engine import DoneEvent, Engine, Event, Request, RequestError, TokenEvent
from infer.profiles.backend_choice import choose_backend
from infer.profiles.remote import refuse_local_settings
from infer.profiles.requests import build_request
from infer.profiles.settings import SETTINGS, Settings, is_remote

PROMPT_SEED = 1234
"""Benchmark prompts are random token ids from this seed: the same prompts on every run."""
DEFAULT_SAMPLING_SEED = 1
ERRORS_SHOWN = 5
"""Failed requests listed per test (with the server's message); the rest are counted."""


def parse_int_list(text: str | Sequence[str] | None, option: str, *, minimum: int = 0) -> list[int]:
    """`"128,512"` (or repeated options) -> [128, 512]; exits 2 naming the option on a bad value."""
    if text is None:
        return []
    parts = [text] if isinstance(text, str) else list(text)
    values: list[int] = []
    for part in parts:
        for item in str(part).split(","):
            item = item.strip()
            if not item:
                continue
            try:
                value = int(item)
            except ValueError:
                fail(f"{option} takes integers separated by commas, got {part!r}")
            if value < minimum:
                fail(f"{option} values must be >= {minimum}, got {value}")
            values.append(value)
    return values


class PromptMaker:
    """Random prompt token ids (seeded), avoiding special tokens so every id is ordinary text."""

    def __init__(self, engine: Engine) -> None:
        self._rng = np.random.default_rng(PROMPT_SEED)
        self._vocab = engine.model.vocab_size
        tokenizer = engine.tokenizer
        self._bad = set(getattr(tokenizer, "control_ids", ()) or ()) | set(tokenizer.stop_ids)
        self._bos = tokenizer.bos_id

    def make(self, n: int) -> tuple[int, ...]:
        """n prompt ids (at least 1); the first is BOS when the model has one."""
        n = max(n, 1)
        ids = [int(t) for t in self._rng.integers(0, self._vocab, n)]
        ids = [t if t not in self._bad else 1000 + (t % 1000) for t in ids]
        if self._bos is not None:
            ids[0] = self._bos
        return tuple(ids)


def trace_request(engine: Engine, request: Request) -> Trace:
    """Submit and consume one request in this thread, timestamping every token."""
    trace = Trace(time.perf_counter(), prompt_tokens=len(request.prompt_ids))
    record_events(trace, engine.submit(request))
    return trace


def record_events(trace: Trace, events: Iterable[Event]) -> None:
    """Consume a request's events into `trace`: each token's arrival time, then what its DoneEvent
    reports (error, speculation counters, device draws, prefix-cache reuse)."""
    for event in events:
        if isinstance(event, TokenEvent):
            trace.token_times.append(time.perf_counter())
        elif isinstance(event, DoneEvent):
            trace.done = time.perf_counter()
            trace.error = event.error
            trace.counters = dict(event.counters)
            trace.sampled_on_device = event.sampled_on_device
            trace.cached_prompt_tokens = event.usage.cached_prompt_tokens


class EngineBench:
    """Runs the tests on a local engine, every request under `settings` with the same `seed`."""

    def __init__(self, engine: Engine, settings: Settings, seed: int) -> None:
        self.engine = engine
        self.settings = settings
        self.seed = seed
        self.prompts = PromptMaker(engine)

    def request(self, prompt: tuple[int, ...], max_tokens: int) -> Request:
        """A test's request: `max_tokens` is the test's length (it ignores EOS), as on every surface
        made by `build_request`."""
        return build_request(prompt, self.settings, max_tokens=max_tokens, ignore_eos=True, seed=self.seed)

    def prefill(self, n_prompt: int) -> tuple[float, Trace]:
        """One pp run: (tokens/s, trace)."""
        trace = trace_request(self.engine, self.request(self.prompts.make(n_prompt), 1))
        ttft = trace.ttft or 0.0
        return (n_prompt / ttft if ttft > 0 else 0.0), trace

    def decode(self, n_gen: int, depth: int) -> tuple[float, Trace]:
        """One tg run: N decode steps timed after a prompt of `depth` tokens."""
        trace = trace_request(self.engine, self.request(self.prompts.make(depth), n_gen + 1))
        span = trace.token_times[-1] - trace.token_times[0] if trace.tokens > 1 else 0.0
        return ((trace.tokens - 1) / span if span > 0 else 0.0), trace

    def prompt_gen(self, n_prompt: int, n_gen: int) -> tuple[float, Trace]:
        """One pg run: (P + N) / end-to-end."""
        trace = trace_request(self.engine, self.request(self.prompts.make(n_prompt), n_gen))
        return ((n_prompt + trace.tokens) / trace.e2e if trace.e2e > 0 else 0.0), trace

    def concurrent(self, concurrency: int, n_prompt: int, n_gen: int) -> tuple[float, list[Trace]]:
        """C requests at once through the background loop, each consumed by its own thread."""
        engine = self.engine
        requests = [self.request(self.prompts.make(n_prompt), n_gen) for _ in range(concurrency)]
        traces: list[Trace] = [Trace(0.0) for _ in requests]
        streams = []
        for index, request in enumerate(requests):
            traces[index].submitted = time.perf_counter()
            traces[index].prompt_tokens = len(request.prompt_ids)
            streams.append(engine.submit(request))
        engine.start()  # after every submit, so the first step already sees the whole batch

        def consume(index: int) -> None:
            record_events(traces[index], streams[index])

        threads = [threading.Thread(target=consume, args=(i,), daemon=True) for i in range(concurrency)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        engine.shutdown(cancel=False)
        wall = max(t.done for t in traces) - min(t.submitted for t in traces)
        total = sum(t.tokens for t in traces)
        return (total / wall if wall > 0 else 0.0), traces


def _repeat(
    name: str,
    kind: str,
    run: Callable[[], tuple[float, Any]],
    warmup: Callable[[], Any] | None,
    repetitions: int,
    advance: Callable[[str], None],
    **shape: int,
) -> BenchResult:
    if warmup is not None:
        advance(f"{name} (warm-up)")
        warmup()
    samples: list[float] = []
    traces: list[Trace] = []
    for rep in range(repetitions):
        advance(f"{name} ({rep + 1}/{repetitions})")
        tps, got = run()
        samples.append(tps)
        traces.extend(got if isinstance(got, list) else [got])
    return BenchResult(name, kind, samples=samples, traces=traces, **shape)


def _depth_suffix(depth: int) -> str:
    return f" @ d{depth}" if depth else ""


def plan_tests(
    n_prompts: list[int],
    n_gens: list[int],
    pgs: list[tuple[int, int]],
    depths: list[int],
    concurrency: list[int],
) -> list[tuple[str, str, dict[str, int]]]:
    """(name, kind, shape) of every test, in run order (llama-bench's order: pp, tg, pg; then the sweep)."""
    tests: list[tuple[str, str, dict[str, int]]] = []
    for depth in depths:
        suffix = _depth_suffix(depth)
        for p in n_prompts:
            if p > 0:
                tests.append((f"pp{p}{suffix}", "pp", {"n_prompt": p, "n_gen": 0, "depth": depth}))
        for n in n_gens:
            if n > 0:
                tests.append((f"tg{n}{suffix}", "tg", {"n_prompt": 0, "n_gen": n, "depth": depth}))
    for p, n in pgs:
        tests.append((f"pp{p}+tg{n}", "pg", {"n_prompt": p, "n_gen": n, "depth": 0}))
    return tests


def run_engine_tests(
    bench: EngineBench,
    tests: list[tuple[str, str, dict[str, int]]],
    concurrency: list[int],
    conc_prompt: int,
    conc_gen: int,
    repetitions: int,
    warmup: bool,
    advance: Callable[[str], None],
) -> list[BenchResult]:
    """Run every planned test and the concurrency sweep on a local engine."""
    results: list[BenchResult] = []
    for name, kind, shape in tests:
        depth = shape["depth"]
        if kind == "pp":
            p = shape["n_prompt"]
            run: Callable[[], tuple[float, Any]] = lambda p=p: bench.prefill(p)  # noqa: E731
            warm: Callable[[], Any] | None = run
        elif kind == "tg":
            n = shape["n_gen"]
            run = lambda n=n, d=depth: bench.decode(n, d)  # noqa: E731
            warm = lambda d=depth: bench.decode(4, d)  # noqa: E731  (short: decode cost is per token)
        else:
            p, n = shape["n_prompt"], shape["n_gen"]
            run = lambda p=p, n=n: bench.prompt_gen(p, n)  # noqa: E731
            warm = lambda p=p: bench.prefill(p)  # noqa: E731
        results.append(
            _repeat(name, kind, run, warm if warmup else None, repetitions, advance, concurrency=1, **shape)
        )
    for c in concurrency:
        name = f"tg{conc_gen} c{c}"
        results.append(
            _repeat(
                name,
                "conc",
                lambda c=c: bench.concurrent(c, conc_prompt, conc_gen),
                (lambda c=c: bench.concurrent(c, conc_prompt, 2)) if warmup else None,
                repetitions,
                advance,
                n_prompt=conc_prompt,
                n_gen=conc_gen,
                depth=0,
                concurrency=c,
            )
        )
    return results


def count_steps(tests: list[Any], concurrency: list[int], repetitions: int, warmup: bool) -> int:
    """How many progress steps the run has."""
    return (len(tests) + len(concurrency)) * (repetitions + (1 if warmup else 0))


def _emit(
    records: list[dict[str, Any]],
    header: dict[str, Any],
    fmt: str | None,
    console: Console,
) -> None:
    console.print(results_table(records, header))
    if header.get("threads_reason"):  # why `threads` is what it is (issue 34: a bare `1` said nothing)
        line = f"threads {header['threads']}: {header['threads_reason']}"
        console.print(line, highlight=False, soft_wrap=True)
    for table in (latency_table(records), serving_table(records)):
        if table is not None:
            console.print(table)
    if fmt == "json":
        sys.stdout.write(json.dumps({**header, "results": records}, indent=2) + "\n")
    elif fmt == "jsonl":
        for record in records:
            sys.stdout.write(json.dumps({**header, **record}) + "\n")
    elif fmt == "csv":
        sys.stdout.write(to_csv(records, header))
    sys.stdout.flush()


def _compute_threads(engine: Engine) -> int | None:
    """Threads the matmuls run on: the backend's own kernels' (the cpu kernels'), BLAS's otherwise."""
    backend = engine.backend
    threads = backend.kernel_threads_now() if backend is not None else None  # type: ignore[attr-defined]
    if threads is not None:
        return int(threads)
    from infer.cli.fingerprint import blas_info

    info = blas_info()
    return info[0]["threads"] if info else None


def _threads_reason(engine: Engine) -> str:
    """Why the run used the thread count it reports (the backend's own account, BLAS's otherwise)."""
    backend = engine.backend
    reason = backend.threads_reason() if backend is not None else None  # type: ignore[attr-defined]
    return str(reason) if reason is not None else "the host BLAS's own thread count"


@dataclass(frozen=True)
class _Plan:
    """The tests a bench run measures, from its options and the shared `-n`."""

    tests: list[Any]
    levels: list[int]
    conc_gen: int
    items: list[DatasetItem]
    serve_levels: list[int | None]
    max_ctx: int
    fmt: str | None
    slo_bounds: Any


def _check_options(options: BenchOptions, server: str | None) -> None:
    """Refuse options that do not go together (each one line, exit 2)."""
    serving_given = [
        name
        for name, given in (
            ("--dataset", options.dataset is not None),
            ("--num-prompts", options.num_prompts is not None),
            ("--request-rate", options.request_rate != float("inf")),
            ("--burstiness", options.burstiness != 1.0),
            ("--max-concurrency", options.max_concurrency is not None),
            ("--slo", options.slo is not None),
        )
        if given
    ]
    if server is None and (options.api_key or options.server_model):
        fail(f"{'--api-key' if options.api_key else '--server-model'} only applies with --server")
    if options.dataset is None and serving_given:
        fail(f"{', '.join(serving_given)} needs --dataset (a serving run over a prompt file)")
    if not options.request_rate > 0:
        fail(f"--request-rate must be > 0 (inf = all at once), got {options.request_rate}")
    if not options.burstiness > 0:
        fail(f"--burstiness must be > 0, got {options.burstiness}")
    if options.max_concurrency is not None and options.concurrency is not None:
        fail("give --max-concurrency (one limit) or --concurrency (a sweep of limits), not both")
    if not 0 <= options.tolerance < 1:
        fail(f"--tolerance must be in [0, 1), got {options.tolerance}")
    if options.api not in ("chat", "completions"):
        fail(f"--api must be chat or completions, got {options.api!r}")
    if options.plot is not None:  # before measuring: a missing matplotlib must not cost a whole run
        from infer.cli.bench.plot import PlotError, check_plot_target

        try:
            check_plot_target(options.plot)
        except PlotError as exc:
            fail(str(exc))


def _plan(options: BenchOptions, n_predict: Any, server: str | None) -> _Plan:
    """The tests, the concurrency levels and the output format the options ask for."""
    _check_options(options, server)
    try:
        slo_bounds = parse_slo(options.slo)
    except DatasetError as exc:
        fail(str(exc))
    formats = [
        name
        for name, on in (
            ("json", options.json_output),
            ("jsonl", options.jsonl_output),
            ("csv", options.csv_output),
        )
        if on
    ]
    if len(formats) > 1:
        fail(f"choose one of --json, --jsonl, --csv (got {', '.join('--' + f for f in formats)})")
    n_gens = parse_int_list(n_predict, "-n/--n-predict")
    n_prompts = parse_int_list(options.n_prompt, "-p/--n-prompt")
    pgs_flat = [parse_int_list(item, "-pg") for item in (options.prompt_gen or [])]
    if any(len(pair) != 2 or min(pair) < 1 for pair in pgs_flat):
        fail("-pg takes P,N with both >= 1, e.g. -pg 512,128")
    pgs = [(pair[0], pair[1]) for pair in pgs_flat]
    depths = parse_int_list(options.depth, "-d/--depth") or [0]
    levels = parse_int_list(options.concurrency, "--concurrency", minimum=1)
    if not n_prompts and not n_gens and not pgs and not levels and options.dataset is None:
        n_prompts, n_gens = [512], [128]
    conc_gen = n_gens[0] if n_gens else 128
    items: list[DatasetItem] = []
    serve_levels: list[int | None] = []
    if options.dataset is not None:
        try:
            items = load_dataset(options.dataset, api=options.api)
        except DatasetError as exc:
            fail(str(exc))
        if options.num_prompts is not None:
            items = [items[i % len(items)] for i in range(options.num_prompts)]
        # The serving run takes -n as each request's length and --concurrency as its limits.
        serve_levels = list(levels) or [options.max_concurrency]
        n_gens, levels = [], []
    max_ctx = max([d + max([*n_prompts, *n_gens, 1]) for d in depths] + [p + n for p, n in pgs] + [1])
    tests = plan_tests(n_prompts, n_gens, pgs, depths, levels)
    return _Plan(
        tests, levels, conc_gen, items, serve_levels, max_ctx, formats[0] if formats else None, slo_bounds
    )


@shared_flags
@takes_options
def bench(options: BenchOptions, *, flags: dict[str, Any]) -> None:
    """Throughput runs: prefill and decode tokens/s, TTFT, inter-token latency, concurrency sweep."""
    n_predict = flags.pop("n_predict", None)
    settings = resolve_or_fail(flags)
    server = _ServerTarget.of(settings, options) if is_remote(settings) else None
    if server is not None:
        _refuse_unsent(settings)
    plan = _plan(options, n_predict, server.url if server else None)
    baseline_data = None
    if options.baseline is not None:
        try:
            baseline_data = load_baseline(options.baseline)
        except ValueError as exc:
            fail(str(exc))
    console = STDERR if plan.fmt else Console()
    if server is not None:
        results, header = _bench_server(options, plan, server)
    else:
        results, header = _bench_engine(options, plan, settings)
    records = [r.to_json() for r in results]
    errors = sum(r["errors"] for r in records)
    _emit(records, header, plan.fmt, console)
    if options.plot is not None:
        from infer.cli.bench.plot import PlotError, plot_runs

        try:
            plot_runs([(str(header.get("model")), {**header, "results": records})], options.plot)
        except PlotError as exc:
            fail(str(exc))
        console.print(f"plot written to {escape(str(options.plot))}")
    if errors:
        console.print(f"[red]{errors} request(s) failed during the run[/]")
        for result in results:
            failed = [t.error for t in result.traces if t.error is not None]
            for message in failed[:ERRORS_SHOWN]:
                console.print(f"  {escape(result.test)}: {escape(message)}")
            if len(failed) > ERRORS_SHOWN:
                console.print(f"  {escape(result.test)}: ... and {len(failed) - ERRORS_SHOWN} more")
    regressed = False
    if baseline_data is not None:
        comparisons, missing = compare_to_baseline(records, baseline_data, options.tolerance)
        console.print(comparison_table(comparisons, options.tolerance))
        if missing:
            console.print(f"not in the baseline (not compared): {', '.join(missing)}")
        regressed = any(c.regressed for c in comparisons)
        if regressed:
            console.print(f"[red]regression beyond {options.tolerance:.0%} against {options.baseline}[/]")
    if errors and server is not None and not regressed:
        raise SystemExit(2)  # remote failures: could not measure, not a regression
    raise SystemExit(1 if regressed or errors else 0)


def _refuse_unsent(settings: Settings) -> None:
    """A server bench sends greedy fixed-length requests: a sampler flag or variable, or a local-engine
    setting, would be accepted and ignored, so each is refused (one line, exit 2)."""
    given = [
        str(settings.source(spec.name))
        for spec in SETTINGS.values()
        if spec.section == "sampler" and settings.source(spec.name).kind in ("flag", "env")
    ]
    if given:
        fail(f"{', '.join(given)}: a server bench sends greedy fixed-length requests; remove them")
    with settings_errors():
        refuse_local_settings(settings)


@dataclass(frozen=True)
class _ServerTarget:
    """The server a bench run measures: `--server URL` (the shared `server_url` setting, or a profile
    with `backend: remote`), the model name to send and the API key."""

    url: str
    model: str | None
    api_key: str | None

    @classmethod
    def of(cls, settings: Settings, options: BenchOptions) -> _ServerTarget:
        """From remote settings: `--server-model`, else a remote profile's `model`, else the first of
        /v1/models; the key from `--api-key` or the variable `api_key_env` names."""
        model = options.server_model
        if model is None and settings.source("model").kind != "default":
            model = settings.model
        return cls(str(settings.server_url), model, api_key_from(options.api_key, settings.api_key_env))


def _bench_server(
    options: BenchOptions, plan: _Plan, server: _ServerTarget
) -> tuple[list[BenchResult], dict[str, Any]]:
    """The plan's tests (and the serving run over --dataset) against the server at --server."""
    from infer.cli.bench.server import ServerBench, ServerError

    reps, warmup = options.repetitions, options.warmup
    steps = count_steps(plan.tests, plan.levels, reps, warmup)
    steps += len(plan.serve_levels) * (reps + (1 if warmup else 0))
    try:
        server_bench = ServerBench(server.url, api=options.api, model=server.model, api_key=server.api_key)
        with _progress(steps) as advance:
            results = server_bench.run(
                plan.tests, plan.levels, options.concurrency_prompt, plan.conc_gen, reps, warmup, advance
            )
            if plan.items:
                results += server_bench.serve(
                    plan.items,
                    plan.serve_levels,
                    plan.conc_gen,
                    options.request_rate,
                    options.burstiness,
                    plan.slo_bounds,
                    reps,
                    warmup,
                    advance,
                )
    except ServerError as exc:
        fail(f"could not measure: {exc}")
    identity = server_bench.identity.to_json()
    header = {
        "server": server.url,
        "api": options.api,
        "model": server_bench.model,
        "backend": "server",
        "threads": "-",
        "fingerprint": environment_fingerprint(
            backend="server", device=server.url, model=server_bench.model, server=identity
        ),
    }
    return results, header


def _bench_engine(
    options: BenchOptions, plan: _Plan, settings: Settings
) -> tuple[list[BenchResult], dict[str, Any]]:
    """The plan's tests on a local engine under `settings`."""
    if settings.ctx_size and plan.max_ctx + 2 > settings.ctx_size:
        fail(
            f"the longest test needs {plan.max_ctx + 2} positions but ctx_size is {settings.ctx_size}; "
            "raise -c"
        )
    limits = [*plan.levels, *(level for level in plan.serve_levels if level), 1]
    # A dataset run without a concurrency limit takes the settings' sequences, as a server would.
    engine = open_engine(settings, max_num_seqs=None if None in plan.serve_levels else max(limits))
    seed = sampling_seed(settings)
    runner = EngineBench(engine, settings, seed)
    reps, warmup = options.repetitions, options.warmup
    steps = count_steps(plan.tests, plan.levels, reps, warmup)
    steps += len(plan.serve_levels) * (reps + (1 if warmup else 0))
    try:
        requests = _dataset_requests(engine, settings, plan, options.api, seed)
        with _progress(steps) as advance:
            results = run_engine_tests(
                runner,
                plan.tests,
                plan.levels,
                options.concurrency_prompt,
                plan.conc_gen,
                reps,
                warmup,
                advance,
            )
            if requests:
                from infer.cli.bench.engine_serve import serve_engine

                results += serve_engine(
                    engine,
                    requests,
                    plan.serve_levels,
                    plan.conc_gen,
                    options.request_rate,
                    options.burstiness,
                    plan.slo_bounds,
                    reps,
                    warmup,
                    advance,
                )
    except RequestError as exc:
        fail(str(exc))
    choice = choose_backend(settings)
    model_name = Path(settings.model).name if settings.model else "smollm2-135m-instruct"
    header = {
        "model": model_name,
        "backend": choice.selected,
        "threads": settings.threads or _compute_threads(engine) or 0,
        "threads_reason": _threads_reason(engine),
        "cpu_kernels": settings.cpu_kernels,
        "mmap": bool(settings.mmap) if choice.selected == "cpu" else None,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "load_seconds": round(engine.load_seconds, 3),
        "profile": settings.profile_name,
        "sampling": {"temperature": settings.sampling.temperature, "seed": seed},
        "fingerprint": environment_fingerprint(
            backend=choice.selected,
            profile_name=settings.profile_name,
            profile_path=settings.profile_path,
            model=model_name,
            cpu_kernels=settings.cpu_kernels,
            kv_cache_dtype=settings.kv_cache_dtype,
        ),
    }
    return results, header


def _dataset_requests(engine: Engine, settings: Settings, plan: _Plan, api: str, seed: int) -> list[Request]:
    """The engine requests of the dataset's lines (none without --dataset); exit 2 on a bad one."""
    if not plan.items:
        return []
    from infer.cli.bench.engine_serve import DatasetRequestError, dataset_requests

    try:
        return dataset_requests(engine, settings, plan.items, api=api, max_tokens=plan.conc_gen, seed=seed)
    except DatasetRequestError as exc:
        fail(str(exc))


def sampling_seed(settings: Settings) -> int:
    """The seed of every bench request: the settings' seed, or a fixed one when none is set (the same
    draws every run)."""
    return settings.sampling.seed if settings.sampling.seed is not None else DEFAULT_SAMPLING_SEED


class _progress:
    """A transient rich progress bar on stderr; yields `advance(description)`."""

    def __init__(self, total: int) -> None:
        self._bar = counting_progress()
        self._total = total
        self._task: Any = None
        self._started = False

    def __enter__(self) -> Callable[[str], None]:
        self._bar.__enter__()
        self._task = self._bar.add_task("bench", total=self._total)

        def advance(description: str) -> None:
            if self._started:
                self._bar.advance(self._task)
            self._started = True
            self._bar.update(self._task, description=description)

        return advance

    def __exit__(self, *exc: object) -> None:
        self._bar.__exit__(*exc)


__all__ = ["EngineBench", "bench", "parse_int_list", "plan_tests"]
