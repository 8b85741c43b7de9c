"""Reasoning blocks (engine/text/reasoning.py, issue 32): `<think>` ... `</think>` split from the
content, whether the prompt opened the block, which templates think, and the tool-call grammars
wrapped so that text inside the block is never a call.

Every reply is also fed in two pieces cut at every character and one character at a time: the
joined reasoning and content must be exactly those of the whole text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import llguidance
import pytest

from infer.engine.grammar.tools import FunctionSchema, tool_call_grammar
from infer.engine.text.chat import CHATML_TEMPLATE, render_chat
from infer.engine.text.reasoning import (
    ContentPiece,
    ReasoningPiece,
    ReasoningSplitter,
    SplitReply,
    ThinkingStart,
    split_reasoning,
    splits_reasoning,
    template_thinks,
    thinking_start,
)
from infer.engine.text.sandbox import TemplateSandbox
from infer.engine.text.tool_calls import parse_output, syntax_named

TEMPLATES = Path(__file__).parent / "data" / "templates"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'

CLOSED_CASES: list[tuple[str, SplitReply]] = [
    ("<think>\nLet me see.\n</think>\n\nHello.", SplitReply("Let me see.", "Hello.")),
    (" \n<think>a b</think>c", SplitReply("a b", "c")),
    ("Hello <think>x</think>", SplitReply(None, "Hello <think>x</think>")),  # not at the start
    ("  plain reply  ", SplitReply(None, "  plain reply  ")),  # untouched without a block
    ("<think>\n\n</think>\n\nHi", SplitReply(None, "Hi")),  # Qwen3's empty block (thinking off)
    ("<think>still thinking", SplitReply("still thinking", "")),  # cut by the token limit
    ("<think>a</thi", SplitReply("a</thi", "")),  # half a marker at the end is text
    ("<thi", SplitReply(None, "<thi")),
    ("<think>a</think>b</think>c", SplitReply("a", "b</think>c")),  # one block, at the start
    ("<think>one\n\ntwo \n</think>", SplitReply("one\n\ntwo", "")),  # inner whitespace kept
    (f"<think>\nMaybe {CALL} later.\n</think>\n\n{CALL}", SplitReply(f"Maybe {CALL} later.", CALL)),
    ("", SplitReply(None, "")),
]
OPEN_CASES: list[tuple[str, SplitReply]] = [
    ("Let me see.\n</think>\n\nHello.", SplitReply("Let me see.", "Hello.")),
    ("<think>\nrepeated marker</think>x", SplitReply("repeated marker", "x")),
    ("never closed <think>", SplitReply("never closed <think>", "")),
    ("</think>\n\nHi", SplitReply(None, "Hi")),
    (f"I could {CALL}\n</think>\nNo.", SplitReply(f"I could {CALL}", "No.")),
    ("", SplitReply(None, "")),
]


def _fed(pieces: list[str], start: ThinkingStart) -> SplitReply:
    splitter = ReasoningSplitter(start)
    events = [e for piece in pieces for e in splitter.feed(piece)] + splitter.finish()
    for event in events:
        assert event.text  # never an empty piece
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningPiece))
    content = "".join(e.text for e in events if isinstance(e, ContentPiece))
    return SplitReply(reasoning or None, content)


@pytest.mark.parametrize(
    ("start", "text", "expected"),
    [("closed", t, e) for t, e in CLOSED_CASES] + [("open", t, e) for t, e in OPEN_CASES],
)
def test_split_is_the_same_for_every_cut(start: ThinkingStart, text: str, expected: SplitReply) -> None:
    assert split_reasoning(text, start) == expected
    for cut in range(len(text) + 1):
        assert _fed([text[:cut], text[cut:]], start) == expected, cut
    assert _fed(list(text), start) == expected


def test_text_is_released_as_soon_as_it_is_decided() -> None:
    splitter = ReasoningSplitter("closed")
    assert splitter.feed("  ") == []  # could still open a block
    assert splitter.feed("<thi") == []
    assert splitter.feed("nk>\nStep one") == [ReasoningPiece("Step one")]
    assert splitter.feed(" and\n") == [ReasoningPiece(" and")]  # the newline waits for what follows
    assert splitter.feed("</thi") == []
    assert splitter.feed("nk>\n\nDone") == [ContentPiece("Done")]
    plain = ReasoningSplitter("closed")
    assert plain.feed("Hi") == [ContentPiece("Hi")]
    opened = ReasoningSplitter("open")
    assert opened.feed("Hmm") == [ReasoningPiece("Hmm")]


def test_which_templates_think_and_which_prompts_open_the_block() -> None:
    assert template_thinks((TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text(encoding="utf-8"))
    assert not template_thinks((TEMPLATES / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8"))
    assert not template_thinks(CHATML_TEMPLATE)
    assert thinking_start("<|im_start|>assistant\n<think>\n") == "open"
    assert thinking_start("<|im_start|>assistant\n<think>\n\n</think>\n\n") == "closed"
    assert thinking_start("<|im_start|>assistant\n") == "closed"
    assert splits_reasoning("auto", "{{ '<think>' }}") and not splits_reasoning("auto", CHATML_TEMPLATE)
    assert not splits_reasoning("auto", None) and not splits_reasoning("none", "<think>")
    assert splits_reasoning("think", CHATML_TEMPLATE) and splits_reasoning("qwen3", None)
    with pytest.raises(ValueError, match="expected one of"):
        splits_reasoning("nope", None)


@pytest.fixture(scope="module")
def sandbox() -> Iterator[TemplateSandbox]:
    with TemplateSandbox() as box:
        yield box


@pytest.mark.parametrize(
    ("name", "variables", "expected"),
    [
        ("Qwen-Qwen3-0.6B.jinja", {}, "closed"),  # the model opens its own block
        ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", {}, "open"),  # the prompt ends `<think>\n`
        ("Qwen-QwQ-32B.jinja", {"enable_thinking": True}, "open"),
        ("Qwen-QwQ-32B.jinja", {}, "closed"),  # without enable_thinking it writes `<think>\n</think>`
    ],
)
def test_real_templates_generation_prompts(
    sandbox: TemplateSandbox, name: str, variables: dict[str, bool], expected: str
) -> None:
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    assert template_thinks(source)
    messages = [{"role": "user", "content": "Hi"}]
    prompt = render_chat(source, messages, bos_token="<s>", eos_token="</s>", sandbox=sandbox, **variables)
    assert thinking_start(prompt[-40:]) == expected


# -- the grammars ----------------------------------------------------------------------------------
FUNCTIONS = [
    FunctionSchema(
        "get_weather",
        {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    ),
    FunctionSchema("noop", {}),
]
CALLS = {
    # syntax -> (a valid call, a call the grammar refuses, the text that opens a call)
    "hermes": (CALL, '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>', "<tool_call>"),
    "llama3_json": ('{"name": "noop", "parameters": {}}', '{"name": "other", "parameters": {}}', "{"),
    "mistral": (
        '[TOOL_CALLS][{"name": "noop", "arguments": {}}]',
        '[TOOL_CALLS][{"name": "other", "arguments": {}}]',
        "[TOOL_CALLS]",
    ),
    "phi4_mini_json": (
        '<|tool_call|>[{"name": "noop", "arguments": {}}]<|/tool_call|>',
        '<|tool_call|>[{"name": "other", "arguments": {}}]<|/tool_call|>',
        "<|tool_call|>",
    ),
    "json": ('{"name": "noop", "arguments": {}}', '{"name": "other", "arguments": {}}', "{"),
}


def _accepts(grammar: str, text: str) -> bool:
    from infer.engine.grammar.compile_worker import _tokenizer, prepare

    if not _tokenizer:
        prepare()
    matcher = llguidance.LLMatcher(_tokenizer[0], grammar, log_level=0)
    return all(matcher.consume_token(b) for b in text.encode()) and matcher.is_accepting()


def _grammar(name: str, mode: str, thinking: ThinkingStart | None) -> str:
    spec = tool_call_grammar(syntax_named(name), FUNCTIONS, mode=mode, parallel=True, thinking=thinking)
    assert spec is not None
    return spec.grammar


@pytest.mark.parametrize("name", sorted(CALLS))
def test_auto_grammar_never_triggers_inside_thinking(name: str) -> None:
    good, bad, opening = CALLS[name]
    free = f"<think>\nI could write {opening} here, or {bad}.\n</think>\n\n"
    closed = _grammar(name, "auto", "closed")
    assert _accepts(closed, free + "Sure.")  # the opening inside the block is only text
    assert _accepts(closed, free + good)  # after the block, calls are allowed ...
    assert not _accepts(closed, free + bad)  # ... and constrained
    assert _accepts(closed, "No block at all.") and _accepts(closed, good)
    # Without the wrap, a marker syntax opens a call inside the block, and a bare-JSON one (whose
    # call opens only at the start) leaves the call after the block unconstrained.
    unwrapped = _grammar(name, "auto", None)
    if opening == "{":
        assert _accepts(unwrapped, free + bad)
    else:
        assert not _accepts(unwrapped, free + "Sure.")
    opened = _grammar(name, "auto", "open")
    inside = f"I could write {opening} here, or {bad}.\n</think>\n\n"
    assert _accepts(opened, inside + "Sure.") and _accepts(opened, inside + good)
    assert not _accepts(opened, inside + bad)
    assert _accepts(opened, "Still thinking when the reply ends")
    for text in (free + good, inside + good):  # what the grammar allows, the readers read as a call
        split = split_reasoning(text, "closed" if text.startswith("<think>") else "open")
        assert parse_output(syntax_named(name), split.content).tool_calls, text


@pytest.mark.parametrize("name", sorted(CALLS))
def test_required_grammar_calls_after_the_block(name: str) -> None:
    good, bad, _ = CALLS[name]
    closed = _grammar(name, "required", "closed")
    assert _accepts(closed, good)  # thinking is optional ...
    assert _accepts(closed, f"<think>\nFirst the city.\n</think>\n\n{good}")
    assert not _accepts(closed, "<think>\nFirst the city.\n</think>\n\nSure.")  # ... a call is not
    assert not _accepts(closed, f"<think>x</think>{bad}")
    opened = _grammar(name, "required", "open")
    assert _accepts(opened, f"First the city.\n</think>\n\n{good}")
    assert not _accepts(opened, good)  # the block the prompt opened must close before the call
    assert not _accepts(opened, f"x</think>\n{bad}")
