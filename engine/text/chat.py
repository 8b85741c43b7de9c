"""Chat templates: render a model's Jinja2 chat template the way Hugging Face transformers does.

Templates come from model files and are hostile input, so they render in a worker process
(:mod:`infer.engine.text.sandbox`) with a wall-clock, memory, output and recursion limit, inside
Jinja2's immutable sandbox. The environment mirrors transformers' `apply_chat_template`
(trim_blocks, lstrip_blocks, loop controls, the `{% generation %}` tag, `raise_exception`, a `tojson`
that keeps non-ASCII text, `strftime_now`, `dict`, `namespace`), and so do the variables: `tools` and
`documents` are always defined (None when not given), message keys whose value is None are dropped,
and a message's reasoning is aliased under `reasoning_content` and `thinking`. So templates written for
transformers render identically: every template llama.cpp ships does, byte for byte
(tests/test_chat_templates_transformers.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from infer.engine.text.sandbox import TemplateSandbox, TemplateSandboxError, default_sandbox

__all__ = ["CHATML_TEMPLATE", "INVALID_CHAT_TEMPLATE", "VALID_ROLES", "ChatTemplateError", "render_chat"]

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, used when a model ships no chat template."""

INVALID_CHAT_TEMPLATE = "invalid_chat_template"
"""`ChatTemplateError.code` of a failure in the template itself (not in the messages)."""


class ChatTemplateError(Exception):
    """The chat template does not parse or fails to render, or the messages are malformed.

    ``code`` is :data:`INVALID_CHAT_TEMPLATE` when the template failed (a syntax error, a limit,
    ``raise_exception``), None when the messages were malformed before rendering.
    """

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
"""Names a message's reasoning comes under; templates read the first (gpt-oss's the second)."""


def _as_transformers_passes(message: dict[str, Any]) -> dict[str, Any]:
    """The message as transformers hands it to a template: keys whose value is None dropped (many
    templates test `is defined`, then fail on None), and the reasoning under both names templates read."""
    message = {key: value for key, value in message.items() if value is not None}
    reasoning = next((message[key] for key in _REASONING_FIELDS if message.get(key) is not None), None)
    if reasoning is not None:
        # The same key order as transformers' `_alias_reasoning_fields`, for templates that iterate keys.
        message = {"thinking": reasoning, **message, "reasoning_content": reasoning}
    return message


def _normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Checked copies of the messages, with content-part lists joined into one string, in the form
    transformers passes them (see :func:`_as_transformers_passes`)."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    normalized = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"message {index} must be an object, got {type(message).__name__}")
        role = message.get("role")
        if role not in VALID_ROLES:
            raise ChatTemplateError(
                f"message {index} has role {role!r}; expected one of {sorted(VALID_ROLES)}"
            )
        content = message.get("content")
        if isinstance(content, list):
            texts = []
            for part_index, part in enumerate(content):
                if not (
                    isinstance(part, dict)
                    and part.get("type") == "text"
                    and isinstance(part.get("text"), str)
                ):
                    raise ChatTemplateError(
                        f"message {index} content part {part_index} must be {{'type': 'text', 'text': str}}"
                    )
                texts.append(part["text"])
            # Parts are joined with newlines, as vLLM does for templates that expect a plain string.
            content = "\n".join(texts)
        elif content is None and role == "assistant" and message.get("tool_calls"):
            content = ""  # an assistant turn that only calls tools has no text
        elif not isinstance(content, str):
            raise ChatTemplateError(
                f"message {index} content must be a string or a list of text parts, "
                f"got {type(content).__name__}"
            )
        normalized.append(_as_transformers_passes({**message, "content": content}))
    return normalized


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    sandbox: TemplateSandbox | None = None,
    now: datetime | None = None,
    **extra: Any,
) -> str:
    """Render `messages` with a Jinja2 chat `template` into the prompt text.

    add_generation_prompt: end with the header of an assistant turn, so the model answers.
    bos_token/eos_token: the model's token texts, for templates that spell them out.
    sandbox: the worker to render in (default: the process's shared one).
    now: the time `strftime_now` reads (default: the clock), for a reproducible prompt.
    extra: further template variables (tools as a list of JSON-schema function dicts, documents,
    enable_thinking, ...), as JSON data; `tools` and `documents` are None unless given, as in
    transformers.
    Raises ChatTemplateError for malformed messages (naming the message index) or a failing template
    (one line, `code` INVALID_CHAT_TEMPLATE).
    """
    checked = _normalize_messages(messages)
    context = {
        "messages": checked,
        "tools": None,
        "documents": None,
        "add_generation_prompt": add_generation_prompt,
        "bos_token": bos_token,
        "eos_token": eos_token,
        **extra,
    }
    try:
        return (sandbox or default_sandbox()).render(template, context, now=now)
    except TemplateSandboxError as exc:
        raise ChatTemplateError(str(exc), INVALID_CHAT_TEMPLATE) from None
