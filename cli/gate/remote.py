"""Running anchors on an OpenAI-compatible server (`infer gate --server URL`).

Raw anchors go to `/v1/completions` (the prompt as token ids when a local tokenizer is at hand, so the
server sees exactly the ids a local run sees; as text otherwise), chat anchors (`messages`, or `chat:
true`) to `/v1/chat/completions`, which renders the server's chat template. Every request is greedy or
seeded as the anchor's sampler says, unstreamed, and asks for the generated ids every way a server may
give them; the first that answers wins, and the report says which:

1. `token_ids` on the choice: vLLM's `return_token_ids` (also `infer serve`'s);
2. `__verbose.tokens`: llama-server's `return_tokens` (with `verbose`, its debug copy of the native
   answer, the only place its OpenAI routes put every generated id);
3. the ids inside the logprobs: llama-server's `logprobs.content[i].id` (`n_probs`), or vLLM's
   `return_tokens_as_token_ids` (`"token_id:1234"` strings, also `infer serve`'s), used only when
   there is one entry per generated token (llama-server merges the tokens of a split UTF-8
   character into one entry and drops a stop string's tokens);
4. the returned text tokenized with the model's own tokenizer (last resort; a text may tokenize
   otherwise than it was generated, and the end-of-text token is put back only when no stop string
   could have ended the run);
5. text only: the text's sha256 is compared with the anchor's `text_sha256` (stored by
   `--bless --server`).

Tools: an anchor with `tools` sends them and its `tool_choice` in the chat request, and its calls
are read from the answer's `message.tool_calls` (the server parses them, as `infer serve` does); a
`tool_calls` finish reason is the engine's `stop`. A server that returns no `tool_calls` where calls
were asked for (`required` or a named function) or blessed cannot have its calls checked (exit 2).

Near-ties: the same requests ask for the top-2 logprobs (`top_logprobs: 2`, `logprobs: 2`,
`n_probs: 2`); without them the report says the classification was not possible.

Reproducible requests: every request asks llama-server not to reuse its slot's cached prompt
(`cache_prompt: false`; reusing it evaluates the rest of the prompt in another batch shape, which can
flip a greedy pick at a small gap between two identical requests). `--bless` runs each anchor twice
and blesses only an anchor whose two runs agree (`reproducibility_problem`), so a server that is not
reproducible is found when the anchors are made, not in CI.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import httpx

from infer.cli.gate.anchors import Blessing, ResolvedAnchor, calls_hash, canonical_calls
from infer.cli.gate.check import AnchorResult, AnchorRun, check_calls, judge, relative_gap
from infer.cli.server_client import RemoteError, server_message, transport_message
from infer.cli.tool_use import tool_choice_value
from infer.engine import Tokenizer

IDS_FIELD = "token_ids"
"""Ids from the choice's `token_ids` (vLLM `return_token_ids`)."""
IDS_TOKENS = "tokens"
"""Ids from llama-server's `__verbose.tokens` (`return_tokens` with `verbose`)."""
IDS_LOGPROBS = "logprobs"
"""Ids from the logprobs entries (llama-server `n_probs`, vLLM `return_tokens_as_token_ids`)."""
IDS_RETOKENIZED = "retokenized"
"""Ids from tokenizing the returned text locally (may differ from the generated ids)."""
IDS_TEXT_ONLY = "text only"
"""No ids: the text's sha256 is compared instead."""

TOP_ALTERNATIVES = 2
_TOKEN_ID = re.compile(r"^token_id:(-?\d+)$")
_FINISH_REASONS = ("stop", "length")


def text_hash(text: str) -> str:
    """sha256 hex digest of the completion text in UTF-8 (the text-only comparison)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass
class RemoteRun:
    """One anchor's run on a server: the run itself and how its ids were obtained."""

    run: AnchorRun
    ids_method: str
    text_sha256: str
    top2: bool
    """Whether every step came with two alternatives (near-tie classification possible)."""
    notes: list[str] = dataclasses.field(default_factory=list)
    system_fingerprint: str | None = None
    """The answer's `system_fingerprint` (llama-server puts its build there)."""
    calls_returned: bool = True
    """Whether the answer had a `tool_calls` list (False: a tool anchor's reply without one, read as
    no calls)."""

    def blessing(self) -> Blessing:
        """Fresh expectations; text-only runs bless the text hash alone."""
        if self.ids_method == IDS_TEXT_ONLY:
            return Blessing(
                sha256=None,
                tokens=None,
                finish_reason=self.run.finish_reason,
                prompt_tokens=self.run.prompt_tokens,
                counters=None,
                token_ids=(),
                top2_gaps=(),
                text_sha256=self.text_sha256,
                calls_sha256=self.run.calls_sha256,
            )
        fresh = self.run.blessing()
        gaps = (
            fresh.top2_gaps if len(fresh.top2_gaps) == len(fresh.token_ids) else [None] * len(fresh.token_ids)
        )
        return dataclasses.replace(fresh, counters=None, top2_gaps=gaps, text_sha256=self.text_sha256)


def anchor_messages(anchor: ResolvedAnchor) -> list[dict[str, Any]] | None:
    """The chat messages of a chat anchor (`messages`, or `chat: true` around the prompt); None for raw."""
    return anchor.chat_messages()


def anchor_body(
    anchor: ResolvedAnchor, model: str, prompt_ids: Sequence[int] | None
) -> tuple[str, dict[str, Any]]:
    """(path under /v1, JSON body) of one anchor's request.

    The sampler goes as the anchor pins it, under infer's names (llama.cpp's, which vLLM shares for
    `top_k`, `min_p`, `seed`); the token-id and logprob fields of every known server are all sent,
    since servers ignore the fields they do not know.
    """
    spec = anchor.anchor
    sampler = dict(anchor.sampler)
    n_probs = max(TOP_ALTERNATIVES, int(sampler.pop("n_probs", 0) or 0))
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": anchor.n_predict,
        "stream": False,
        **sampler,
        "n_probs": n_probs,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "return_tokens": True,
        "verbose": True,
        "cache_prompt": False,
    }
    if spec.stop:
        body["stop"] = list(spec.stop)
    if spec.ignore_eos:
        body["ignore_eos"] = True
    messages = anchor_messages(anchor)
    if anchor.tools is not None:
        body["tools"] = anchor.tools
        if spec.tool_choice is not None:
            body["tool_choice"] = tool_choice_value(spec.tool_choice)
    if messages is not None:
        return "/chat/completions", {
            **body,
            "messages": messages,
            "logprobs": True,
            "top_logprobs": n_probs,
        }
    prompt: Any = list(prompt_ids) if prompt_ids is not None else spec.prompt
    return "/completions", {**body, "prompt": prompt, "logprobs": n_probs}


def _entry_id(entry: Any) -> int | None:
    """A token id from a logprobs entry: llama-server's `id`, or vLLM's `"token_id:N"` token text."""
    if isinstance(entry, dict):
        if isinstance(entry.get("id"), int):
            return int(entry["id"])
        entry = entry.get("token")
    if isinstance(entry, str):
        match = _TOKEN_ID.match(entry)
        if match:
            return int(match.group(1))
    return None


def _alternatives(top: Any) -> list[tuple[int, float]] | None:
    """The best two (id, logprob) of one step's `top_logprobs` (id -1 when only text came back)."""
    pairs: list[tuple[int, float]] = []
    if isinstance(top, dict):  # legacy completions: {token text: logprob}
        items: list[Any] = [{"token": k, "logprob": v} for k, v in top.items()]
    elif isinstance(top, list):
        items = top
    else:
        return None
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("logprob"), (int, float)):
            continue
        found = _entry_id(item)
        pairs.append((found if found is not None else -1, float(item["logprob"])))
    pairs.sort(key=lambda pair: -pair[1])
    return pairs[:TOP_ALTERNATIVES] if len(pairs) >= TOP_ALTERNATIVES else None


def _logprob_steps(logprobs: Any) -> tuple[list[int | None], list[list[tuple[int, float]] | None]]:
    """Per step: the token id (None when not given) and the top-2 alternatives (None when not given),
    from the chat shape (`content: [...]`, also llama-server's completions) or the legacy shape."""
    if not isinstance(logprobs, dict):
        return [], []
    content = logprobs.get("content")
    if isinstance(content, list):
        return [_entry_id(e) for e in content], [
            _alternatives(e.get("top_logprobs")) if isinstance(e, dict) else None for e in content
        ]
    tokens = logprobs.get("tokens")
    if isinstance(tokens, list):
        tops = logprobs.get("top_logprobs") or [None] * len(tokens)
        return [_entry_id(t) for t in tokens], [_alternatives(t) for t in tops]
    return [], []


def _retokenize(
    text: str, finish_reason: str, anchor: ResolvedAnchor, tokenizer: Tokenizer
) -> tuple[list[int] | None, str | None]:
    """The text's ids by the local tokenizer, with the end-of-text id put back when the run stopped on
    it; (None, why) when that cannot be told (a stop string may have ended it)."""
    ids = tokenizer.encode(text, parse_special=False, add_bos=False)
    if finish_reason == "stop":
        if anchor.anchor.stop:
            return None, "the run ended with stop strings possible, so the last id is unknown"
        if tokenizer.eos_id is None:
            return None, "the tokenizer has no end-of-text id to put back"
        ids.append(tokenizer.eos_id)
    return ids, None


def _id_list(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in value)


def parse_completion(
    data: Any, *, chat: bool, anchor: ResolvedAnchor, tokenizer: Tokenizer | None, seconds: float
) -> RemoteRun:
    """A server's whole (unstreamed) completion as a run; raises RemoteError on a malformed answer."""
    try:
        choice = data["choices"][0]
        message = (choice.get("message") or {}) if chat else {}
        text = message.get("content") if chat else choice.get("text")
        finish = choice.get("finish_reason")
    except (KeyError, IndexError, TypeError, AttributeError):
        raise RemoteError("the answer has no choices[0] (not an OpenAI completion)") from None
    text = text if isinstance(text, str) else ""
    calls: tuple[dict[str, Any], ...] | None = None
    returned = True
    if anchor.tool_choice is not None:
        if finish == "tool_calls":  # OpenAI's name for a reply that stopped after its calls
            finish = "stop"
        given_calls = message.get("tool_calls")
        returned = isinstance(given_calls, list)
        try:
            calls = tuple(canonical_calls(given_calls if returned else []))
        except ValueError as exc:
            raise RemoteError(f"malformed tool_calls in the answer ({exc})") from None
    usage = data.get("usage") if isinstance(data.get("usage"), dict) else {}
    prompt_tokens = int(usage.get("prompt_tokens") or 0)
    notes: list[str] = []
    error: str | None = None
    if finish not in _FINISH_REASONS:
        error = f"the server ended the completion with finish_reason {finish!r}"
    step_ids, step_tops = _logprob_steps(choice.get("logprobs"))
    completion_tokens = usage.get("completion_tokens")
    whole = not isinstance(completion_tokens, int) or completion_tokens == len(step_ids)
    verbose = data.get("__verbose") if isinstance(data.get("__verbose"), dict) else {}
    ids: list[int] | None = None
    given, native = choice.get("token_ids"), verbose.get("tokens")
    if _id_list(given):
        ids, method = [int(t) for t in given], IDS_FIELD
    elif _id_list(native):
        ids, method = [int(t) for t in native], IDS_TOKENS
    elif step_ids and whole and all(t is not None for t in step_ids):
        ids, method = [int(t) for t in step_ids if t is not None], IDS_LOGPROBS
    elif tokenizer is not None and calls:
        method = IDS_TEXT_ONLY  # the content is not the whole output: the calls are not in it
        notes.append("ids not recoverable: a reply with calls has them outside its text (not retokenized)")
    elif tokenizer is not None:
        ids, why = _retokenize(text, str(finish), anchor, tokenizer)
        method = IDS_RETOKENIZED if ids is not None else IDS_TEXT_ONLY
        if why:
            notes.append(f"ids not recoverable: {why}")
    else:
        method = IDS_TEXT_ONLY
        notes.append("the server returned no token ids and no local tokenizer was given")
    top2 = bool(step_tops) and all(t is not None for t in step_tops)
    if ids is not None and top2 and len(step_tops) != len(ids):
        top2 = False  # logprobs for another number of tokens than the ids: not to be paired up
    run = AnchorRun(
        token_ids=tuple(ids or ()),
        top2=tuple(tuple(t) for t in step_tops if t is not None) if top2 else (),
        text=text,
        finish_reason=str(finish) if finish in _FINISH_REASONS else "error",
        prompt_tokens=prompt_tokens,
        counters={},
        seconds=seconds,
        error=error,
        calls=calls,
    )
    remote = RemoteRun(run, method, text_hash(text), top2, notes, calls_returned=returned)
    if run.error is None:
        run.error = _missing_calls(anchor, remote)
    return remote


def error_run(message: str, seconds: float) -> RemoteRun:
    """A run that could not be checked (the server's message in `run.error`)."""
    run = AnchorRun((), (), "", "error", 0, {}, seconds, message)
    return RemoteRun(run, "-", text_hash(""), False)


def run_remote_anchor(
    client: httpx.Client,
    base: str,
    anchor: ResolvedAnchor,
    model: str,
    tokenizer: Tokenizer | None,
    prompt_ids: Sequence[int] | None,
) -> RemoteRun:
    """POST one anchor to the server; every remote failure becomes an error run with its message."""
    path, body = anchor_body(anchor, model, prompt_ids)
    started = time.perf_counter()
    try:
        response = client.post(base + path, json=body)
        if response.status_code != 200:
            message = server_message(response.status_code, response.content)
            return error_run(f"POST {path}: {message}", time.perf_counter() - started)
        data = response.json()
    except httpx.HTTPError as exc:
        message = transport_message(exc, client.timeout.read)
        return error_run(f"POST {path}: {message}", time.perf_counter() - started)
    except ValueError:
        return error_run(f"POST {path}: the answer is not JSON", time.perf_counter() - started)
    seconds = time.perf_counter() - started
    if isinstance(data, dict) and data.get("error"):
        return error_run(f"POST {path}: {server_message(200, response.content)}", seconds)
    try:
        remote = parse_completion(
            data, chat=path == "/chat/completions", anchor=anchor, tokenizer=tokenizer, seconds=seconds
        )
    except RemoteError as exc:
        return error_run(f"POST {path}: {exc}", seconds)
    found = data.get("system_fingerprint")
    remote.system_fingerprint = str(found) if found else None
    return remote


def reproducibility_problem(first: RemoteRun, second: RemoteRun) -> str | None:
    """Why two runs of one anchor on the same server cannot be blessed (None when they agree): the
    first token where their ids differ, with the first run's top-2 probability gap there, or the
    texts' hashes when only text came back. Runs with an error are not compared (reported as such)."""
    if first.run.error is not None or second.run.error is not None:
        return None
    prefix = "server not reproducible for this anchor: two identical requests gave "
    if first.run.calls != second.run.calls:
        return prefix + "different tool calls"
    if IDS_TEXT_ONLY in (first.ids_method, second.ids_method):
        if first.text_sha256 == second.text_sha256:
            return None
        return prefix + f"different texts (sha256 {first.text_sha256[:12]}… and {second.text_sha256[:12]}…)"
    a, b = first.run.token_ids, second.run.token_ids
    if a == b and first.run.finish_reason == second.run.finish_reason:
        return None
    position = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    if position >= min(len(a), len(b)):
        what = f"{len(a)} and {len(b)} tokens ({first.run.finish_reason} / {second.run.finish_reason})"
        return prefix + what
    gaps = first.run.gaps if first.top2 else []
    gap = relative_gap(gaps[position]) if position < len(gaps) else None
    gap_text = f"a top-2 probability gap of {gap:.1%}" if gap is not None else "no top-2 gap reported"
    return (
        prefix + f"different tokens from position {position} (id {a[position]} vs {b[position]}; {gap_text})"
    )


def judge_remote(
    anchor: ResolvedAnchor, remote: RemoteRun, *, tie_margin: float, decode: Any
) -> AnchorResult:
    """Compare a server run with the anchor's expectation.

    A remote failure is status `error` (the command exits 2: could not check, never 1). Counters
    (speculation) are not reported by servers and are not compared. Text-only runs compare the
    text's sha256 with the stored `text_sha256`.
    """
    run = remote.run
    expect = anchor.anchor.expect
    if run.error is not None:
        result = AnchorResult(anchor.name, "error", _expected(anchor), _got(remote), run.seconds, run=run)
        result.problems.append(f"could not check: {run.error}")
        return result
    if expect is not None and expect.counters:
        expect = expect.model_copy(update={"counters": {}})
        remote.notes.append("counters are not reported by a server: not compared")
    bare = dataclasses.replace(anchor, anchor=anchor.anchor.model_copy(update={"expect": expect}))
    if remote.ids_method == IDS_TEXT_ONLY:
        result = _judge_text(bare, remote)
    else:
        result = judge(bare, run, tie_margin=tie_margin, decode=decode)
        result.got["text_sha256"] = remote.text_sha256
        result.got["ids_method"] = remote.ids_method
    if result.status in ("fail", "tie") and anchor.greedy and not remote.top2:
        result.problems.append(
            "note: near-tie classification not possible from this run: the server returned no top-2 "
            "logprobs" + (" (the stored gaps were used)" if expect and expect.top2_gaps else "")
        )
    result.problems.extend(f"note: {n}" for n in remote.notes)
    return result


def _missing_calls(anchor: ResolvedAnchor, remote: RemoteRun) -> str | None:
    """Why a tool anchor's calls cannot be checked on this server (None when they can): the answer
    had no `tool_calls` although the anchor forces a call or its blessed calls are not empty, and its
    tokens do not already show a drift."""
    choice, expect = anchor.tool_choice, anchor.anchor.expect
    if choice is None or remote.calls_returned or choice.mode == "none":
        return None
    blessed_calls = expect is not None and expect.calls_sha256 not in (None, calls_hash([]))
    if choice.mode != "required" and not blessed_calls:
        return None  # a reply without calls, as the anchor was blessed
    tokens_drifted = (
        remote.ids_method != IDS_TEXT_ONLY
        and expect is not None
        and expect.sha256 is not None
        and remote.run.sha256 != expect.sha256
    )
    if tokens_drifted:
        remote.notes.append("the server returned no tool_calls")
        return None
    return (
        "the server returned no tool_calls for an anchor with tools (it may not parse tool calls, "
        "e.g. vLLM without --enable-auto-tool-choice), so the calls cannot be checked"
    )


def _expected(anchor: ResolvedAnchor) -> dict[str, Any]:
    expect = anchor.anchor.expect
    return expect.model_dump(exclude={"token_ids", "top2_gaps"}, exclude_none=True) if expect else {}


def _got(remote: RemoteRun) -> dict[str, Any]:
    run = remote.run
    return {
        "sha256": run.sha256 if remote.ids_method not in (IDS_TEXT_ONLY, "-") else "-",
        "tokens": len(run.token_ids) if remote.ids_method not in (IDS_TEXT_ONLY, "-") else None,
        "finish_reason": run.finish_reason,
        "prompt_tokens": run.prompt_tokens,
        "counters": {},
        "text": run.text,
        "text_sha256": remote.text_sha256,
        "ids_method": remote.ids_method,
        **({"calls": list(run.calls), "calls_sha256": run.calls_sha256} if run.calls is not None else {}),
    }


def _judge_text(anchor: ResolvedAnchor, remote: RemoteRun) -> AnchorResult:
    run = remote.run
    expect = anchor.anchor.expect
    result = AnchorResult(anchor.name, "pass", _expected(anchor), _got(remote), run.seconds, run=run)
    if expect is None or expect.text_sha256 is None:
        result.status = "error"
        result.problems.append(
            "could not check: only text came back and the anchor stores no text_sha256 "
            "(bless with `--bless --server` to store one)"
        )
        return result
    if expect.text_sha256 != remote.text_sha256:
        result.problems.append(
            f"text_sha256 {expect.text_sha256[:12]}… expected, got {remote.text_sha256[:12]}… "
            "(text-only comparison)"
        )
    if expect.finish_reason is not None and expect.finish_reason != run.finish_reason:
        result.problems.append(f"finish_reason: expected {expect.finish_reason}, got {run.finish_reason}")
    check_calls(expect, run, result.problems, tokens_changed=expect.text_sha256 != remote.text_sha256)
    if any(not p.startswith("note:") for p in result.problems):
        result.status = "fail"
    return result


__all__ = [
    "IDS_FIELD",
    "IDS_LOGPROBS",
    "IDS_RETOKENIZED",
    "IDS_TEXT_ONLY",
    "IDS_TOKENS",
    "RemoteRun",
    "anchor_body",
    "judge_remote",
    "parse_completion",
    "reproducibility_problem",
    "run_remote_anchor",
    "text_hash",
]
