"""`infer generate --tools FILE.json [--tool-choice ...]`: a chat request with function tools, and its
reply as content and calls.

The same plan as the server's (cli/serve/tools.py): the template renders the tools, or the generic
tool prompt stands in; `required` or a named function generates under the call grammar and `auto`
under the lazy one; the reply is split by the syntax's parser. Bad input is one line, exit 2.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from infer.cli.options import fail
from infer.cli.serve.errors import APIError
from infer.cli.serve.tools import (
    ReplySplitter,
    ToolChoice,
    ToolPlan,
    finish_reason,
    plan_tools,
    read_tool_choice,
)
from infer.engine import (
    ChatTemplateError,
    DoneEvent,
    Engine,
    Request,
    chat_template_of,
    prompt_ids,
    syntax_for_template,
    template_renders_tools,
)
from infer.profiles.constraints import grammar_from_settings
from infer.profiles.requests import build_request
from infer.profiles.settings import Settings


class ToolRequestError(ValueError):
    """A tools file or a chat with tools that cannot be used; the message is one line."""


def load_tools(path: Path) -> list[Any]:
    """The tools of `path`: a JSON list of OpenAI function tools, or an object with a `tools` list
    (ToolRequestError naming the file otherwise)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ToolRequestError(f"{path}: cannot read the tools ({exc})") from None
    if isinstance(data, dict) and isinstance(data.get("tools"), list):
        data = data["tools"]
    if not isinstance(data, list) or not data:
        raise ToolRequestError(
            f'{path}: expected a JSON list of tools ({{"type": "function", "function": {{...}}}})'
        )
    return data


def read_tools(path: Path) -> list[Any]:
    """`load_tools` for `--tools` (exit 2 on bad input)."""
    try:
        return load_tools(path)
    except ToolRequestError as exc:
        fail(str(exc))


def tool_choice_value(tool_choice: str | None) -> str | dict[str, Any] | None:
    """`--tool-choice` (none, auto, required, or a function's name) as the API's `tool_choice`."""
    if tool_choice is None or tool_choice in ("none", "auto", "required"):
        return tool_choice
    return {"type": "function", "function": {"name": tool_choice}}


def read_choice(tools: list[Any], tool_choice: str | None) -> ToolChoice:
    """The tools and `--tool-choice`, checked before any model loads (exit 2 on bad input)."""
    try:
        choice = read_tool_choice(tools, tool_choice_value(tool_choice), None, flat=False, param="--tools")
    except APIError as exc:
        fail(exc.message)
    if choice is None:
        fail("--tool-choice needs --tools")
    return choice


def tool_request(
    engine: Engine,
    settings: Settings,
    messages: list[dict[str, Any]],
    *,
    choice: ToolChoice,
    stop: list[str] | None = None,
    ignore_eos: bool = False,
) -> tuple[Request, ToolPlan]:
    """The request for a chat with tools, and how its reply is read (exit 2 on bad input)."""
    try:
        return build_tool_request(engine, settings, messages, choice=choice, stop=stop, ignore_eos=ignore_eos)
    except ToolRequestError as exc:
        fail(str(exc))


def build_tool_request(
    engine: Engine,
    settings: Settings,
    messages: list[dict[str, Any]],
    *,
    choice: ToolChoice,
    stop: Sequence[str] | None = None,
    ignore_eos: bool = False,
    max_tokens: int | None = None,
    seed: int | None = None,
) -> tuple[Request, ToolPlan]:
    """`tool_request` for callers that report errors themselves (`infer gate`, `infer bench`): the
    same prompt, grammar and request (`max_tokens` and `seed` as `build_request` takes them),
    ToolRequestError on bad input."""
    tokenizer = engine.tokenizer
    try:
        template = chat_template_of(tokenizer)
        plan = plan_tools(
            choice,
            parser=None,
            template_syntax=syntax_for_template(template),
            renders_tools=template_renders_tools(tokenizer),
        )
        assert plan is not None
        ids = prompt_ids(tokenizer, messages=plan.messages(messages), tools=plan.template_tools())
        own = grammar_from_settings(settings)
        grammar = plan.grammar(exclusive=own is None)
        if grammar is not None and own is not None:
            raise ToolRequestError(
                "tool_choice required or a function name cannot be combined with another output constraint"
            )
        request = build_request(
            ids,
            settings,
            stop=stop or (),
            ignore_eos=ignore_eos,
            max_tokens=max_tokens,
            seed=seed,
            **({"grammar": grammar} if grammar is not None else {}),
        )
        shown = plan.shown_special_ids(tokenizer)
        if shown:
            request = dataclasses.replace(request, shown_special_ids=shown)
        engine.validate(request)
    except APIError as exc:
        raise ToolRequestError(exc.message) from None
    except ToolRequestError:
        raise
    except (ChatTemplateError, ValueError) as exc:
        raise ToolRequestError(str(exc)) from None
    return request, plan


@dataclasses.dataclass(frozen=True)
class ToolReply:
    """A finished reply read for calls."""

    content: str | None
    calls: list[dict[str, Any]]
    finish_reason: str

    def text(self) -> str:
        """What `generate` prints: the content, then one line per call, `name(arguments)`."""
        lines = [self.content] if self.content else []
        lines += [f"{c['function']['name']}({c['function']['arguments']})" for c in self.calls]
        return "\n".join(lines)


def read_reply(plan: ToolPlan, done: DoneEvent) -> ToolReply:
    """`done`'s text as content and calls (no calls with `tool_choice: none`)."""
    if not plan.parses:
        return ToolReply(done.text, [], done.finish_reason)
    splitter = ReplySplitter(plan.syntax)
    splitter.feed(done.text)
    splitter.finish()
    return ToolReply(
        splitter.text, [call.openai() for call in splitter.calls], finish_reason(done.finish_reason, splitter)
    )
