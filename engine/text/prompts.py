"""Prompt text or chat messages -> prompt token ids."""

from __future__ import annotations

from typing import Any

from infer.engine.text.chat import CHATML_TEMPLATE, ChatTemplateError, render_chat
from infer.engine.text.sandbox import TemplateSandbox
from infer.engine.text.tokenizer import Tokenizer

_CHATML_TOKENS = ("<|im_start|>", "<|im_end|>")


def chat_template_of(tokenizer: Tokenizer) -> str:
    """The model's own chat template, or ChatML when it ships none but its vocabulary has ChatML's
    tokens; ChatTemplateError otherwise (ChatML spelled in plain text would only confuse the model)."""
    if tokenizer.chat_template:
        return tokenizer.chat_template
    if all(tokenizer.token_id(text) is not None for text in _CHATML_TOKENS):
        return CHATML_TEMPLATE
    raise ChatTemplateError(
        "this model ships no chat template (and its vocabulary has no ChatML tokens); "
        "send a raw prompt instead (--raw; /v1/completions on the server)"
    )


def render_messages(
    tokenizer: Tokenizer,
    messages: list[dict[str, Any]],
    sandbox: TemplateSandbox | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> str:
    """Render chat messages with the model's template, generation prompt on (in `sandbox`, or the
    process's shared one); `tools` (OpenAI function tools) go to the template as transformers'
    `apply_chat_template(messages, tools=...)` hands them."""
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    return render_chat(
        chat_template_of(tokenizer), messages, bos_token=bos, eos_token=eos, sandbox=sandbox, tools=tools
    )


_PROBE_MESSAGES = [{"role": "user", "content": "What is the weather in Paris?"}]
_PROBE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "probe_tool_7f3a",
            "description": "A probe.",
            "parameters": {"type": "object", "properties": {}},
        },
    }
]


def template_renders_tools(tokenizer: Tokenizer, sandbox: TemplateSandbox | None = None) -> bool:
    """Whether the model's chat template writes the tools it is given into the prompt (it renders a
    probe tool's name); False for templates that ignore `tools` (SmolLM2's, ChatML) or fail with them."""
    try:
        text = render_messages(tokenizer, _PROBE_MESSAGES, sandbox, tools=_PROBE_TOOLS)
    except ChatTemplateError:
        return False
    return "probe_tool_7f3a" in text


def prompt_ids(
    tokenizer: Tokenizer,
    *,
    prompt: str | None = None,
    messages: list[dict[str, Any]] | None = None,
    chat: bool = False,
    parse_special: bool = True,
    sandbox: TemplateSandbox | None = None,
    tools: list[dict[str, Any]] | None = None,
) -> list[int]:
    """Token ids for a raw prompt, a prompt wrapped as one user message (`chat`), or chat messages.

    Rendered chat text always parses its special tokens (the template writes them as text). A
    template that already starts with the BOS text gets no second BOS. `tools` go to the chat
    template (see `render_messages`).
    """
    if messages is None and chat:
        messages = [{"role": "user", "content": prompt or ""}]
    if messages is not None:
        text = render_messages(tokenizer, messages, sandbox, tools)
        ids = tokenizer.encode(text, parse_special=True, add_bos=False)
        if tokenizer.add_bos and tokenizer.bos_id is not None and (not ids or ids[0] != tokenizer.bos_id):
            ids.insert(0, tokenizer.bos_id)
        return ids
    return tokenizer.encode(prompt or "", parse_special=parse_special)
