"""Serving-benchmark inputs for `infer bench --server --dataset`: a JSONL prompt file, request arrival
times (Poisson, or gamma-distributed with `--burstiness`, as `vllm bench serve` draws them) and the
`--slo` targets goodput is counted against.

A dataset line is one JSON object: `{"prompt": "..."}` or `{"messages": [{"role", "content"}, ...]}`,
optionally with `"max_tokens": N` (else `-n`), and for a chat (`--api chat`) `"tools"` (OpenAI
function tools) with an optional `"tool_choice"` (none, auto, required, a function's name, or
OpenAI's `{"type": "function", "function": {"name": ...}}`) and `"parallel_tool_calls"`, sent with
the request as an agent sends them. `scripts/bench_prompts.jsonl` is a small one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ARRIVAL_SEED = 1234
"""Arrival gaps are drawn from this seed: the same schedule on every run."""


class DatasetError(ValueError):
    """The dataset or an option cannot be used; the message is one line naming the file and line."""


@dataclass(frozen=True)
class DatasetItem:
    """One request of a dataset."""

    prompt: str | None
    messages: list[dict[str, Any]] | None
    max_tokens: int | None
    tools: list[Any] | None = None
    """Function tools the chat offers (OpenAI's shape), sent as the request's `tools`."""
    tool_choice: str | dict[str, Any] | None = None
    """The request's `tool_choice` in OpenAI's shape (None: the server's default, auto)."""
    parallel_tool_calls: bool | None = None
    """The request's `parallel_tool_calls` (None: the server's default, true)."""

    def as_messages(self) -> list[dict[str, Any]]:
        """Chat messages (a prompt becomes one user message)."""
        return self.messages if self.messages is not None else [{"role": "user", "content": self.prompt}]


def load_dataset(path: Path, *, api: str) -> list[DatasetItem]:
    """Read a JSONL dataset; `api` completions refuses chat lines (they need a chat template)."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise DatasetError(f"--dataset {path}: cannot read it ({exc.strerror or exc})") from None
    items: list[DatasetItem] = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"--dataset {path}:{number}"
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg})") from None
        if not isinstance(data, dict) or ("prompt" in data) == ("messages" in data):
            raise DatasetError(f'{where}: give exactly one of "prompt" (text) or "messages" (a chat)')
        prompt, messages = data.get("prompt"), data.get("messages")
        if prompt is not None and not isinstance(prompt, str):
            raise DatasetError(f'{where}: "prompt" must be text')
        if messages is not None:
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) for m in messages
            ):
                raise DatasetError(f'{where}: "messages" must be a list of {{"role", "content"}} objects')
            if api != "chat":
                raise DatasetError(f"{where}: a chat line needs --api chat (the server's chat template)")
        max_tokens = data.get("max_tokens")
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise DatasetError(f'{where}: "max_tokens" must be an integer >= 1')
        tools, tool_choice, parallel = _tools_of(data, where, api)
        items.append(DatasetItem(prompt, messages, max_tokens, tools, tool_choice, parallel))
    if not items:
        raise DatasetError(f"--dataset {path}: no requests in it")
    return items


def _tools_of(data: dict[str, Any], where: str, api: str) -> tuple[list[Any] | None, Any, bool | None]:
    """A line's `tools`, `tool_choice` (OpenAI's shape, or a bare function name) and
    `parallel_tool_calls`, checked as the server checks them."""
    from infer.cli.serve.errors import APIError
    from infer.cli.serve.tools import read_tool_choice
    from infer.cli.tool_use import tool_choice_value

    tools, choice, parallel = data.get("tools"), data.get("tool_choice"), data.get("parallel_tool_calls")
    if tools is None:
        for key in ("tool_choice", "parallel_tool_calls"):
            if data.get(key) is not None:
                raise DatasetError(f'{where}: "{key}" needs "tools"')
        return None, None, None
    if parallel is not None and not isinstance(parallel, bool):
        raise DatasetError(f'{where}: "parallel_tool_calls" must be true or false')
    if api != "chat":
        raise DatasetError(f"{where}: a line with tools needs --api chat (the server's chat template)")
    if isinstance(choice, str):
        choice = tool_choice_value(choice)
    if not isinstance(tools, list) or not tools:
        raise DatasetError(f'{where}: "tools" must be a non-empty list of function tools')
    try:
        read_tool_choice(tools, choice, parallel, flat=False)
    except APIError as exc:
        raise DatasetError(f"{where}: {exc.message}") from None
    return tools, choice, parallel


def arrival_offsets(count: int, rate: float, burstiness: float, seed: int = ARRIVAL_SEED) -> list[float]:
    """Seconds from the start at which each of `count` requests is sent.

    `rate` requests/s on average (inf: all at once). Gaps are gamma-distributed with shape
    `burstiness` and mean 1/rate: 1 is a Poisson process, below 1 burstier, above 1 more regular.
    """
    if math.isinf(rate):
        return [0.0] * count
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    gaps[0] = 0.0  # the first request starts the clock
    return [float(x) for x in np.cumsum(gaps)]


SLO_KEYS = {"ttft": "ttft_ms", "tpot": "tpot_ms", "e2e": "e2e_ms"}
"""`--slo` names and the per-request figure each bounds (milliseconds)."""


def parse_slo(text: str | None) -> dict[str, float]:
    """`"ttft=500,tpot=50"` -> {"ttft": 500.0, "tpot": 50.0} (milliseconds); DatasetError when bad."""
    if not text:
        return {}
    out: dict[str, float] = {}
    for part in text.split(","):
        key, sep, value = part.partition("=")
        key = key.strip().lower()
        if not sep or key not in SLO_KEYS:
            raise DatasetError(f"--slo takes NAME=MS pairs with NAME in {', '.join(SLO_KEYS)}, got {part!r}")
        try:
            bound = float(value.removesuffix("ms"))
        except ValueError:
            raise DatasetError(f"--slo {key}: a number of milliseconds, got {value!r}") from None
        if not bound > 0:
            raise DatasetError(f"--slo {key} must be > 0 ms, got {value!r}")
        out[key] = bound
    return out


__all__ = [
    "SLO_KEYS",
    "DatasetError",
    "DatasetItem",
    "arrival_offsets",
    "load_dataset",
    "parse_slo",
]
