"""Chat templates: render a model's Jinja2 chat template the way Hugging Face transformers does.

Templates come from model files, so they run in Jinja2's immutable sandbox. The environment mirrors
transformers' `apply_chat_template` (trim_blocks, lstrip_blocks, loop controls, `raise_exception`,
a `tojson` that keeps non-ASCII text, `strftime_now`) so templates written for it render identically.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from typing import Any, NoReturn

import jinja2
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["CHATML_TEMPLATE", "VALID_ROLES", "ChatTemplateError", "render_chat"]

VALID_ROLES = frozenset({"system", "user", "assistant", "tool", "developer"})

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
"""ChatML, used when a model ships no chat template."""


class ChatTemplateError(Exception):
    """The chat template does not parse or fails to render, or the messages are malformed."""


def _raise_exception(message: str) -> NoReturn:
    # Templates call this to reject conversations they cannot express (e.g. roles out of order).
    raise ChatTemplateError(f"chat template rejected the messages: {message}")


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:  # fmt: skip
    # Same signature and defaults as transformers' filter; Jinja's own tojson escapes HTML characters.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


@lru_cache(maxsize=1)
def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


@lru_cache(maxsize=16)
def _compile(template: str) -> jinja2.Template:
    # Compiling is the slow part, and a server renders the same few templates for every request.
    try:
        return _environment().from_string(template)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not parse (line {exc.lineno}): {exc.message}") from exc


def _normalize_messages(messages: Any) -> list[dict[str, Any]]:
    """Checked copies of the messages, with content-part lists joined into one string."""
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
        normalized.append({**message, "content": content})
    return normalized


def render_chat(
    template: str,
    messages: list[dict[str, Any]],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """Render `messages` with a Jinja2 chat `template` into the prompt text.

    add_generation_prompt: end with the header of an assistant turn, so the model answers.
    bos_token/eos_token: the model's token texts, for templates that spell them out.
    extra: further template variables (tools, documents, enable_thinking, ...).
    Raises ChatTemplateError for malformed messages (naming the message index) or a failing template.
    """
    checked = _normalize_messages(messages)
    compiled = _compile(template)
    try:
        return compiled.render(
            messages=checked,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            **extra,
        )
    except ChatTemplateError:
        raise
    except jinja2.TemplateError as exc:  # undefined variables, sandbox violations
        raise ChatTemplateError(f"chat template failed to render: {exc}") from exc
    except (TypeError, ValueError, KeyError, AttributeError, IndexError) as exc:
        raise ChatTemplateError(f"chat template failed to render: {type(exc).__name__}: {exc}") from exc
