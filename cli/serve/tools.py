"""OpenAI tool calling on the server: `tools`, `tool_choice` and `parallel_tool_calls` read and
checked, the conversation's calls and results handed to the chat template, the constraint a
forced call generates under, and the model's text split into content and `tool_calls`.

The engine sees only messages, a constraint and tokens (engine/text/tool_calls/ reads the text,
engine/grammar/tools.py builds the grammar); this module is the OpenAI mapping, shared by chat
completions and responses.

- A template that renders `tools` gets them as transformers hands them (`[{"type": "function",
  "function": {...}}]`), and the assistant turns' `tool_calls` with `arguments` decoded to objects,
  as vLLM and llama.cpp pass them (templates write `arguments | tojson`).
- A template that cannot render tools (the default SmolLM2's) gets the generic tool prompt instead
  (`with_generic_tool_prompt`), and replies are read with the hermes parser.
- `required` and a named function generate under the call grammar (only calls, each valid against
  its schema); `auto` under the syntax's lazy grammar (free text, and any call constrained from its
  opening marker on); `none` neither, and nothing is parsed. With a thinking template the grammar
  leaves the reasoning block free and applies after it (cli/serve/reasoning.py reads the block).
"""

from __future__ import annotations

import json
import re
import secrets
import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from infer.cli.serve.errors import APIError
from infer.engine import (
    GENERIC_TOOL_SYNTAX,
    CallStreamParser,
    CallSyntax,
    FunctionSchema,
    GrammarError,
    GrammarSpec,
    TextPiece,
    ThinkingStart,
    Tokenizer,
    ToolCall,
    syntax_named,
    tool_call_grammar,
    with_generic_tool_prompt,
)

INVALID_GRAMMAR = "invalid_grammar"
_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")
"""OpenAI's rule for a function name."""

Mode = Literal["none", "auto", "required"]


@dataclass(frozen=True)
class FunctionTool:
    """One function the model may call."""

    name: str
    parameters: dict[str, Any]
    description: str | None = None

    def template_form(self) -> dict[str, Any]:
        """The tool as chat templates read it (OpenAI's chat shape)."""
        function: dict[str, Any] = {"name": self.name}
        if self.description is not None:
            function["description"] = self.description
        function["parameters"] = self.parameters
        return {"type": "function", "function": function}


@dataclass(frozen=True)
class ToolChoice:
    """What a request asks of tools: which, whether the model must call one (or a named one), and
    whether it may call several."""

    tools: tuple[FunctionTool, ...]
    mode: Mode
    forced: str | None = None
    """The function a named `tool_choice` forces (mode is then required)."""
    parallel: bool = True

    @property
    def callable(self) -> tuple[FunctionTool, ...]:
        """The functions a call may name."""
        return tuple(t for t in self.tools if self.forced is None or t.name == self.forced)

    def echo(self) -> str | dict[str, Any]:
        """`tool_choice` as a response object echoes it."""
        if self.forced is not None:
            return {"type": "function", "name": self.forced}
        return self.mode


def _function_tool(raw: Any, index: int, flat: bool, param: str) -> FunctionTool:
    where = f"{param}.{index}"
    if not isinstance(raw, dict) or raw.get("type", "function") != "function":
        kind = raw.get("type") if isinstance(raw, dict) else type(raw).__name__
        raise APIError(f"{where}: only function tools are supported (got {kind!r})", param=f"{where}.type")
    body = raw if flat else raw.get("function")
    inner = where if flat else f"{where}.function"
    if not isinstance(body, dict):
        raise APIError(f"{inner} must be an object with the function's name and parameters", param=inner)
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise APIError(
            f"{inner}.name must be 1-64 letters, digits, '_', '.' or '-' (got {name!r})",
            param=f"{inner}.name",
        )
    parameters = body.get("parameters")
    if parameters is None:
        parameters = {"type": "object", "properties": {}}
    if not isinstance(parameters, dict):
        raise APIError(f"{inner}.parameters must be a JSON schema object", param=f"{inner}.parameters")
    description = body.get("description")
    if description is not None and not isinstance(description, str):
        raise APIError(f"{inner}.description must be a string", param=f"{inner}.description")
    return FunctionTool(name, parameters, description)


def read_tool_choice(
    tools: Sequence[Any] | None,
    tool_choice: Any,
    parallel_tool_calls: bool | None,
    *,
    flat: bool,
    param: str = "tools",
) -> ToolChoice | None:
    """The request's tools and choice (None when it has no tools and asks nothing of them).
    `flat`: the Responses shape (`{"type": "function", "name": ...}`) rather than chat's
    (`{"type": "function", "function": {"name": ...}}`). APIError 400 naming the bad field."""
    functions = tuple(_function_tool(t, i, flat, param) for i, t in enumerate(tools or ()))
    names = [f.name for f in functions]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise APIError(f"{param}: the function name {duplicate!r} is given twice", param=param)
    mode: Mode
    forced = None
    if tool_choice is None:
        mode = "auto"
    elif tool_choice in ("none", "auto", "required"):
        mode = tool_choice
    elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function":
        function = tool_choice.get("function")
        nested = function.get("name") if isinstance(function, dict) else None
        # Responses names the function at the top; the chat shape is accepted there too.
        named = (tool_choice.get("name") or nested) if flat else nested
        if not isinstance(named, str):
            raise APIError("tool_choice names no function", param="tool_choice")
        if named not in names:
            raise APIError(f"tool_choice names {named!r}, which is not among the tools", param="tool_choice")
        mode, forced = "required", named
    else:
        raise APIError(
            f"tool_choice must be none, auto, required or a function, got {tool_choice!r}",
            param="tool_choice",
        )
    if not functions:
        if mode == "required":
            raise APIError("tool_choice requires a call but no tools are given", param="tool_choice")
        return None
    return ToolChoice(functions, mode, forced, True if parallel_tool_calls is None else parallel_tool_calls)


# -- the conversation ------------------------------------------------------------------------------
def _decoded_arguments(call: Any, where: str) -> dict[str, Any]:
    """A past call with `arguments` as a JSON object (templates write `arguments | tojson`)."""
    if not isinstance(call, dict):
        raise APIError(f"{where} must be an object", param=where)
    function = call.get("function")
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise APIError(f"{where}.function must be an object with a name", param=f"{where}.function")
    arguments = function.get("arguments")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            decoded = arguments  # not JSON: handed over as the text it is
        arguments = decoded
    return {**call, "type": call.get("type", "function"), "function": {**function, "arguments": arguments}}


def template_messages(messages: list[dict[str, Any]], param: str = "messages") -> list[dict[str, Any]]:
    """The messages with their past calls' arguments decoded (see `_decoded_arguments`)."""
    out = []
    for index, message in enumerate(messages):
        calls = message.get("tool_calls")
        if calls is not None:
            if not isinstance(calls, list):
                raise APIError(
                    f"{param}.{index}.tool_calls must be a list", param=f"{param}.{index}.tool_calls"
                )
            message = {
                **message,
                "tool_calls": [
                    _decoded_arguments(c, f"{param}.{index}.tool_calls.{i}") for i, c in enumerate(calls)
                ],
            }
        out.append(message)
    return out


def tools_free(messages: list[dict[str, Any]], param: str = "messages") -> list[dict[str, Any]]:
    """A conversation for a request without tools: past calls' arguments decoded all the same."""
    return template_messages(messages, param)


@dataclass(frozen=True)
class ToolPlan:
    """How one request's tools are served: the parser, and whether the generic prompt stands in for
    a template that cannot render tools."""

    choice: ToolChoice
    syntax: CallSyntax
    generic_prompt: bool

    def messages(self, messages: list[dict[str, Any]], param: str = "messages") -> list[dict[str, Any]]:
        """The conversation as the template gets it."""
        checked = template_messages(messages, param)
        if self.generic_prompt:
            tools = [t.template_form() for t in self.choice.tools] if self.choice.mode != "none" else []
            return with_generic_tool_prompt(checked, tools) if tools else _without_tool_turns(checked)
        return checked

    def template_tools(self) -> list[dict[str, Any]] | None:
        """The `tools` template variable (None for the generic prompt, which writes them itself)."""
        return None if self.generic_prompt else [t.template_form() for t in self.choice.tools]

    def shown_special_ids(self, tokenizer: Tokenizer) -> tuple[int, ...]:
        """The syntax's markers that are control tokens in `tokenizer` (rendered as text for the
        parser, though control tokens render none by default)."""
        if not self.parses:
            return ()
        ids = (tokenizer.token_id(text) for text in self.syntax.marker_texts)
        return tuple(sorted({i for i in ids if i is not None and i in tokenizer.control_ids}))

    @property
    def parses(self) -> bool:
        """Whether replies are read for calls (not with `tool_choice: none`)."""
        return self.choice.mode != "none"

    def grammar(self, *, exclusive: bool, thinking: ThinkingStart | None = None) -> GrammarSpec | None:
        """The constraint the request generates under: the call grammar for required and named, the
        lazy one for auto (None when the syntax has none, or when `exclusive` is False: another
        output constraint was asked for, and an auto choice leaves the output to it). `thinking`:
        replies start with (or may start with) a reasoning block, which the grammar leaves free and
        applies after. A schema llguidance refuses is APIError 400 invalid_grammar."""
        choice = self.choice
        if choice.mode == "none" or (choice.mode == "auto" and not exclusive):
            return None
        functions = [FunctionSchema(t.name, t.parameters) for t in choice.callable]
        try:
            return tool_call_grammar(
                self.syntax, functions, mode=choice.mode, parallel=choice.parallel, thinking=thinking
            )
        except GrammarError as exc:
            raise APIError(f"tools: {exc}", param="tools", code=INVALID_GRAMMAR) from None


def _without_tool_turns(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`tool_choice: none` on a template without tools: past calls and results go in as the
    generic prompt writes them, with no tool list."""
    return with_generic_tool_prompt(messages, [])


def plan_tools(
    choice: ToolChoice | None, *, parser: str | None, template_syntax: CallSyntax, renders_tools: bool
) -> ToolPlan | None:
    """The plan for `choice` on this server: `parser` (`--tool-call-parser`) or the template's
    syntax; the generic prompt (and its hermes parser, unless `parser` says otherwise) when the
    template does not render tools."""
    if choice is None:
        return None
    if renders_tools:
        syntax = syntax_named(parser) if parser else template_syntax
    else:
        syntax = syntax_named(parser or GENERIC_TOOL_SYNTAX)
    return ToolPlan(choice, syntax, generic_prompt=not renders_tools)


# -- the reply -----------------------------------------------------------------------------------
def new_call_id(syntax: CallSyntax) -> str:
    """A call id: `call_` + 24 hex digits, or 9 alphanumerics for Mistral (its templates refuse others)."""
    if syntax.name == "mistral":
        alphabet = string.ascii_letters + string.digits
        return "".join(secrets.choice(alphabet) for _ in range(9))
    return f"call_{secrets.token_hex(12)}"


@dataclass(frozen=True)
class ContentDelta:
    """Text for the reply's content."""

    text: str


@dataclass(frozen=True)
class CallDelta:
    """A complete call, the `index`-th of the reply."""

    index: int
    id: str
    call: ToolCall

    def openai(self) -> dict[str, Any]:
        """The `tool_calls` entry of a chat message."""
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.call.name, "arguments": self.call.arguments},
        }


ReplyDelta = ContentDelta | CallDelta


@dataclass
class ReplySplitter:
    """One choice's text split into content and calls as it streams; the whole reply is the same
    splitter fed everything at once, so streamed and whole replies agree by construction.

    Trailing whitespace of the content is held until text follows it, and dropped when a call
    follows or the reply ends after a call (the newlines models put around calls are not content),
    so the split is the same for any cut of the text.
    """

    syntax: CallSyntax
    make_id: Callable[[CallSyntax], str] = new_call_id
    calls: list[CallDelta] = field(default_factory=list)
    content: list[str] = field(default_factory=list)
    _parser: CallStreamParser = field(init=False)
    _held: str = ""

    def __post_init__(self) -> None:
        self._parser = CallStreamParser(self.syntax)

    def feed(self, text: str) -> list[ReplyDelta]:
        """The deltas `text` settles."""
        return self._deltas(self._parser.feed(text))

    def finish(self) -> list[ReplyDelta]:
        """The deltas of whatever was held."""
        deltas = self._deltas(self._parser.finish())
        if self._held and not self.calls:
            deltas.append(self._content(self._held))
        self._held = ""
        return deltas

    def _content(self, text: str) -> ContentDelta:
        self.content.append(text)
        return ContentDelta(text)

    def _deltas(self, events: Sequence[TextPiece | ToolCall]) -> list[ReplyDelta]:
        out: list[ReplyDelta] = []
        for event in events:
            if isinstance(event, TextPiece):
                text = self._held + event.text
                kept = text.rstrip()
                self._held = text[len(kept) :]  # trailing whitespace waits for what follows it
                if kept:
                    out.append(self._content(kept))
            else:
                self._held = ""
                given = event.id if self.syntax.name != "mistral" or _mistral_id(event.id) else None
                delta = CallDelta(len(self.calls), given or self.make_id(self.syntax), event)
                self.calls.append(delta)
                out.append(delta)
        return out

    @property
    def text(self) -> str | None:
        """The content so far (None when there is none)."""
        joined = "".join(self.content)
        return joined or None


def _mistral_id(value: str | None) -> bool:
    return value is not None and len(value) == 9 and value.isalnum()


def finish_reason(reason: str, splitter: ReplySplitter | None) -> str:
    """OpenAI's `tool_calls` for a reply that ended (stopped) after calls."""
    if splitter is not None and splitter.calls and reason == "stop":
        return "tool_calls"
    return reason
