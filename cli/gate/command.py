"""`infer gate ANCHORS.yaml`: run pinned anchors and check the sha256 of their token ids (CI's drift gate).

Every anchor runs alone (one sequence: batching can change float summation order), greedy or seeded,
and its generated token ids are hashed as sha256 of the ASCII decimal ids joined by "," (no spaces),
e.g. sha256(b"7042,30,198") -- see `infer.cli.gate.anchors`. Exit codes: 0 every anchor matches (or
only near-ties differ under `--allow-ties`), 1 any mismatch, failed generation or unblessed anchor, 2 a
bad anchors file or setting (one line naming the file, line and key path).

Settings per anchor, highest first: the anchor's own `profile`/`model`/`sampler`/`n_predict`, then
command-line flags (`--profile`, `-t`, `-c` ...), then the file's `defaults:`, then `INFER_*` env and the
profile.
Sampler values never come from flags or `INFER_*` env: an anchor pins its whole sampler, so it means
the same thing on every machine. `--bless` writes fresh expectations back (comments and order kept).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from threadpoolctl import threadpool_limits

from infer.cli.fingerprint import environment_fingerprint, fingerprint_diff
from infer.cli.gate.anchors import (
    Blessing,
    GateFileError,
    LoadedAnchors,
    ResolvedAnchor,
    bless_document,
    load_anchors,
    write_document,
)
from infer.cli.gate.check import AnchorResult, AnchorRun, judge, relative_gap, run_anchor, write_junit
from infer.cli.gate.options import GateOptions
from infer.cli.gate.remote import (
    IDS_TEXT_ONLY,
    RemoteRun,
    judge_remote,
    reproducibility_problem,
    run_remote_anchor,
)
from infer.cli.options import fail, resolve_or_fail, shared_flags, takes_options
from infer.cli.runtime import STDERR, counting_progress, open_engine, resolve_model_path
from infer.cli.server_client import (
    DEFAULT_TIMEOUT_S,
    RemoteError,
    api_key_from,
    auth_headers,
    base_url,
    discover,
)
from infer.engine import (
    Engine,
    ModelLoadError,
    SamplingParamsError,
    Tokenizer,
    audit_tokens,
    load_checkpoint,
    prompt_ids,
)
from infer.profiles.backend_choice import choose_backend
from infer.profiles.constraints import grammar_from_settings
from infer.profiles.loader import ProfileError
from infer.profiles.settings import SETTINGS, Settings, is_remote, resolve_settings


def _sampler_env_free(env: dict[str, str]) -> dict[str, str]:
    """`env` without the sampler settings' INFER_* twins (anchors pin their sampler)."""
    banned = {spec.env for spec in SETTINGS.values() if spec.section == "sampler"}
    return {key: value for key, value in env.items() if key not in banned}


def anchor_settings(loaded: LoadedAnchors, anchor: ResolvedAnchor, cli_flags: dict[str, Any]) -> Settings:
    """Resolve one anchor's settings: anchor > command-line flags > file defaults > env > profile."""
    defaults = loaded.spec.defaults
    flags: dict[str, Any] = {}
    for name in ("profile", "model", "cpu_kernels"):
        if getattr(defaults, name) is not None:
            flags[name] = getattr(defaults, name)
    flags.update(cli_flags)
    for name in ("profile", "model", "cpu_kernels"):
        if getattr(anchor.anchor, name) is not None:
            flags[name] = getattr(anchor.anchor, name)
    flags.update(anchor.sampler)
    flags.update(anchor.anchor.constraint_flags(loaded.path.parent))
    # The anchor's request is built from these settings like every surface's: its n_predict, and 2
    # alternatives per token (the top-2 gap for tie analysis; draws do not depend on n_probs).
    flags["n_predict"] = anchor.n_predict
    flags["n_probs"] = max(2, int(anchor.sampler.get("n_probs", 0)))
    try:
        return resolve_settings(flags, env=_sampler_env_free(dict(os.environ)))
    except (ProfileError, SamplingParamsError) as exc:
        fail(f"{loaded.path}: anchors[{anchor.index}] ({anchor.name}): {exc}")


def audit_anchor(engine: Engine, settings: Settings, run: AnchorRun, result: AnchorResult) -> None:
    """`--audit`: replay a constrained anchor's tokens through a fresh matcher (the grammar it ran
    under: its own constraint, or a tool anchor's call grammar); a token the grammar did not allow
    fails the anchor (whatever its hash says)."""
    spec = run.grammar if run.grammar is not None else grammar_from_settings(settings)
    if spec is None:
        return
    problem = audit_tokens(spec, engine.grammar_vocabulary, run.token_ids)
    if problem is not None:
        result.status = "fail"
        result.problems.append(f"audit: {problem}")


def _engine_key(settings: Settings) -> tuple[Any, ...]:
    return (
        settings.model,
        settings.backend,
        settings.dtype,
        settings.strict_backend,
        settings.threads,
        settings.cpu_kernels,
        settings.mmap,
        settings.ctx_size,
        settings.batch_size,
        settings.max_batched_tokens,
        settings.spec_draft_model if settings.spec_method == "draft_model" else None,
    )


def _fingerprint(settings: Settings) -> dict[str, Any]:
    choice = choose_backend(settings)
    model = settings.model or "default"
    return environment_fingerprint(
        backend=choice.selected,
        profile_name=settings.profile_name,
        profile_path=settings.profile_path,
        model=Path(model).name if model != "default" else "smollm2-135m-instruct",
        cpu_kernels=settings.cpu_kernels,
        kv_cache_dtype=settings.kv_cache_dtype,
    )


def _short(value: Any) -> str:
    return f"{value[:12]}…" if isinstance(value, str) and len(value) > 12 else str(value)


def _status_cell(result: AnchorResult, allow_ties: bool) -> str:
    return {
        "pass": "[green]pass[/]",
        "fail": "[red]FAIL[/]",
        "tie": "[yellow]tie (allowed)[/]" if allow_ties else "[red]FAIL (near-tie)[/]",
        "error": "[red]ERROR[/]",
        "unblessed": "[red]unblessed[/]",
    }[result.status]


def _table(results: list[AnchorResult], allow_ties: bool, ids_methods: dict[str, str] | None = None) -> Table:
    table = Table(title="infer gate", title_justify="left")
    columns = ["anchor", "expected", "got", "tokens", "time", "status"]
    if ids_methods is not None:
        columns.insert(4, "ids from")
    for column in columns:
        table.add_column(column, justify="right" if column in ("tokens", "time") else "left")
    for result in results:
        expected_tokens = result.expected.get("tokens")
        tokens = str(result.got["tokens"])
        if expected_tokens is not None and expected_tokens != result.got["tokens"]:
            tokens = f"{expected_tokens} -> {tokens}"
        row = [
            escape(result.name),
            _short(result.expected.get("sha256", "-")),
            _short(result.got["sha256"]),
            tokens,
            f"{result.seconds:.2f}s",
            _status_cell(result, allow_ties),
        ]
        if ids_methods is not None:
            method = ids_methods.get(result.name, "-")
            if method == IDS_TEXT_ONLY:  # the hashes shown are the text's
                row[1] = _short(result.expected.get("text_sha256", "-"))
                row[2] = _short(result.got.get("text_sha256", "-"))
            row.insert(4, method)
        table.add_row(*row)
    return table


def _gap_text(gap: float | None) -> str:
    if gap is None:
        return "n/a"
    return f"{gap:.3g} nats (relative {relative_gap(gap):.2g})"


def _report_problem(console: Console, result: AnchorResult, tie_margin: float, decode: Any) -> None:
    console.print(f"[bold]{escape(result.name)}[/]: {result.status}")
    for problem in result.problems:
        console.print(f"  {escape(problem)}")
    d = result.divergence
    if d is None:
        if result.status in ("fail", "tie") and "token_ids" not in result.expected:
            console.print("  (no token ids stored: bless with --keep-tokens to see where it diverges)")
        return

    def token(tid: int | None) -> str:
        return "end of output" if tid is None else f"{tid} {decode([tid])!r}"

    console.print(
        f"  first divergence at token {d.position}: expected {token(d.expected_token)}, "
        f"got {token(d.produced_token)}"
    )
    console.print(f"    context : {d.prefix_text!r}")
    console.print(f"    expected: {d.expected_text!r}")
    console.print(f"    produced: {d.produced_text!r}")
    if d.near_tie is True:
        verdict = f"[yellow]a near-tie[/] (top-2 relative gap below --tie-margin {tie_margin:g})"
    elif d.near_tie is False:
        verdict = f"[red]not a near-tie[/] (top-2 relative gap at or above --tie-margin {tie_margin:g})"
    else:
        verdict = "near-tie unknown (sampled anchor, or no gaps stored)"
    console.print(f"    this step was {verdict}")
    console.print(f"    stored gap: {_gap_text(d.expected_gap)}; this run: {_gap_text(d.produced_gap)}")


def _report_fingerprint(
    console: Console, stored: dict[str, Any] | None, current: dict[str, Any]
) -> list[Any]:
    if not stored:
        console.print("environment: no fingerprint stored in the anchors file (--bless records one)")
        return []
    diff = fingerprint_diff(stored, current)
    if not diff:
        console.print("environment: same fingerprint as when the anchors were blessed")
        return []
    table = Table(title="environment differences since --bless", title_justify="left")
    for column in ("key", "blessed", "now"):
        table.add_column(column)
    for key, old, new in diff:
        table.add_row(key, escape(json.dumps(old)), escape(json.dumps(new)))
    console.print(table)
    return [{"key": key, "blessed": old, "now": new} for key, old, new in diff]


_SERVER_SETTINGS = ("profile", "backend", "server_url", "api_key_env")
"""The shared settings that say whether and where a server runs the anchors."""


def _server_settings(flags: dict[str, Any]) -> Settings | None:
    """The settings naming the server to gate (`--server URL`, `INFER_SERVER_URL`, or `--profile` of
    a profile with `backend: remote`), or None for a local run."""
    settings = resolve_or_fail({name: flags[name] for name in _SERVER_SETTINGS if name in flags})
    if is_remote(settings):
        return settings
    if "api_key_env" in flags:
        fail("--api-key-env only applies with --server")
    return None


@shared_flags
@takes_options
def gate(
    anchors_file: Path = typer.Argument(..., help="The anchors YAML file.", show_default=False),
    *,
    options: GateOptions,
    flags: dict[str, Any],
) -> None:
    """Run the anchors in a file and check their token hashes: exit 0 all match, 1 drift, 2 bad file
    (or, with --server, an anchor that could not be checked)."""
    if not 0.0 < options.tie_margin < 1.0:
        fail(f"--tie-margin must be in (0, 1), got {options.tie_margin}")
    server = _server_settings(flags)
    if server is None:
        given = [
            name
            for name, value in (("--api-key", options.api_key), ("--tokenizer", options.tokenizer))
            if value
        ]
        if given or options.timeout != DEFAULT_TIMEOUT_S:
            fail(f"{', '.join(given or ['--timeout'])} only applies with --server")
    pinned = sorted(SETTINGS[name].flag for name in flags if SETTINGS[name].section == "sampler")
    if pinned or "n_predict" in flags:
        given = ", ".join(pinned + (["--n-predict"] if "n_predict" in flags else []))
        fail(
            f"infer gate: {given} cannot be used: each anchor pins its sampler and n_predict in the "
            "anchors file"
        )
    try:
        loaded = load_anchors(anchors_file)
    except GateFileError as exc:
        fail(str(exc))
    selected = loaded.select(options.filters or [])
    if not selected:
        fail(f"no anchor in {anchors_file} matches --filter {' '.join(options.filters or [])}")
    if server is not None:
        model_name = flags.pop("model", None)
        if model_name is None and server.source("model").kind != "default":
            model_name = server.model  # a remote profile's model: the served model's name
        for name in _SERVER_SETTINGS:
            flags.pop(name, None)
        if flags or options.deterministic or options.audit:
            names = sorted(SETTINGS[name].flag for name in flags) + (
                ["--deterministic"] if options.deterministic else []
            )
            names += ["--audit"] if options.audit else []
            fail(f"{', '.join(names)}: no effect on a remote server, so not accepted with --server")
        if options.timeout <= 0:
            fail(f"--timeout must be > 0, got {options.timeout}")
        target = ServerGateOptions(
            url=server.server_url,
            model=model_name,
            api_key=api_key_from(options.api_key, server.api_key_env),
            tokenizer=options.tokenizer,
            timeout=options.timeout,
        )
        _gate_server(loaded, selected, target, options)
        return
    settings_by_anchor = {anchor.index: anchor_settings(loaded, anchor, flags) for anchor in selected}
    for anchor in selected:
        if is_remote(settings_by_anchor[anchor.index]):
            fail(
                f"{loaded.path}: anchors[{anchor.index}] ({anchor.name}): its profile names a server; "
                "the file's profile applies to local runs: give --server URL or --profile on the command line"
            )

    console = STDERR if options.json_output else Console()
    engines: dict[tuple[Any, ...], Engine] = {}
    runs: dict[int, AnchorRun] = {}
    results: list[AnchorResult] = []
    started = time.perf_counter()
    progress = counting_progress()
    with progress:
        task = progress.add_task("anchors", total=len(selected))
        for anchor in selected:
            settings = settings_by_anchor[anchor.index]
            key = _engine_key(settings)
            if key not in engines:
                progress.update(task, description=f"loading model for {anchor.name}")
                engines[key] = open_engine(settings, max_num_seqs=1)
            if options.deterministic:
                threadpool_limits(limits=settings.threads or os.cpu_count() or 1, user_api="blas")
            progress.update(task, description=f"anchor {anchor.name}")
            engine = engines[key]
            run = run_anchor(engine, anchor, settings)
            runs[anchor.index] = run
            result = judge(
                anchor,
                run,
                tie_margin=options.tie_margin,
                decode=lambda ids, e=engine: e.tokenizer.decode(ids),
            )
            if options.audit:
                audit_anchor(engine, settings, run, result)
            results.append(result)
            progress.advance(task)
    total_seconds = time.perf_counter() - started
    current = _fingerprint(settings_by_anchor[selected[0].index])

    if options.bless:
        good = {
            index: run.blessing()
            for index, run in runs.items()
            if run.error is None and run.finish_reason != "error"
        }
        _bless(loaded, good, results, keep_tokens=options.keep_tokens, fingerprint=current, console=console)
        return
    decoder = next(iter(engines.values())).tokenizer.decode
    _report(
        loaded,
        results,
        _Outcome(total_seconds, current, decoder),
        tie_margin=options.tie_margin,
        allow_ties=options.allow_ties,
        junit=options.junit,
        json_output=options.json_output,
        console=console,
    )


@dataclass
class _Outcome:
    """What the reporting needs besides the results: total time, the fingerprint, a decoder, and for
    --server runs how each anchor's ids were obtained and who answered."""

    seconds: float
    fingerprint: dict[str, Any]
    decode: Callable[[list[int]], str]
    ids_methods: dict[str, str] | None = None
    server: dict[str, Any] | None = None


def _report(
    loaded: LoadedAnchors,
    results: list[AnchorResult],
    outcome: _Outcome,
    *,
    tie_margin: float,
    allow_ties: bool,
    junit: Path | None,
    json_output: bool,
    console: Console,
) -> None:
    """The table, the problems, the summary, JUnit and JSON; exits 0 / 1 drift / 2 could not check
    (--server only: a local generation error stays a failure, 1)."""
    total_seconds, current, decoder = outcome.seconds, outcome.fingerprint, outcome.decode
    remote = outcome.server is not None
    drift = [r for r in results if not (r.status == "pass" or (allow_ties and r.status == "tie"))]
    unchecked = [r for r in drift if r.status == "error"] if remote else []
    ok = not drift
    console.print(_table(results, allow_ties, outcome.ids_methods))
    for result in results:
        if result.status != "pass":
            _report_problem(console, result, tie_margin, decoder)
    env_diff: list[Any] = []
    if any(r.status in ("fail", "tie", "error") for r in results):
        env_diff = _report_fingerprint(console, loaded.spec.fingerprint, current)
    passed = sum(1 for r in results if r.status == "pass")
    ties = sum(1 for r in results if r.status == "tie")
    summary = f"{passed}/{len(results)} anchors match"
    if ties:
        summary += f", {ties} near-tie divergence(s)" + (" allowed" if allow_ties else "")
    if unchecked:
        summary += f", {len(unchecked)} could not be checked"
    console.print(("[green]" if ok else "[red]") + summary + f"[/] in {total_seconds:.1f}s")
    if junit is not None:
        write_junit(junit, results, suite=loaded.path.stem, allow_ties=allow_ties, seconds=total_seconds)
    if json_output:
        payload = {
            "file": str(loaded.path),
            "ok": ok,
            "tie_margin": tie_margin,
            "allow_ties": allow_ties,
            "seconds": round(total_seconds, 3),
            "fingerprint": current,
            "fingerprint_diff": env_diff,
            "anchors": [r.to_json() for r in results],
        }
        if remote:
            payload["server"] = outcome.server
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()
    if ok:
        raise SystemExit(0)
    # Drift is 1; a run where the only problems are anchors the server could not answer is 2.
    raise SystemExit(2 if len(unchecked) == len(drift) else 1)


def _bless(
    loaded: LoadedAnchors,
    good: dict[int, Blessing],
    results: list[AnchorResult],
    *,
    keep_tokens: bool,
    fingerprint: dict[str, Any],
    console: Console,
    error_code: int = 1,
) -> None:
    """Write fresh expectations for every anchor that generated cleanly (`good`); exit `error_code`
    (1 locally, 2 for --server: could not bless) if any failed."""
    failed = [r for r in results if r.status == "error"]
    report = bless_document(loaded, good, keep_tokens=keep_tokens, fingerprint=fingerprint)
    write_document(loaded.path, loaded.document)
    changed = 0
    for name, changes in report:
        if changes:
            changed += 1
            console.print(f"[bold]{escape(name)}[/]: " + escape("; ".join(changes)))
        else:
            console.print(f"{escape(name)}: unchanged")
    for result in failed:
        console.print(f"[red]{escape(result.name)}: not blessed[/]: {escape('; '.join(result.problems))}")
    console.print(f"blessed {len(good)} anchor(s) in {loaded.path} ({changed} changed)")
    raise SystemExit(error_code if failed else 0)


@dataclass(frozen=True)
class ServerGateOptions:
    """Where and how `infer gate --server` talks to the server."""

    url: str
    model: str | None
    """The served model's name (`--model`); None = the first of /v1/models."""
    api_key: str | None
    tokenizer: str | None
    """`--tokenizer`: a model path, 'none', or None for the anchors' own model."""
    timeout: float


def _local_tokenizer(option: str | None, anchors: list[ResolvedAnchor]) -> Tokenizer | None:
    """The tokenizer that makes raw prompts into ids and retokenizes text: `--tokenizer PATH`, none
    with `--tokenizer none`, else the anchors' model (the file's `model:`; the default model when null).
    A model that cannot be loaded is one line on stderr and exit 2."""
    if option is not None and option.lower() == "none":
        return None
    models = {anchor.model for anchor in anchors}
    if option is None and len(models) > 1:
        fail("the anchors name several models: give the served model's tokenizer with --tokenizer PATH")
    source = option if option is not None else next(iter(models))
    path = resolve_model_path(source)
    try:
        return load_checkpoint(path).tokenizer
    except ModelLoadError as exc:
        fail(f"--tokenizer: {exc} (give another with --tokenizer PATH, or --tokenizer none)")


def _remote_prompt_ids(tokenizer: Tokenizer | None, anchor: ResolvedAnchor) -> list[int] | None:
    """A raw anchor's prompt as ids by the local tokenizer (None: chat anchors, or no tokenizer)."""
    spec = anchor.anchor
    if tokenizer is None or spec.messages is not None or spec.chat:
        return None
    return prompt_ids(tokenizer, prompt=spec.prompt, parse_special=spec.parse_special)


def _gate_server(
    loaded: LoadedAnchors, selected: list[ResolvedAnchor], target: ServerGateOptions, options: GateOptions
) -> None:
    """`infer gate --server`: each anchor through the server's completions routes, judged like a local
    run; remote failures are reported per anchor and exit 2 (could not check), never 1."""
    console = STDERR if options.json_output else Console()
    tokenizer = _local_tokenizer(target.tokenizer, selected)
    try:
        base = base_url(target.url)
    except RemoteError as exc:
        fail(str(exc))
    headers = auth_headers(target.api_key)
    started = time.perf_counter()
    remote_runs: dict[int, RemoteRun] = {}
    with httpx.Client(timeout=target.timeout, headers=headers) as client:
        try:
            identity = discover(client, base, target.model)
        except RemoteError as exc:
            fail(f"could not check: {exc}")
        progress = counting_progress()
        runs_each = 2 if options.bless else 1  # bless only what the server reproduces
        unstable: dict[int, str] = {}
        with progress:
            task = progress.add_task("anchors", total=len(selected) * runs_each)
            for anchor in selected:
                progress.update(task, description=f"anchor {anchor.name} on {base}")
                ids = _remote_prompt_ids(tokenizer, anchor)
                runs = []
                for _ in range(runs_each):
                    runs.append(run_remote_anchor(client, base, anchor, identity.model, tokenizer, ids))
                    progress.advance(task)
                remote_runs[anchor.index] = runs[0]
                problem = reproducibility_problem(runs[0], runs[-1]) if len(runs) > 1 else None
                if problem is not None:
                    unstable[anchor.index] = problem
    found = next((r.system_fingerprint for r in remote_runs.values() if r.system_fingerprint), None)
    identity = replace(identity, system_fingerprint=found)
    decode: Callable[[list[int]], str] = (
        tokenizer.decode if tokenizer is not None else lambda ids: ",".join(map(str, ids))
    )
    results = [
        judge_remote(anchor, remote_runs[anchor.index], tie_margin=options.tie_margin, decode=decode)
        for anchor in selected
    ]
    fingerprint = environment_fingerprint(
        backend="server", device=identity.url, model=identity.model, server=identity.to_json()
    )
    if options.bless:
        good = {
            index: remote.blessing()
            for index, remote in remote_runs.items()
            if remote.run.error is None and remote.run.finish_reason != "error" and index not in unstable
        }
        failed = []
        for anchor, result in zip(selected, results, strict=True):
            if remote_runs[anchor.index].run.error is not None:
                result.problems = [p.removeprefix("could not check: ") for p in result.problems[:1]]
                failed.append(result)
            elif anchor.index in unstable:
                result.status, result.problems = "error", [unstable[anchor.index]]
                failed.append(result)
        _bless(
            loaded,
            good,
            failed,
            keep_tokens=options.keep_tokens,
            fingerprint=fingerprint,
            console=console,
            error_code=2,
        )
        return
    _report(
        loaded,
        results,
        _Outcome(
            time.perf_counter() - started,
            fingerprint,
            decode,
            ids_methods={a.name: remote_runs[a.index].ids_method for a in selected},
            server=identity.to_json(),
        ),
        tie_margin=options.tie_margin,
        allow_ties=options.allow_ties,
        junit=options.junit,
        json_output=options.json_output,
        console=console,
    )


__all__ = ["ServerGateOptions", "gate"]
