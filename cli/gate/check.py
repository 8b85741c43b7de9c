"""Running one anchor, comparing it with its expectation, and the near-tie analysis and JUnit report.

Near-ties. A float change (another BLAS, thread count or CPU) can flip a greedy pick between two almost
equally likely tokens without anything being broken. For each greedy step we record the gap between
the two best tokens, `gap = log p(top1) - log p(top2)` under the raw distribution (log_softmax of the
logits; the normalizer cancels, so this is exactly the logit gap). The tie margin is relative:
a step is a near-tie when `(p1 - p2) / p1 = 1 - exp(-gap) < tie_margin` (default 1e-3, i.e. the
two probabilities differ by less than 0.1 %). A mismatch whose *first* divergence is at a near-tie is
reported as a tie; `--allow-ties` turns those into warnings. Sampled anchors get no tie analysis: a
seeded draw can also flip near a CDF boundary, which the top-2 gap does not measure.
"""

from __future__ import annotations

import json
import math
import time
import xml.etree.ElementTree as ET
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from infer.cli.gate.anchors import (
    Blessing,
    Expectation,
    ResolvedAnchor,
    calls_hash,
    canonical_calls,
    token_hash,
)
from infer.cli.tool_use import ToolRequestError, build_tool_request, read_reply
from infer.engine import Engine, GrammarSpec, Request, RequestError, TokenEvent, prompt_ids
from infer.profiles.requests import build_request
from infer.profiles.settings import Settings

Status = Literal["pass", "fail", "tie", "error", "unblessed"]
CONTEXT_TOKENS = 8
"""Tokens of common prefix and of each continuation shown around a divergence."""


@dataclass
class AnchorRun:
    """What one anchor produced."""

    token_ids: tuple[int, ...]
    top2: tuple[tuple[tuple[int, float], ...], ...]
    """Per step, the top-2 (token id, log-prob) under the raw distribution."""
    text: str
    finish_reason: str
    prompt_tokens: int
    counters: dict[str, int]
    seconds: float
    error: str | None = None
    calls: tuple[dict[str, Any], ...] | None = None
    """The reply's parsed tool calls (`canonical_calls`; None for an anchor without tools)."""
    grammar: GrammarSpec | None = None
    """The constraint a local run generated under (`--audit` replays the tokens through it)."""

    @property
    def sha256(self) -> str:
        """The token hash of the generated ids."""
        return token_hash(self.token_ids)

    @property
    def calls_sha256(self) -> str | None:
        """The calls hash of the parsed tool calls (None for an anchor without tools)."""
        return None if self.calls is None else calls_hash(self.calls)

    @property
    def gaps(self) -> list[float | None]:
        """Per step, log p(top1) - log p(top2) (None when fewer than two alternatives were reported)."""
        return [alts[0][1] - alts[1][1] if len(alts) >= 2 else None for alts in self.top2]

    def blessing(self) -> Blessing:
        """These results as fresh expectations."""
        return Blessing(
            sha256=self.sha256,
            tokens=len(self.token_ids),
            finish_reason=self.finish_reason,
            prompt_tokens=self.prompt_tokens,
            counters=dict(self.counters),
            token_ids=self.token_ids,
            top2_gaps=self.gaps,
            calls_sha256=self.calls_sha256,
        )


def anchor_prompt_ids(engine: Engine, anchor: ResolvedAnchor) -> list[int]:
    """The anchor's prompt (text or chat messages) as token ids."""
    spec = anchor.anchor
    messages = [m.model_dump() for m in spec.messages] if spec.messages is not None else None
    return prompt_ids(
        engine.tokenizer,
        prompt=spec.prompt,
        messages=messages,
        chat=spec.chat,
        parse_special=spec.parse_special,
    )


def anchor_request(ids: Sequence[int], anchor: ResolvedAnchor, settings: Settings) -> Request:
    """The anchor's request, made by `build_request` as on every surface. `settings` are the anchor's
    own (`infer.cli.gate.command`): its sampler, its n_predict and n_probs >= 2 (the top-2 gap for tie
    analysis). Raises `RequestError`."""
    return build_request(ids, settings, stop=anchor.anchor.stop, ignore_eos=anchor.anchor.ignore_eos)


def run_anchor(engine: Engine, anchor: ResolvedAnchor, settings: Settings) -> AnchorRun:
    """Generate one anchor alone (single sequence: batching may change float summation order). An
    anchor with tools is the request `infer generate --tools` makes (the same prompt and grammar),
    and its reply is read for calls as generate reads it."""
    started = time.perf_counter()
    plan = None
    if anchor.tool_choice is not None:
        messages = anchor.chat_messages()
        assert messages is not None  # the anchors file refuses tools on a raw prompt
        try:
            request, plan = build_tool_request(
                engine,
                settings,
                messages,
                choice=anchor.tool_choice,
                stop=anchor.anchor.stop,
                ignore_eos=anchor.anchor.ignore_eos,
            )
        except ToolRequestError as exc:
            return AnchorRun((), (), "", "error", 0, {}, time.perf_counter() - started, str(exc))
    else:
        ids = anchor_prompt_ids(engine, anchor)
        try:
            request = anchor_request(ids, anchor, settings)
        except RequestError as exc:
            return AnchorRun((), (), "", "error", len(ids), {}, time.perf_counter() - started, str(exc))
    try:
        completion = engine.generate(request)
    except RequestError as exc:
        return AnchorRun(
            (), (), "", "error", len(request.prompt_ids), {}, time.perf_counter() - started, str(exc)
        )
    done = completion.done
    top2 = tuple(
        tuple(event.top_logprobs[:2]) for event in completion.tokens if isinstance(event, TokenEvent)
    )
    return AnchorRun(
        token_ids=tuple(done.token_ids),
        top2=top2,
        text=done.text,
        finish_reason=done.finish_reason,
        prompt_tokens=done.usage.prompt_tokens,
        counters=dict(done.counters),
        seconds=time.perf_counter() - started,
        error=done.error,
        calls=None if plan is None else tuple(canonical_calls(read_reply(plan, done).calls)),
        grammar=request.grammar,
    )


def relative_gap(gap: float | None) -> float | None:
    """(p1 - p2) / p1 for a log-prob gap: the relative difference of the top two probabilities."""
    return None if gap is None else -math.expm1(-max(gap, 0.0))


@dataclass
class Divergence:
    """Where the produced ids first leave the expected ones, and whether that step was a near-tie."""

    position: int
    expected_token: int | None
    produced_token: int | None
    expected_gap: float | None
    """The stored top-2 gap at `position` (from the blessed run), when stored."""
    produced_gap: float | None
    """This run's top-2 gap at `position`."""
    produced_runner_up: int | None
    near_tie: bool | None
    """True/False for greedy anchors with a gap to judge by; None when it cannot be told."""
    prefix_text: str
    expected_text: str
    produced_text: str

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields."""
        return {
            "position": self.position,
            "expected_token": self.expected_token,
            "produced_token": self.produced_token,
            "expected_gap": self.expected_gap,
            "produced_gap": self.produced_gap,
            "produced_runner_up": self.produced_runner_up,
            "near_tie": self.near_tie,
            "prefix_text": self.prefix_text,
            "expected_text": self.expected_text,
            "produced_text": self.produced_text,
        }


def find_divergence(
    expected_ids: Sequence[int],
    expected_gaps: Sequence[float | None] | None,
    run: AnchorRun,
    *,
    greedy: bool,
    tie_margin: float,
    decode: Any,
) -> Divergence | None:
    """The first position where `run` differs from `expected_ids` (None when equal).

    Greedy near-tie rule: the step is a near-tie when the stored gap there is below the margin, or when
    this run's gap is below the margin *and* its runner-up is the expected token (the two swapped).
    """
    produced = run.token_ids
    position = next(
        (i for i, (a, b) in enumerate(zip(expected_ids, produced, strict=False)) if a != b),
        min(len(expected_ids), len(produced)),
    )
    if position == len(expected_ids) == len(produced):
        return None
    expected_token = expected_ids[position] if position < len(expected_ids) else None
    produced_token = produced[position] if position < len(produced) else None
    stored_gap = (
        expected_gaps[position] if expected_gaps is not None and position < len(expected_gaps) else None
    )
    produced_gap = run.gaps[position] if position < len(run.gaps) else None
    runner_up = (
        run.top2[position][1][0] if position < len(run.top2) and len(run.top2[position]) >= 2 else None
    )
    near_tie: bool | None = None
    if greedy and expected_token is not None and produced_token is not None:
        checks: list[bool] = []
        if stored_gap is not None:
            checks.append(relative_gap(stored_gap) < tie_margin)  # type: ignore[operator]
        if produced_gap is not None:
            checks.append(relative_gap(produced_gap) < tie_margin and runner_up == expected_token)  # type: ignore[operator]
        near_tie = any(checks) if checks else None
    start = max(0, position - CONTEXT_TOKENS)
    return Divergence(
        position=position,
        expected_token=expected_token,
        produced_token=produced_token,
        expected_gap=stored_gap,
        produced_gap=produced_gap,
        produced_runner_up=runner_up,
        near_tie=near_tie,
        prefix_text=decode(list(expected_ids[start:position])),
        expected_text=decode(list(expected_ids[position : position + CONTEXT_TOKENS])),
        produced_text=decode(list(produced[position : position + CONTEXT_TOKENS])),
    )


@dataclass
class AnchorResult:
    """The verdict on one anchor."""

    name: str
    status: Status
    expected: dict[str, Any]
    got: dict[str, Any]
    seconds: float
    problems: list[str] = field(default_factory=list)
    divergence: Divergence | None = None
    run: AnchorRun | None = None

    @property
    def ok(self) -> bool:
        """Whether the anchor passed (a tie counts only when ties are allowed; the caller decides)."""
        return self.status == "pass"

    def to_json(self) -> dict[str, Any]:
        """JSON-ready fields (without the raw run)."""
        return {
            "name": self.name,
            "status": self.status,
            "expected": self.expected,
            "got": self.got,
            "seconds": round(self.seconds, 4),
            "problems": self.problems,
            "divergence": self.divergence.to_json() if self.divergence else None,
        }


def judge(anchor: ResolvedAnchor, run: AnchorRun, *, tie_margin: float, decode: Any) -> AnchorResult:
    """Compare a run with the anchor's expectation."""
    expect = anchor.anchor.expect
    got = {
        "sha256": run.sha256,
        "tokens": len(run.token_ids),
        "finish_reason": run.finish_reason,
        "prompt_tokens": run.prompt_tokens,
        "counters": run.counters,
        "text": run.text,
    }
    if run.calls is not None:
        got["calls"] = list(run.calls)
        got["calls_sha256"] = run.calls_sha256
    expected = expect.model_dump(exclude={"token_ids", "top2_gaps"}, exclude_none=True) if expect else {}
    result = AnchorResult(anchor.name, "pass", expected, got, run.seconds, run=run)
    if run.error is not None or run.finish_reason == "error":
        result.status = "error"
        result.problems.append(f"generation failed: {run.error}")
        return result
    if expect is None or expect.sha256 is None:
        result.status = "unblessed"
        result.problems.append("no expected sha256 stored: run `infer gate FILE --bless` to record one")
        return result
    problems = result.problems
    if run.sha256 != expect.sha256:
        problems.append(f"sha256 {expect.sha256[:12]}… expected, got {run.sha256[:12]}…")
    if expect.tokens is not None and expect.tokens != len(run.token_ids):
        problems.append(f"tokens: expected {expect.tokens}, got {len(run.token_ids)}")
    if expect.finish_reason is not None and expect.finish_reason != run.finish_reason:
        problems.append(f"finish_reason: expected {expect.finish_reason}, got {run.finish_reason}")
    if expect.prompt_tokens is not None and expect.prompt_tokens != run.prompt_tokens:
        problems.append(
            f"prompt_tokens: expected {expect.prompt_tokens}, got {run.prompt_tokens} (the tokenizer or "
            "chat template changed)"
        )
    check_calls(expect, run, problems, tokens_changed=run.sha256 != expect.sha256)
    for key, value in expect.counters.items():
        if run.counters.get(key) != value:
            problems.append(
                f"counters.{key}: expected {value}, got {run.counters.get(key)} (speculation counter "
                "changed: drafting, draft length or verification differs from the blessed run)"
            )
    if expect.token_ids is not None:
        if token_hash(expect.token_ids) != expect.sha256:
            problems.append("note: the stored sha256 does not match the stored token_ids (edited by hand?)")
        divergence = find_divergence(
            expect.token_ids,
            expect.top2_gaps,
            run,
            greedy=anchor.greedy,
            tie_margin=tie_margin,
            decode=decode,
        )
        result.divergence = divergence
        if divergence is not None and not any(p.startswith("sha256") for p in problems):
            problems.append(f"token ids differ from the stored ones at position {divergence.position}")
    real = [p for p in problems if not p.startswith("note:")]
    if real:
        tie = result.divergence is not None and result.divergence.near_tie is True
        result.status = "tie" if tie else "fail"
    return result


def _calls_text(calls: Sequence[dict[str, Any]]) -> str:
    shown = [f"{c['name']}({json.dumps(c['arguments'], ensure_ascii=False)})" for c in calls]
    return ", ".join(shown) or "none"


def check_calls(expect: Expectation, run: AnchorRun, problems: list[str], *, tokens_changed: bool) -> None:
    """The calls part of a verdict: a changed calls hash is a problem that shows the calls made now;
    when only the tokens (or the text) changed, a note says the calls did not."""
    if run.calls is None:
        return
    got = run.calls_sha256
    if expect.calls_sha256 is None:
        problems.append("note: no calls_sha256 stored for this tool anchor: --bless records one")
    elif got != expect.calls_sha256:
        problems.append(
            f"calls_sha256 {expect.calls_sha256[:12]}… expected, got {got[:12]}…: the tool calls "  # type: ignore[index]
            f"changed (now: {_calls_text(run.calls)})"
        )
    elif tokens_changed:
        problems.append(
            f"note: the tool calls are unchanged ({_calls_text(run.calls)}); only the tokens differ"
        )


def write_junit(
    path: Path, results: Sequence[AnchorResult], *, suite: str, allow_ties: bool, seconds: float
) -> None:
    """A JUnit XML report: one testcase per anchor; failures carry the problems and the divergence."""
    failed = sum(
        1 for r in results if r.status in ("fail", "unblessed") or (r.status == "tie" and not allow_ties)
    )
    errors = sum(1 for r in results if r.status == "error")
    suites = ET.Element("testsuites", name="infer gate", tests=str(len(results)), failures=str(failed))
    node = ET.SubElement(
        suites,
        "testsuite",
        name=suite,
        tests=str(len(results)),
        failures=str(failed),
        errors=str(errors),
        skipped="0",
        time=f"{seconds:.3f}",
    )
    for result in results:
        case = ET.SubElement(
            node, "testcase", classname=suite, name=result.name, time=f"{result.seconds:.3f}"
        )
        details = "\n".join(result.problems)
        if result.divergence is not None:
            d = result.divergence
            details += (
                f"\nfirst divergence at token {d.position}: expected {d.expected_token}, "
                f"got {d.produced_token}"
                f" (near-tie: {d.near_tie})\n  context : {d.prefix_text!r}\n  expected: {d.expected_text!r}"
                f"\n  produced: {d.produced_text!r}"
            )
        if result.status == "error":
            ET.SubElement(
                case, "error", message=result.problems[0] if result.problems else "error"
            ).text = details
        elif result.status in ("fail", "unblessed") or (result.status == "tie" and not allow_ties):
            message = "; ".join(p for p in result.problems if not p.startswith("note:")) or result.status
            ET.SubElement(case, "failure", message=message, type=result.status).text = details
        elif result.status == "tie":
            ET.SubElement(case, "system-out").text = "warning: tie-only divergence (allowed)\n" + details
    ET.indent(suites)
    path.parent.mkdir(parents=True, exist_ok=True)
    ET.ElementTree(suites).write(path, encoding="utf-8", xml_declaration=True)


__all__ = [
    "AnchorResult",
    "AnchorRun",
    "Divergence",
    "check_calls",
    "find_divergence",
    "judge",
    "relative_gap",
    "run_anchor",
    "write_junit",
]
