"""Anchors files for `infer gate`: the schema (pydantic), loading with key-path errors, the token hash,
and blessing (writing fresh expectations back with comments and key order preserved, via ruamel.yaml).

Token hash serialization (fixed; changing it invalidates every anchors file):
    sha256 of the ASCII text of the generated token ids in decimal, joined by "," with no spaces and no
    trailing separator, e.g. ids (7042, 30, 198) -> sha256(b"7042,30,198"). The ids are every generated
    token, including the EOS/EOT token or the token that completed a stop string. No ids -> sha256(b"").

Calls hash (anchors with `tools`; fixed likewise): sha256 of the UTF-8 JSON text of the reply's parsed
calls, in order, each `{"arguments": ..., "name": ...}` with the arguments decoded (a string that is
not JSON stays that string), written with sorted keys, separators "," and ":", non-ASCII as is, e.g.
[{"arguments":{"city":"Paris"},"name":"get_weather"}]. No calls -> sha256(b"[]").

File layout (see anchors/default.yaml):

    version: 1
    defaults:            # optional; per-anchor values override these
      profile: cpu
      model: null        # null = the embedded default model
      sampler: {top_k: 40}
      n_predict: 32
    fingerprint: {...}   # written by --bless: the environment the expectations were made on
    anchors:
      - name: greedy-capital
        prompt: "The capital of France is"    # or `messages: [{role, content}, ...]`, or `chat: true`
        sampler: {temperature: 0}             # greedy; temperature > 0 needs a seed
        n_predict: 32
        stop: ["\\n"]
        expect:                               # written by --bless
          sha256: ...
          tokens: 32
          finish_reason: length
          prompt_tokens: 6
          token_ids: [...]                    # with --keep-tokens
          top2_gaps: [...]                    # with --keep-tokens: per step, log p(top1) - log p(top2)
      - name: forced-call
        messages: [{role: user, content: "What is the weather in Paris?"}]   # or `chat: true`
        tools: tools.json                     # or the list inline; rendered as `infer generate --tools`
        tool_choice: required                 # auto (default), none, required or a function's name
        sampler: {temperature: 0}
        expect:
          sha256: ...
          calls_sha256: ...                   # the parsed calls (written by --bless)
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import fnmatch
import hashlib
import io
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq
from ruamel.yaml.error import YAMLError

from infer.cli.serve.errors import APIError
from infer.cli.serve.tools import ToolChoice, read_tool_choice
from infer.cli.tool_use import ToolRequestError, load_tools, tool_choice_value
from infer.engine import SamplingParams, SamplingParamsError
from infer.profiles.schema import CpuKernels, SamplerSection

SCHEMA_VERSION = 1
GAP_DECIMALS = 6
"""Stored top-2 gaps are rounded to this many decimals (1e-6 nats), far below any useful tie margin."""


class GateFileError(Exception):
    """The anchors file cannot be read or is invalid; the message names the file, line and key path."""


def token_hash(token_ids: Sequence[int]) -> str:
    """sha256 hex digest of the token ids as ASCII decimal joined by "," (the fixed gate serialization)."""
    return hashlib.sha256(",".join(str(int(t)) for t in token_ids).encode("ascii")).hexdigest()


def canonical_calls(tool_calls: Sequence[Any]) -> list[dict[str, Any]]:
    """OpenAI `tool_calls` entries (`{"function": {"name", "arguments"}}`, ids dropped) as the calls
    hash reads them: `{"name", "arguments"}` with the arguments decoded from their JSON text (kept as
    the string when it is not JSON). ValueError for an entry without a function name."""
    out: list[dict[str, Any]] = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            raise ValueError(f"a tool call without a function name: {call!r}")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):  # not JSON: hashed as the text it is
                arguments = json.loads(arguments)
        out.append({"name": function["name"], "arguments": arguments})
    return out


def calls_hash(calls: Sequence[Mapping[str, Any]]) -> str:
    """sha256 hex digest of `canonical_calls` output (the fixed calls serialization, see above)."""
    text = json.dumps(list(calls), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Message(_Strict):
    """One chat message."""

    role: str = Field(min_length=1)
    content: str


FinishReasonName = Literal["stop", "length", "cancelled", "error"]


class Expectation(_Strict):
    """What an anchor must produce (written by `--bless`)."""

    sha256: str | None = Field(None, pattern=r"^[0-9a-f]{64}$", description="token_hash of the ids")
    tokens: int | None = Field(None, ge=0, description="number of generated tokens")
    finish_reason: FinishReasonName | None = None
    prompt_tokens: int | None = Field(None, ge=1, description="prompt length in tokens (tokenizer check)")
    counters: dict[str, int] = Field(default_factory=dict, description="mode counters, e.g. speculation")
    token_ids: list[int] | None = Field(None, description="the ids themselves (--keep-tokens)")
    top2_gaps: list[float | None] | None = Field(
        None, description="per step: log p(top1) - log p(top2) under the raw distribution (--keep-tokens)"
    )
    text_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="sha256 of the completion text in UTF-8 (written by --bless --server; compared when "
        "a server returns only text)",
    )
    calls_sha256: str | None = Field(
        None,
        pattern=r"^[0-9a-f]{64}$",
        description="calls_hash of the reply's parsed tool calls (anchors with `tools`)",
    )

    @model_validator(mode="after")
    def _gaps_match_ids(self) -> Expectation:
        gaps, ids = self.top2_gaps, self.token_ids
        if gaps is not None and ids is not None and len(gaps) != len(ids):
            raise ValueError(f"top2_gaps has {len(gaps)} entries but token_ids has {len(ids)}")
        return self


def _check_sampler_keys(value: dict[str, Any]) -> dict[str, Any]:
    """Sampler keys must be `sampler:` profile keys with the right types (ranges come later)."""
    SamplerSection.model_validate(value)
    return value


class Defaults(_Strict):
    """File-level defaults; every anchor may override each of them."""

    profile: str | None = None
    model: str | None = None
    cpu_kernels: CpuKernels | None = None
    """The cpu backend's matmul mode the anchors ran under (a file blessed on `exact` keeps its hashes
    whatever the product's default mode is)."""
    sampler: dict[str, Any] = Field(default_factory=dict)
    n_predict: int | None = Field(None, ge=1)

    @field_validator("sampler")
    @classmethod
    def _sampler_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_sampler_keys(value)


class Anchor(_Strict):
    """One pinned generation."""

    name: str = Field(min_length=1)
    prompt: str | None = None
    messages: list[Message] | None = None
    chat: bool = False
    """Wrap `prompt` as one user message and render it with the model's chat template."""
    parse_special: bool = True
    """Raw prompts: special-token text such as `<|im_start|>` becomes that token."""
    sampler: dict[str, Any] = Field(default_factory=dict)
    n_predict: int | None = Field(None, ge=1)
    stop: list[str] = Field(default_factory=list)
    ignore_eos: bool = False
    profile: str | None = None
    model: str | None = None
    cpu_kernels: CpuKernels | None = None
    json_schema: str | dict[str, Any] | None = None
    """Output constraints, as the flags of the same names (a schema may be written inline as a
    mapping; a file path is relative to the anchors file)."""
    json_object: bool = False
    regex: str | None = None
    grammar: str | None = None
    choice: list[str] = Field(default_factory=list)
    tools: str | list[Any] | None = None
    """Function tools (OpenAI's shape) offered to a chat anchor (`messages` or `chat: true`), as
    `infer generate --tools` offers them: a list written inline, or the path of a JSON file (a list,
    or an object with a `tools` list) relative to the anchors file."""
    tool_choice: str | None = None
    """With `tools`: auto (the default), none, required, or a function's name, as `--tool-choice`."""
    expect: Expectation | None = None

    def constraint_flags(self, base: Path) -> dict[str, Any]:
        """The anchor's output constraint as setting values (none when it has no constraint)."""
        flags: dict[str, Any] = {}
        if isinstance(self.json_schema, dict):
            flags["json_schema"] = json.dumps(self.json_schema)
        elif self.json_schema is not None:
            flags["json_schema"] = self._relative(self.json_schema, base)
        if self.json_object:
            flags["json_object"] = True
        if self.regex is not None:
            flags["regex"] = self.regex
        if self.grammar is not None:
            flags["grammar"] = self._relative(self.grammar, base)
        if self.choice:
            flags["choice"] = [json.dumps(self.choice)]  # one JSON array: a choice may hold a comma
        return flags

    @staticmethod
    def _relative(value: str, base: Path) -> str:
        candidate = base / value
        return str(candidate) if "\n" not in value and candidate.is_file() else value

    @field_validator("sampler")
    @classmethod
    def _sampler_keys(cls, value: dict[str, Any]) -> dict[str, Any]:
        return _check_sampler_keys(value)

    @field_validator("stop")
    @classmethod
    def _non_empty_stops(cls, value: list[str]) -> list[str]:
        if any(not s for s in value):
            raise ValueError("stop strings must not be empty")
        return value

    @model_validator(mode="after")
    def _one_prompt(self) -> Anchor:
        if (self.prompt is None) == (self.messages is None):
            raise ValueError("give exactly one of `prompt` or `messages`")
        if self.chat and self.messages is not None:
            raise ValueError("`chat: true` wraps `prompt`; with `messages` leave it out")
        return self


class AnchorsFile(_Strict):
    """A whole anchors file."""

    version: Literal[1] = SCHEMA_VERSION
    defaults: Defaults = Field(default_factory=Defaults)
    fingerprint: dict[str, Any] | None = None
    anchors: list[Anchor] = Field(min_length=1)


@dataclass(frozen=True)
class ResolvedAnchor:
    """An anchor with the file defaults applied; `index` is its position in the file."""

    index: int
    anchor: Anchor
    sampler: dict[str, Any]
    n_predict: int
    profile: str | None
    model: str | None
    tools: list[Any] | None = None
    """The anchor's tools as written (read from the file when `tools` names one)."""
    tool_choice: ToolChoice | None = None
    """The tools and `tool_choice`, checked (None for an anchor without tools)."""

    @property
    def name(self) -> str:
        """The anchor's name."""
        return self.anchor.name

    @property
    def greedy(self) -> bool:
        """Whether the anchor takes the argmax at every step (near-tie analysis applies)."""
        return float(self.sampler["temperature"]) <= 0.0

    def chat_messages(self) -> list[dict[str, Any]] | None:
        """The chat messages of a chat anchor (`messages`, or `chat: true` around the prompt); None
        for a raw one."""
        spec = self.anchor
        if spec.messages is not None:
            return [m.model_dump() for m in spec.messages]
        if spec.chat:
            return [{"role": "user", "content": spec.prompt or ""}]
        return None


@dataclass
class LoadedAnchors:
    """A parsed anchors file: the validated model, the round-trip document (for blessing), the path."""

    path: Path
    spec: AnchorsFile
    document: CommentedMap
    anchors: list[ResolvedAnchor]

    def select(self, patterns: Sequence[str]) -> list[ResolvedAnchor]:
        """Anchors whose name matches any pattern: a glob when it has `*?[`, else a substring."""
        if not patterns:
            return list(self.anchors)

        def matches(name: str, pattern: str) -> bool:
            if any(ch in pattern for ch in "*?["):
                return fnmatch.fnmatchcase(name, pattern)
            return pattern in name

        return [a for a in self.anchors if any(matches(a.name, p) for p in patterns)]


def _yaml() -> YAML:
    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)
    yaml.width = 4096  # never re-fold the user's long lines when writing back
    # ruamel writes None as an empty value by default; keep the `null` people wrote (and read).
    yaml.representer.add_representer(
        type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null")
    )
    return yaml


def _deepest_last(node: Any) -> tuple[Any, Any] | None:
    """(container, key) of the last entry at the deepest level (where ruamel keeps a trailing comment)."""
    found: tuple[Any, Any] | None = None
    while isinstance(node, CommentedMap) and len(node):
        key = list(node.keys())[-1]
        found = (node, key)
        node = node[key]
    return found


def _pop_trailing_comment(node: CommentedMap) -> Any:
    """Remove and return the comment that follows a mapping's last entry. ruamel attaches the comment
    lines *between* two list items to the end of the first one; new keys appended to that item would
    otherwise land below a comment that introduces the next anchor."""
    last = _deepest_last(node)
    return last[0].ca.items.pop(last[1], None) if last is not None else None


def _restore_trailing_comment(node: CommentedMap, comment: Any) -> None:
    """Put a comment taken by `_pop_trailing_comment` after the mapping's (new) last entry."""
    last = _deepest_last(node)
    if comment is None or last is None:
        return
    token = comment[2] if len(comment) > 2 and comment[2] is not None else comment[-1]
    last[0].ca.items[last[1]] = [None, None, token, None]


_KNOWN_KEYS = sorted(
    {
        *AnchorsFile.model_fields,
        *Defaults.model_fields,
        *Anchor.model_fields,
        *Expectation.model_fields,
        *Message.model_fields,
        *SamplerSection.model_fields,
    }
)


def _key_path(loc: Sequence[Any]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _line_of(document: Any, loc: Sequence[Any]) -> int | None:
    """1-based line of the deepest node on `loc` that exists in the ruamel document."""
    node = document
    line: int | None = None
    for part in loc:
        try:
            if isinstance(node, CommentedMap) and part in node:
                line = node.lc.key(part)[0] + 1
                node = node[part]
            elif isinstance(node, CommentedSeq) and isinstance(part, int) and 0 <= part < len(node):
                line = node.lc.item(part)[0] + 1
                node = node[part]
            else:
                break
        except (KeyError, IndexError, TypeError, AttributeError):
            break
    return line


def _fail(path: Path, document: Any, loc: Sequence[Any], message: str) -> GateFileError:
    line = _line_of(document, loc)
    where = f"{path}:{line}" if line else str(path)
    key = _key_path(loc)
    return GateFileError(f"{where}: {key}: {message}" if key else f"{where}: {message}")


def _describe(error: Mapping[str, Any]) -> str:
    kind = error.get("type")
    if kind == "extra_forbidden":
        key = str(error.get("loc", ("",))[-1])
        hint = difflib.get_close_matches(key, _KNOWN_KEYS, n=1)
        return f"unknown key {key!r}" + (f" (did you mean {hint[0]!r}?)" if hint else "")
    if kind == "missing":
        return "required key is missing"
    message = str(error.get("msg", "invalid"))
    message = message.removeprefix("Value error, ")
    if message.startswith("Input should be"):
        message = "must be" + message[len("Input should be") :]
    got = error.get("input")
    if kind not in ("model_type",) and not isinstance(got, (dict, list)):
        message += f" (got {got!r})"
    return message


def _sampler_error_loc(index: int, anchor: Anchor, parameter: str) -> tuple[Any, ...]:
    if parameter in anchor.sampler:
        return ("anchors", index, "sampler", parameter)
    return ("defaults", "sampler", parameter)


def _resolve(path: Path, document: Any, spec: AnchorsFile) -> list[ResolvedAnchor]:
    """Apply defaults, check names are unique, every sampler is valid and pinned (greedy or seeded)."""
    seen: dict[str, int] = {}
    out: list[ResolvedAnchor] = []
    for index, anchor in enumerate(spec.anchors):
        if anchor.name in seen:
            raise _fail(
                path,
                document,
                ("anchors", index, "name"),
                f"duplicate anchor name {anchor.name!r} (first at anchors[{seen[anchor.name]}])",
            )
        seen[anchor.name] = index
        sampler = {**spec.defaults.sampler, **anchor.sampler}
        try:
            params = SamplingParams(**sampler)
        except SamplingParamsError as exc:
            raise _fail(path, document, _sampler_error_loc(index, anchor, exc.parameter), str(exc)) from None
        except TypeError as exc:  # pragma: no cover - the key check above already rejects unknown keys
            raise _fail(path, document, ("anchors", index, "sampler"), str(exc)) from None
        if "temperature" not in sampler:
            raise _fail(
                path,
                document,
                ("anchors", index, "sampler", "temperature"),
                "required: pin it (0 for greedy, or > 0 together with a seed) so the anchor does not "
                "depend on the profile's sampler defaults",
            )
        if params.temperature > 0 and params.seed is None:
            raise _fail(
                path,
                document,
                ("anchors", index, "sampler", "seed"),
                f"a sampled anchor (temperature {params.temperature:g}) needs a seed to be reproducible",
            )
        n_predict = anchor.n_predict or spec.defaults.n_predict
        if n_predict is None:
            raise _fail(path, document, ("anchors", index, "n_predict"), "required (here or in defaults)")
        tools, choice = _read_tools(path, document, index, anchor)
        out.append(
            ResolvedAnchor(
                index=index,
                anchor=anchor,
                sampler=sampler,
                n_predict=n_predict,
                profile=anchor.profile if anchor.profile is not None else spec.defaults.profile,
                model=anchor.model if anchor.model is not None else spec.defaults.model,
                tools=tools,
                tool_choice=choice,
            )
        )
    return out


def _read_tools(
    path: Path, document: Any, index: int, anchor: Anchor
) -> tuple[list[Any] | None, ToolChoice | None]:
    """An anchor's `tools` (read from their file when named) and `tool_choice`, checked as
    `infer generate --tools` checks them; GateFileError naming the line otherwise."""
    where = ("anchors", index)
    if anchor.tools is None:
        if anchor.tool_choice is not None:
            raise _fail(path, document, (*where, "tool_choice"), "needs `tools`")
        return None, None
    if anchor.messages is None and not anchor.chat:
        raise _fail(
            path,
            document,
            (*where, "tools"),
            "tools need the chat template: give `messages`, or `chat: true` around the prompt",
        )
    tools = anchor.tools
    if isinstance(tools, str):
        try:
            tools = load_tools(path.parent / tools)
        except ToolRequestError as exc:
            raise _fail(path, document, (*where, "tools"), str(exc)) from None
    try:
        choice = read_tool_choice(tools, tool_choice_value(anchor.tool_choice), None, flat=False)
    except APIError as exc:
        key = "tool_choice" if exc.param == "tool_choice" else "tools"
        raise _fail(path, document, (*where, key), exc.message) from None
    if choice is None:
        raise _fail(path, document, (*where, "tools"), "the list of tools is empty")
    constrained = anchor.json_schema is not None or anchor.json_object or anchor.regex or anchor.grammar
    if choice.mode == "required" and (constrained or anchor.choice):
        raise _fail(
            path,
            document,
            (*where, "tool_choice"),
            "a required or named tool_choice generates under the call grammar: it cannot be "
            "combined with json_schema, json_object, regex, grammar or choice",
        )
    return tools, choice


def load_anchors(path: Path | str) -> LoadedAnchors:
    """Read and validate an anchors file. Raises `GateFileError` naming the file, line and key path."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise GateFileError(f"{path}: cannot read the anchors file ({exc.strerror or exc})") from None
    try:
        document = _yaml().load(text)
    except YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise GateFileError(f"{where}: not valid YAML ({problem})") from None
    if not isinstance(document, CommentedMap):
        raise GateFileError(f"{path}: an anchors file is a mapping with an `anchors:` list")
    try:
        spec = AnchorsFile.model_validate(_plain(document))
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = tuple(error.get("loc", ()))
        raise _fail(path, document, loc, _describe(error)) from None
    return LoadedAnchors(path, spec, document, _resolve(path, document, spec))


def _plain(node: Any) -> Any:
    """ruamel's round-trip containers as plain dicts and lists (pydantic then sees ordinary types)."""
    if isinstance(node, Mapping):
        return {key: _plain(value) for key, value in node.items()}
    if isinstance(node, list):
        return [_plain(item) for item in node]
    return node


# -- blessing ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Blessing:
    """Fresh expectations for one anchor."""

    sha256: str | None
    """None when only text came back from a server: the token fields are then left as they are."""
    tokens: int | None
    finish_reason: str
    prompt_tokens: int
    counters: Mapping[str, int] | None
    """None leaves stored counters as they are (a server reports none)."""
    token_ids: Sequence[int]
    top2_gaps: Sequence[float | None]
    text_sha256: str | None = None
    """Written when given (`--bless --server`), or refreshed when the anchor already stores one."""
    calls_sha256: str | None = None
    """The parsed tool calls' hash (anchors with `tools`; None leaves a stored one as it is)."""


def _flow(items: Sequence[Any]) -> CommentedSeq:
    seq = CommentedSeq(items)
    seq.fa.set_flow_style()
    return seq


def _short(digest: Any) -> str:
    return f"{digest[:12]}…" if isinstance(digest, str) else str(digest)


def bless_document(
    loaded: LoadedAnchors,
    blessings: Mapping[int, Blessing],
    *,
    keep_tokens: bool,
    fingerprint: Mapping[str, Any] | None,
) -> list[tuple[str, list[str]]]:
    """Write fresh expectations into the round-trip document in place; return (anchor, changes) pairs.

    Token ids (and top-2 gaps) are written with `keep_tokens`, and also refreshed where an anchor already
    stores them, so stored ids never go stale. Comments, key order and untouched values are preserved.
    """
    document = loaded.document
    report: list[tuple[str, list[str]]] = []
    anchors_node = document["anchors"]
    for index, fresh in sorted(blessings.items()):
        node = anchors_node[index]
        trailing = _pop_trailing_comment(node)
        old = node.get("expect")
        if not isinstance(old, CommentedMap):
            old = CommentedMap()
            node["expect"] = old
        before = copy.deepcopy(_plain(old))
        changes: list[str] = []
        values: dict[str, Any] = {
            "sha256": fresh.sha256,
            "tokens": fresh.tokens,
            "finish_reason": fresh.finish_reason,
            "prompt_tokens": fresh.prompt_tokens,
        }
        if fresh.sha256 is None:  # text only (a server without ids): keep the token fields
            values = {"finish_reason": fresh.finish_reason, "prompt_tokens": fresh.prompt_tokens}
        if fresh.text_sha256 is not None:
            values["text_sha256"] = fresh.text_sha256
        if fresh.calls_sha256 is not None:
            values["calls_sha256"] = fresh.calls_sha256
        for key, value in values.items():
            if before.get(key) != value:
                changes.append(
                    f"{key} {_short(before.get(key)) if key in before else '(none)'} -> {_short(value)}"
                )
            old[key] = value
        if fresh.counters is not None and (fresh.counters or "counters" in old):
            if before.get("counters", {}) != dict(fresh.counters):
                changes.append(f"counters {before.get('counters', {})} -> {dict(fresh.counters)}")
            old["counters"] = CommentedMap(fresh.counters)
        if fresh.sha256 is not None and (keep_tokens or "token_ids" in old):
            ids = [int(t) for t in fresh.token_ids]
            gaps = [None if g is None else round(float(g), GAP_DECIMALS) for g in fresh.top2_gaps]
            if before.get("token_ids") != ids:
                changes.append("token_ids stored" if "token_ids" not in before else "token_ids updated")
            old["token_ids"] = _flow(ids)
            old["top2_gaps"] = _flow(gaps)
        _restore_trailing_comment(node, trailing)
        report.append((node["name"], changes))
    if fingerprint is not None:
        fp = _to_commented(fingerprint)
        if "fingerprint" in document:
            document["fingerprint"] = fp
        else:  # keep `anchors:` last: it is the long part a reader scrolls through
            keys = list(document.keys())
            position = keys.index("anchors") if "anchors" in keys else len(keys)
            document.insert(position, "fingerprint", fp, comment="environment of the last --bless")
    return report


def _to_commented(value: Any) -> Any:
    if isinstance(value, Mapping):
        out = CommentedMap()
        for key, item in value.items():
            out[key] = _to_commented(item)
        return out
    if isinstance(value, list):
        if all(not isinstance(item, (Mapping, list)) for item in value):
            return _flow(list(value))
        return CommentedSeq([_to_commented(item) for item in value])
    return value


def dump_document(document: CommentedMap) -> str:
    """The round-trip document as YAML text (comments and order preserved)."""
    buffer = io.StringIO()
    _yaml().dump(document, buffer)
    return buffer.getvalue()


def write_document(path: Path, document: CommentedMap) -> None:
    """Write the document back atomically (a crash never leaves half an anchors file)."""
    text = dump_document(document)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


__all__ = [
    "Anchor",
    "AnchorsFile",
    "Blessing",
    "Defaults",
    "Expectation",
    "GateFileError",
    "LoadedAnchors",
    "ResolvedAnchor",
    "bless_document",
    "calls_hash",
    "canonical_calls",
    "dump_document",
    "load_anchors",
    "token_hash",
    "write_document",
]
