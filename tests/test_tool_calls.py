"""Tool-call parsers (engine/text/tool_calls/), one call syntax each (issue 32, acceptance 1).

The prompts come from the real chat templates llama.cpp ships (tests/data/templates, from the
llama-cpp-python 0.3.36 sdist): each family's template is asked to write a past call, and the
parser the template selects must read that very text back as the same call, so parser and template
agree on the format. The model outputs are written by hand from each family's documentation:
parallel calls, calls after text, malformed calls (which stay text), and every output fed in two
pieces cut at every position, and one character at a time, must parse exactly as the whole.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import llguidance
import pytest

from infer.engine.grammar.spec import GrammarError
from infer.engine.grammar.tools import FunctionSchema, tool_call_grammar
from infer.engine.text.chat import render_chat
from infer.engine.text.sandbox import TemplateSandbox
from infer.engine.text.tool_calls import (
    CallStreamParser,
    ParsedOutput,
    TextPiece,
    ToolCall,
    parse_output,
    syntax_for_template,
    syntax_named,
    with_generic_tool_prompt,
)

TEMPLATES = Path(__file__).parent / "data" / "templates"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}},
            "required": ["city"],
        },
    },
}
PAST_CALL = {
    "id": "call00001",  # 9 alphanumerics: Mistral's templates refuse other ids
    "type": "function",
    "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}},
}
CONVERSATION = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [PAST_CALL]},
    {"role": "tool", "tool_call_id": "call00001", "content": '{"temp": 21}'},
]
EXPECTED_PAST = ToolCall("get_weather", '{"city": "Paris", "unit": "c"}')

FAMILIES = {
    # template file -> (the parser it selects, the text its template writes a past call as)
    "Qwen-Qwen2.5-7B-Instruct.jinja": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": '),
    "Qwen-Qwen3-0.6B.jinja": ("hermes", '<tool_call>\n{"name": "get_weather", "arguments": '),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": ("hermes", "<tool_call>\n{"),
    "meta-llama-Llama-3.1-8B-Instruct.jinja": ("llama3_json", '{"name": "get_weather", "parameters": '),
    "meta-llama-Llama-3.2-3B-Instruct.jinja": ("llama3_json", '{"name": "get_weather", "parameters": '),
    "mistralai-Mistral-Nemo-Instruct-2407.jinja": ("mistral", '[TOOL_CALLS][{"name": "get_weather"'),
    "ibm-granite-granite-3.3-2B-Instruct.jinja": ("phi4_mini_json", None),  # writes no past calls
    "google-gemma-2-2b-it.jinja": ("json", None),
}


@pytest.fixture(scope="module")
def sandbox() -> Iterator[TemplateSandbox]:
    with TemplateSandbox() as box:
        yield box


def _render(sandbox: TemplateSandbox, name: str, messages: list[dict], tools: list[dict] | None) -> str:
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    return render_chat(source, messages, bos_token="<s>", eos_token="</s>", sandbox=sandbox, tools=tools)


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_template_selects_its_parser_and_the_parser_reads_its_past_calls(
    sandbox: TemplateSandbox, name: str
) -> None:
    parser_name, written = FAMILIES[name]
    source = (TEMPLATES / name).read_text(encoding="utf-8")
    syntax = syntax_for_template(source)
    assert syntax.name == parser_name
    if written is None:
        return  # the template writes no past calls (Gemma 2 none at all: the generic JSON parser)
    prompt = _render(sandbox, name, CONVERSATION, [WEATHER])
    assert "The weather in a city." in prompt  # the tool is offered
    # The past call as the template wrote it, to the end of the prompt: the parser must read it
    # back as the call it was, before any text.
    tail = prompt[prompt.rindex(written) :]
    parser = CallStreamParser(syntax)
    events = parser.feed(tail) + parser.finish()
    assert events[0] == ToolCall(EXPECTED_PAST.name, EXPECTED_PAST.arguments, _id(syntax))


def _id(syntax: object) -> str | None:
    # Mistral writes the call id into the call; the others leave ids to the server.
    return "call00001" if getattr(syntax, "name", "") == "mistral" else None


OUTPUTS: dict[str, list[tuple[str, ParsedOutput]]] = {
    "hermes": [
        (
            '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
            ParsedOutput("", (ToolCall("get_weather", '{"city": "Paris"}'),)),
        ),
        (  # text first, then two parallel calls (Qwen 2.5 puts a newline between blocks)
            'Let me look.\n<tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>\n{"name": "b", "arguments": {}}\n</tool_call>',
            ParsedOutput("Let me look.\n\n", (ToolCall("a", '{"x": 1}'), ToolCall("b", "{}"))),
        ),
        (  # malformed JSON: the block is text, and so is what follows
            '<tool_call>\n{"name": get_weather}\n</tool_call> done',
            ParsedOutput('<tool_call>\n{"name": get_weather}\n</tool_call> done', ()),
        ),
        (  # arguments that are not an object
            '<tool_call>{"name": "a", "arguments": [1]}</tool_call>',
            ParsedOutput('<tool_call>{"name": "a", "arguments": [1]}</tool_call>', ()),
        ),
        (  # cut off by the token limit inside the call: text
            '<tool_call>\n{"name": "a", "arguments": {"x": ',
            ParsedOutput('<tool_call>\n{"name": "a", "arguments": {"x": ', ()),
        ),
        (  # the end token closed a whole call
            '<tool_call>\n{"name": "a", "arguments": {"x": "<tool_call>"}}\n',
            ParsedOutput("", (ToolCall("a", '{"x": "<tool_call>"}'),)),
        ),
        ("a < b and <tool_ is not a call", ParsedOutput("a < b and <tool_ is not a call", ())),
    ],
    "llama3_json": [
        (
            '{"name": "get_weather", "parameters": {"city": "Paris"}}',
            ParsedOutput("", (ToolCall("get_weather", '{"city": "Paris"}'),)),
        ),
        (
            '{"name": "a", "parameters": {}}; {"name": "b", "parameters": {"q": "x"}}',
            ParsedOutput("", (ToolCall("a", "{}"), ToolCall("b", '{"q": "x"}'))),
        ),
        (
            'Sure. <|python_tag|>{"name": "a", "parameters": {"x": 2}}',
            ParsedOutput("Sure. ", (ToolCall("a", '{"x": 2}'),)),
        ),
        ('The JSON {"name": "a"} is text here', ParsedOutput('The JSON {"name": "a"} is text here', ())),
        ('{"answer": 42} is no call', ParsedOutput('{"answer": 42} is no call', ())),
        ('{"name": "a", "parameters": {"x"', ParsedOutput('{"name": "a", "parameters": {"x"', ())),
    ],
    "mistral": [
        (
            '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}, "id": "abcDEF123"}, '
            '{"name": "b", "arguments": {}}]',
            ParsedOutput("", (ToolCall("a", '{"x": 1}', "abcDEF123"), ToolCall("b", "{}"))),
        ),
        (  # v11 tokenizers: name[ARGS]{...}, one marker per call, after text
            'Checking.[TOOL_CALLS]get_weather[ARGS]{"city": "Oslo"}[TOOL_CALLS]b[CALL_ID]x1y2z3w4v[ARGS]{}',
            ParsedOutput(
                "Checking.", (ToolCall("get_weather", '{"city": "Oslo"}'), ToolCall("b", "{}", "x1y2z3w4v"))
            ),
        ),
        ("[TOOL_CALLS] not a call", ParsedOutput("[TOOL_CALLS] not a call", ())),
        ('[TOOL_CALLS][{"name": "a"}, 3]', ParsedOutput('[TOOL_CALLS][{"name": "a"}, 3]', ())),
    ],
    "phi4_mini_json": [
        (
            '<|tool_call|>[{"name": "a", "arguments": {"x": 1}}]<|/tool_call|>',
            ParsedOutput("", (ToolCall("a", '{"x": 1}'),)),
        ),
        (  # Granite: no closing marker, two calls
            'I will call. <|tool_call|>[{"arguments": {"q": 1}, "name": "a"}, '
            '{"name": "b", "arguments": {}}]',
            ParsedOutput("I will call. ", (ToolCall("a", '{"q": 1}'), ToolCall("b", "{}"))),
        ),
        ("<|tool_call|>nothing", ParsedOutput("<|tool_call|>nothing", ())),
    ],
    "json": [
        ('{"name": "a", "arguments": {"x": 1}}', ParsedOutput("", (ToolCall("a", '{"x": 1}'),))),
        (
            '[{"name": "a", "arguments": {}}, {"name": "b", "parameters": {"y": 2}}]',
            ParsedOutput("", (ToolCall("a", "{}"), ToolCall("b", '{"y": 2}'))),
        ),
        (
            '{"tool_calls": [{"function": {"name": "f", "arguments": "{\\"a\\": 1}"}}]}',
            ParsedOutput("", (ToolCall("f", '{"a": 1}'),)),
        ),
        ('Here: {"name": "a", "arguments": {}}', ParsedOutput('Here: {"name": "a", "arguments": {}}', ())),
        ('{"city": "Paris"}', ParsedOutput('{"city": "Paris"}', ())),
    ],
}
CASES = [(name, text, want) for name, cases in OUTPUTS.items() for text, want in cases]


def _streamed(syntax_name: str, pieces: list[str]) -> ParsedOutput:
    parser = CallStreamParser(syntax_named(syntax_name))
    events = [event for piece in pieces for event in parser.feed(piece)] + parser.finish()
    content = "".join(e.text for e in events if isinstance(e, TextPiece))
    return ParsedOutput(content, tuple(e for e in events if isinstance(e, ToolCall)))


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_parser_reads_the_documented_format(name: str, text: str, want: ParsedOutput) -> None:
    assert parse_output(syntax_named(name), text) == want


@pytest.mark.parametrize(("name", "text", "want"), CASES)
def test_streamed_pieces_cut_anywhere_parse_as_the_whole(name: str, text: str, want: ParsedOutput) -> None:
    encoded = text.encode("utf-8")
    for cut in range(len(encoded) + 1):
        # Text arrives whole characters at a time (the detokenizer never splits one), so a byte
        # cut inside a character falls to the character's start.
        head = encoded[:cut].decode("utf-8", errors="ignore")
        assert _streamed(name, [head, text[len(head) :]]) == want, cut
    assert _streamed(name, list(text)) == want


def test_content_is_released_before_the_call_is_complete() -> None:
    parser = CallStreamParser(syntax_named("hermes"))
    assert parser.feed("Hello <tool") == [TextPiece("Hello ")]  # `<tool` could open a call: held
    assert parser.feed('_call>\n{"name": "a", "arguments": {}}') == []  # held until it closes
    assert parser.feed("\n</tool_call>") == [ToolCall("a", "{}")]


def test_parser_names_and_aliases() -> None:
    assert syntax_named("qwen").name == "hermes"
    assert syntax_named("granite").name == "phi4_mini_json"
    with pytest.raises(ValueError, match="unknown tool-call parser 'nope'"):
        syntax_named("nope")


def test_generic_tool_prompt_for_templates_without_tools(sandbox: TemplateSandbox) -> None:
    messages = [{"role": "system", "content": "Be brief."}, *CONVERSATION]
    rewritten = with_generic_tool_prompt(messages, [WEATHER])
    assert [m["role"] for m in rewritten] == ["system", "user", "assistant", "user"]
    assert rewritten[0]["content"].startswith("Be brief.\n\n# Tools")
    assert json.dumps(WEATHER) in rewritten[0]["content"]
    # The past call is written in the format the hermes parser reads.
    assert parse_output(syntax_named("hermes"), rewritten[2]["content"]).tool_calls == (EXPECTED_PAST,)
    assert rewritten[3]["content"] == '<tool_response>\n{"temp": 21}\n</tool_response>'


# -- the constrained form --------------------------------------------------------------------------
FUNCTIONS = [
    FunctionSchema("get_weather", WEATHER["function"]["parameters"]),  # type: ignore[index]
    FunctionSchema("noop", {}),
]


def _byte_matcher(grammar: str) -> llguidance.LLMatcher:
    from infer.engine.grammar.compile_worker import _tokenizer, prepare

    if not _tokenizer:
        prepare()
    return llguidance.LLMatcher(_tokenizer[0], grammar, log_level=0)


def _accepts(grammar: str, text: str) -> bool:
    matcher = _byte_matcher(grammar)
    return all(matcher.consume_token(b) for b in text.encode()) and matcher.is_accepting()


GRAMMAR_CASES = {
    # syntax -> (texts the required grammar accepts, texts it refuses; the first one opens a call,
    # so the auto grammar refuses it too)
    "hermes": (
        ['<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'],
        [
            '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',  # city is required
            '<tool_call>\n{"name": "other", "arguments": {}}\n</tool_call>',
            'Hi <tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>',
        ],
    ),
    "llama3_json": (['{"name": "noop", "parameters": {}}'], ['{"name": "noop", "arguments": {}}']),
    "mistral": (
        ['[TOOL_CALLS][{"name": "noop", "arguments": {}}]'],
        ['[TOOL_CALLS][{"name": "other", "arguments": {}}]'],
    ),
    "phi4_mini_json": (
        ['<|tool_call|>[{"name": "noop", "arguments": {}}]<|/tool_call|>'],
        ['<|tool_call|>[{"name": "get_weather", "arguments": {"city": 3}}]<|/tool_call|>'],
    ),
    "json": (['{"name": "noop", "arguments": {}}'], ['{"name": "noop"}']),
}


@pytest.mark.parametrize("name", sorted(GRAMMAR_CASES))
def test_required_grammar_allows_only_valid_calls(name: str) -> None:
    syntax = syntax_named(name)
    spec = tool_call_grammar(syntax, FUNCTIONS, mode="required", parallel=False)
    assert spec is not None
    good, bad = GRAMMAR_CASES[name]
    for text in good:
        assert _accepts(spec.grammar, text), text
        assert parse_output(syntax, text).tool_calls  # what the grammar allows, the parser reads
    for text in bad:
        assert not _accepts(spec.grammar, text), text


@pytest.mark.parametrize("name", sorted(GRAMMAR_CASES))
def test_auto_grammar_allows_text_and_constrains_calls(name: str) -> None:
    syntax = syntax_named(name)
    spec = tool_call_grammar(syntax, FUNCTIONS, mode="auto", parallel=True)
    assert spec is not None
    assert _accepts(spec.grammar, "I can answer that without a tool.")
    good, bad = GRAMMAR_CASES[name]
    for text in good:
        assert _accepts(spec.grammar, text), text
    for text in bad[:1]:
        assert not _accepts(spec.grammar, text), text


def test_hermes_auto_grammar_after_text() -> None:
    spec = tool_call_grammar(syntax_named("hermes"), FUNCTIONS, mode="auto", parallel=True)
    assert spec is not None
    call = '<tool_call>\n{"name": "noop", "arguments": {}}\n</tool_call>'
    assert _accepts(spec.grammar, f"Let me check.\n{call}\n{call}")
    assert not _accepts(spec.grammar, 'Let me check.\n<tool_call>\n{"name": "x"')


def test_hostile_schemas_are_refused() -> None:
    deep: dict = {"type": "object"}
    for _ in range(300):
        deep = {"type": "object", "properties": {"a": deep}}
    loop = {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}
    huge = {"type": "object", "properties": {"x": {"enum": [f"v{i}" * 8 for i in range(40_000)]}}}
    for schema in (deep, loop, huge):
        with pytest.raises(GrammarError) as caught:
            tool_call_grammar(
                syntax_named("hermes"), [FunctionSchema("f", schema)], mode="required", parallel=False
            )
        assert caught.value.parameter == "tools"
