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
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from threadpoolctl import threadpool_limits

from infer.cli.fingerprint import environment_fingerprint, fingerprint_diff
from infer.cli.gate.anchors import (
    GateFileError,
    LoadedAnchors,
    ResolvedAnchor,
    bless_document,
    load_anchors,
    write_document,
)
from infer.cli.gate.check import AnchorResult, AnchorRun, judge, relative_gap, run_anchor, write_junit
from infer.cli.options import fail, shared_flags
from infer.cli.runtime import STDERR, counting_progress, open_engine
from infer.engine.runtime.engine import Engine
from infer.engine.sampling import SamplingParamsError
from infer.profiles.backend_choice import choose_backend
from infer.profiles.loader import ProfileError
from infer.profiles.settings import SETTINGS, Settings, resolve_settings

DEFAULT_TIE_MARGIN = 1e-3


def _sampler_env_free(env: dict[str, str]) -> dict[str, str]:
    """`env` without the sampler settings' INFER_* twins (anchors pin their sampler)."""
    banned = {spec.env for spec in SETTINGS.values() if spec.section == "sampler"}
    return {key: value for key, value in env.items() if key not in banned}


def anchor_settings(loaded: LoadedAnchors, anchor: ResolvedAnchor, cli_flags: dict[str, Any]) -> Settings:
    """Resolve one anchor's settings: anchor > command-line flags > file defaults > env > profile."""
    defaults = loaded.spec.defaults
    flags: dict[str, Any] = {}
    for name in ("profile", "model"):
        if getattr(defaults, name) is not None:
            flags[name] = getattr(defaults, name)
    flags.update(cli_flags)
    for name in ("profile", "model"):
        if getattr(anchor.anchor, name) is not None:
            flags[name] = getattr(anchor.anchor, name)
    flags.update(anchor.sampler)
    # The anchor's request is built from these settings like every surface's: its n_predict, and 2
    # alternatives per token (the top-2 gap for tie analysis; draws do not depend on n_probs).
    flags["n_predict"] = anchor.n_predict
    flags["n_probs"] = max(2, int(anchor.sampler.get("n_probs", 0)))
    try:
        return resolve_settings(flags, env=_sampler_env_free(dict(os.environ)))
    except (ProfileError, SamplingParamsError) as exc:
        fail(f"{loaded.path}: anchors[{anchor.index}] ({anchor.name}): {exc}")


def _engine_key(settings: Settings) -> tuple[Any, ...]:
    return (
        settings.model,
        settings.backend,
        settings.dtype,
        settings.strict_backend,
        settings.threads,
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


def _table(results: list[AnchorResult], allow_ties: bool) -> Table:
    table = Table(title="infer gate", title_justify="left")
    for column in ("anchor", "expected", "got", "tokens", "time", "status"):
        table.add_column(column, justify="right" if column in ("tokens", "time") else "left")
    for result in results:
        expected_tokens = result.expected.get("tokens")
        tokens = str(result.got["tokens"])
        if expected_tokens is not None and expected_tokens != result.got["tokens"]:
            tokens = f"{expected_tokens} -> {tokens}"
        table.add_row(
            escape(result.name),
            _short(result.expected.get("sha256", "-")),
            _short(result.got["sha256"]),
            tokens,
            f"{result.seconds:.2f}s",
            _status_cell(result, allow_ties),
        )
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


@shared_flags
def gate(
    anchors_file: Path = typer.Argument(..., help="The anchors YAML file.", show_default=False),
    bless: bool = typer.Option(False, "--bless", help="Write fresh expectations (and fingerprint) back."),
    keep_tokens: bool = typer.Option(
        False, "--keep-tokens", help="With --bless: also store token ids and per-step top-2 gaps."
    ),
    tie_margin: float = typer.Option(
        DEFAULT_TIE_MARGIN,
        "--tie-margin",
        help="Near-tie: the top two probabilities differ by less than this fraction, (p1-p2)/p1.",
    ),
    allow_ties: bool = typer.Option(
        False, "--allow-ties", help="A divergence that starts at a near-tie is a warning, not a failure."
    ),
    deterministic: bool = typer.Option(
        False, "--deterministic", help="Pin BLAS threads to the profile's value (0 = all cores) for the run."
    ),
    junit: Optional[Path] = typer.Option(None, "--junit", help="Write a JUnit XML report here."),
    json_output: bool = typer.Option(
        False, "--json", help="JSON results on stdout (everything else on stderr)."
    ),
    filters: Optional[list[str]] = typer.Option(
        None, "--filter", help="Run only anchors whose name contains NAME (or matches a glob); repeatable."
    ),
    *,
    flags: dict[str, Any],
) -> None:
    """Run the anchors in a file and check their token hashes: exit 0 all match, 1 drift, 2 bad file."""
    if not 0.0 < tie_margin < 1.0:
        fail(f"--tie-margin must be in (0, 1), got {tie_margin}")
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
    selected = loaded.select(filters or [])
    if not selected:
        fail(f"no anchor in {anchors_file} matches --filter {' '.join(filters or [])}")
    settings_by_anchor = {anchor.index: anchor_settings(loaded, anchor, flags) for anchor in selected}

    console = STDERR if json_output else Console()
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
            if deterministic:
                threadpool_limits(limits=settings.threads or os.cpu_count() or 1, user_api="blas")
            progress.update(task, description=f"anchor {anchor.name}")
            engine = engines[key]
            run = run_anchor(engine, anchor, settings)
            runs[anchor.index] = run
            results.append(
                judge(
                    anchor, run, tie_margin=tie_margin, decode=lambda ids, e=engine: e.tokenizer.decode(ids)
                )
            )
            progress.advance(task)
    total_seconds = time.perf_counter() - started
    current = _fingerprint(settings_by_anchor[selected[0].index])

    if bless:
        _bless(loaded, runs, results, keep_tokens=keep_tokens, fingerprint=current, console=console)
        return

    ok = all(r.status == "pass" or (allow_ties and r.status == "tie") for r in results)
    console.print(_table(results, allow_ties))
    decoder = next(iter(engines.values())).tokenizer.decode
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
        sys.stdout.write(json.dumps(payload, indent=2) + "\n")
        sys.stdout.flush()
    raise SystemExit(0 if ok else 1)


def _bless(
    loaded: LoadedAnchors,
    runs: dict[int, AnchorRun],
    results: list[AnchorResult],
    *,
    keep_tokens: bool,
    fingerprint: dict[str, Any],
    console: Console,
) -> None:
    """Write fresh expectations for every anchor that generated cleanly; exit 1 if any failed."""
    failed = [r for r in results if r.status == "error"]
    good = {
        index: run.blessing()
        for index, run in runs.items()
        if run.error is None and run.finish_reason != "error"
    }
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
    raise SystemExit(1 if failed else 0)


__all__ = ["gate"]
