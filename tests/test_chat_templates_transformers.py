"""Real chat templates render as transformers renders them (issue 31, acceptance 4).

Every template llama.cpp ships (tests/data/templates, from the llama-cpp-python 0.3.36 sdist) is
rendered by our sandboxed renderer for the conversation and tools in
tests/reference/chat_templates_transformers.json, with the same BOS/EOS texts and the same fixed
clock, and compared with what transformers' `apply_chat_template(..., tokenize=False,
add_generation_prompt=True)` gave (scripts/chat_template_oracle.py): the same text to the byte, or a
refusal where transformers raised, of the same kind (a template's own `raise_exception` is a
rejection of the messages; any other exception is a render failure carrying transformers' message).
"""

from __future__ import annotations

import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from infer.engine.text.chat import INVALID_CHAT_TEMPLATE, ChatTemplateError, render_chat
from infer.engine.text.sandbox import TemplateSandbox

TEMPLATES = Path(__file__).parent / "data" / "templates"
ORACLE: dict[str, Any] = json.loads(
    (Path(__file__).parent / "reference" / "chat_templates_transformers.json").read_text(encoding="utf-8")
)
NOW = datetime.datetime.fromisoformat(ORACLE["now"])

REFUSAL_PREFIX = {
    # transformers' exception type -> how our one-line message starts
    "TemplateError": "chat template rejected the messages: ",  # the template's raise_exception
    "UndefinedError": "chat template failed to render: ",
}
"""Any other exception type is a render failure that names the type."""


@pytest.fixture(scope="module")
def sandbox():
    with TemplateSandbox() as box:
        yield box


def _ours(sandbox: TemplateSandbox, source: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Our rendering in the oracle's shape: ``{"text"}`` or ``{"error"}`` (our one-line message)."""
    extra = {} if tools is None else {"tools": tools}
    try:
        text = render_chat(
            source,
            ORACLE["messages"],
            bos_token=ORACLE["bos_token"],
            eos_token=ORACLE["eos_token"],
            sandbox=sandbox,
            now=NOW,
            **extra,
        )
    except ChatTemplateError as exc:
        assert exc.code == INVALID_CHAT_TEMPLATE, exc
        return {"error": str(exc)}
    return {"text": text}


def _expected_refusal(error: dict[str, str]) -> str:
    """How our message for transformers' exception starts."""
    message = " ".join(error["message"].split())
    prefix = REFUSAL_PREFIX.get(error["type"], f"chat template failed to render: {error['type']}: ")
    return prefix + message


def test_the_oracle_covers_every_template() -> None:
    on_disk = {path.name: path for path in TEMPLATES.glob("*.jinja")}
    assert len(on_disk) == 70
    assert sorted(on_disk) == sorted(ORACLE["templates"])
    for name, path in on_disk.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == ORACLE["templates"][name]["sha256"], name


@pytest.mark.parametrize("name", sorted(ORACLE["templates"]))
def test_template_renders_as_transformers(sandbox: TemplateSandbox, name: str) -> None:
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    for case, spec in ORACLE["cases"].items():
        want = ORACLE["templates"][name][case]
        got = _ours(sandbox, source, spec["tools"])
        if "text" in want:
            assert got == want, f"{name} ({case})"
        else:
            assert "error" in got, f"{name} ({case}): transformers raised {want['error']}, we rendered"
            assert got["error"].startswith(_expected_refusal(want["error"])[:200]), f"{name} ({case})"


def test_generation_tag_renders_its_body(sandbox: TemplateSandbox) -> None:
    user = [{"role": "user", "content": "x"}]
    template = "{% generation %}{% set inner = 1 %}[{{ messages[0].content }}]{% endgeneration %}{{ inner }}"
    # The body's `set` stays inside the tag (a call block, as in transformers).
    assert render_chat(template, user, sandbox=sandbox) == "[x]"


def test_transformers_variables(sandbox: TemplateSandbox) -> None:
    user = [{"role": "user", "content": "x", "name": None}]
    template = "{{ tools is none }} {{ documents is none }} {{ messages[0].name is defined }}"
    assert render_chat(template, user, sandbox=sandbox) == "True True False"
    assistant = [{"role": "assistant", "content": "a", "reasoning": "r"}]
    template = "{{ messages[0].thinking }}{{ messages[0].reasoning_content }}"
    assert render_chat(template, assistant, sandbox=sandbox) == "rr"
    assert render_chat("{{ dict.fromkeys(['a'], 1) }}", user, sandbox=sandbox) == "{'a': 1}"
    assert render_chat("{{ strftime_now('%d %b %Y') }}", user, sandbox=sandbox, now=NOW) == "14 Mar 2025"
    with pytest.raises(ChatTemplateError, match="underscore-prefixed"):
        render_chat("{% set ns = namespace(_x=1) %}", user, sandbox=sandbox)
