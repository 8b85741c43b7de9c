"""Chat templates: the default model's own template against llama.cpp, the sandbox, and message checks."""

from __future__ import annotations

import datetime
from pathlib import Path

import gguf
import pytest

from infer.engine.text.chat import CHATML_TEMPLATE, ChatTemplateError, render_chat


@pytest.fixture(scope="module")
def smollm_template(default_model_path: Path) -> str:
    return gguf.GGUFReader(default_model_path).fields["tokenizer.chat_template"].contents()


@pytest.mark.real_model
def test_model_template_matches_llamacpp(smollm_template: str, llamacpp_reference: dict) -> None:
    assert llamacpp_reference["chat_template"]
    for case in llamacpp_reference["chat_template"]:
        assert render_chat(smollm_template, case["messages"]) == case["rendered"]


def test_chatml_fallback() -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    expected = "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
    assert render_chat(CHATML_TEMPLATE, messages, add_generation_prompt=False) == expected
    assert render_chat(CHATML_TEMPLATE, messages) == expected + "<|im_start|>assistant\n"


def test_content_parts_are_joined() -> None:
    messages = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    assert render_chat("{{ messages[0].content }}", messages) == "a\nb"


def test_assistant_tool_call_without_content() -> None:
    messages = [{"role": "assistant", "content": None, "tool_calls": [{"id": "1"}]}]
    assert render_chat("[{{ messages[0].content }}]{{ messages[0].tool_calls[0].id }}", messages) == "[]1"


def test_environment_matches_transformers() -> None:
    user = [{"role": "user", "content": "x"}]
    # tojson keeps non-ASCII text and does not HTML-escape.
    assert render_chat("{{ tools | tojson }}", user, tools=[{"name": "café<>"}]) == '[{"name": "café<>"}]'
    assert render_chat("{{ strftime_now('%Y') }}", user) == str(datetime.datetime.now().year)
    # trim_blocks/lstrip_blocks: block tags leave no newline or indentation behind.
    assert render_chat("  {% if true %}\nA\n  {% endif %}\nB", user) == "A\nB"
    assert render_chat("{{ bos_token }}{{ eos_token }}", user, bos_token="<s>", eos_token="</s>") == "<s></s>"
    assert render_chat("{% for m in messages %}{% break %}{% endfor %}ok", user) == "ok"


@pytest.mark.parametrize(
    ("messages", "needle"),
    [
        ([], "non-empty list"),
        ("hello", "non-empty list"),
        ([{"role": "user", "content": "a"}, "b"], "message 1 must be an object"),
        ([{"role": "user", "content": "a"}, {"role": "robot", "content": "b"}], "message 1 has role 'robot'"),
        ([{"content": "a"}], "message 0 has role None"),
        ([{"role": "user", "content": 3}], "message 0 content must be a string"),
        ([{"role": "user"}], "message 0 content must be a string"),
        ([{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}], "message 0 content part 0"),
        ([{"role": "user", "content": None, "tool_calls": [{}]}], "message 0 content"),
    ],
)
def test_bad_messages(messages: object, needle: str) -> None:
    with pytest.raises(ChatTemplateError, match=needle):
        render_chat(CHATML_TEMPLATE, messages)  # type: ignore[arg-type]


def test_template_errors() -> None:
    user = [{"role": "user", "content": "x"}]
    with pytest.raises(ChatTemplateError, match="does not parse"):
        render_chat("{% for m in messages %}", user)
    with pytest.raises(ChatTemplateError, match="Only user turns"):
        render_chat("{{ raise_exception('Only user turns') }}", user)
    # The sandbox is immutable: a template cannot modify lists.
    with pytest.raises(ChatTemplateError, match="failed to render"):
        render_chat("{% set xs = [] %}{{ xs.append(1) }}", user)
    with pytest.raises(ChatTemplateError, match="failed to render"):
        render_chat("{{ messages[0].content.nope() }}", user)
