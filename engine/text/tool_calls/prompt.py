"""The generic tool prompt: how tools reach a model whose chat template cannot render them.

Such a template (SmolLM2's, plain ChatML, ...) drops `tools`, writes an assistant turn's
`tool_calls` nowhere and may refuse the `tool` role. So the conversation is rewritten before it is
rendered: the tools and the call format go into the system message (appended to the request's own,
or as a new first message), a past call becomes `<tool_call>` blocks in its assistant turn's text,
and a tool result becomes a user turn holding `<tool_response>` blocks. The format is Hermes' (as
Qwen 2.5 describes it), so replies are read with the hermes parser.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

GENERIC_TOOL_SYNTAX = "hermes"
"""The parser for replies to the generic tool prompt."""

_INTRO = (
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "The available functions are described in JSON Schema within <tools></tools> XML tags:\n<tools>\n"
)
_FORMAT = (
    "\n</tools>\n\nTo call a function, reply with a JSON object holding its name and arguments "
    'within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call>'
)


def tool_system_text(tools: list[dict[str, Any]]) -> str:
    """The system-message text that describes `tools` (OpenAI `{"type": "function", ...}` dicts)."""
    return _INTRO + "\n".join(json.dumps(tool, ensure_ascii=False) for tool in tools) + _FORMAT


def _text(content: Any) -> str:
    """A message's content as one string (text parts joined with newlines, as the renderer joins them)."""
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return content if isinstance(content, str) else ""


def _call_block(call: dict[str, Any]) -> str:
    function = call.get("function", call)
    arguments = function.get("arguments", {})
    if isinstance(arguments, str):
        with contextlib.suppress(ValueError):  # not JSON: written as the string it is
            arguments = json.loads(arguments)
    body = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
    return f"<tool_call>\n{body}\n</tool_call>"


def with_generic_tool_prompt(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """`messages` rewritten for a template that cannot render tools (see the module docstring)."""
    out: list[dict[str, Any]] = []
    rest = messages
    if tools:  # no tools (tool_choice none): only the past calls and results are rewritten
        system = tool_system_text(tools)
        if messages and messages[0].get("role") in ("system", "developer"):
            content = _text(messages[0].get("content"))
            out.append({"role": "system", "content": f"{content}\n\n{system}" if content else system})
            rest = messages[1:]
        else:
            out.append({"role": "system", "content": system})
    for message in rest:
        role = message.get("role")
        if role == "assistant" and message.get("tool_calls"):
            text = _text(message.get("content"))
            blocks = "\n".join(_call_block(c) for c in message["tool_calls"] if isinstance(c, dict))
            out.append({"role": "assistant", "content": f"{text}\n{blocks}" if text else blocks})
        elif role == "tool":
            response = f"<tool_response>\n{_text(message.get('content'))}\n</tool_response>"
            if out and out[-1].get("role") == "user" and out[-1].get("_tool_results"):
                out[-1] = {**out[-1], "content": out[-1]["content"] + "\n" + response}
            else:
                out.append({"role": "user", "content": response, "_tool_results": True})
        else:
            out.append({k: v for k, v in message.items() if k != "tool_calls"})
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]
