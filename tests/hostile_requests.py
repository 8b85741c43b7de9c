"""Issue 29's hostile requests (items 1-3): grammars and schemas that crashed llguidance's native
code or raised bare exceptions, and lists without a length cap. Each is (route, body, the statuses
it may get, the `param` a 400 must name); shared by tests/test_serve_hostile_inputs.py's fast checks
on a tiny model and its stall test on the default model."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
USER = [{"role": "user", "content": "Say something."}]


def defs_chain(links: int) -> dict[str, Any]:
    """A JSON schema whose `$defs` d0 -> d1 -> ... -> dN each wrap the next in an object property."""
    defs: dict[str, Any] = {
        f"d{i}": {"type": "object", "properties": {"a": {"$ref": f"#/$defs/d{i + 1}"}}} for i in range(links)
    }
    defs[f"d{links}"] = {"type": "string", "maxLength": 4}
    return {"$ref": "#/$defs/d0", "$defs": defs}


def lark_chain(rules: int) -> str:
    """`rN: "tN" rN+1 | "tN"` for N < rules, in llguidance's Lark syntax."""
    lines = ["start: r0"] + [f'r{i}: "t{i}" r{i + 1} | "t{i}"' for i in range(rules)]
    return "\n".join([*lines, f'r{rules}: "end"'])


def gbnf_chain(rules: int) -> str:
    """The same chain in llama.cpp's GBNF."""
    lines = ["root ::= r0"] + [f'r{i} ::= "t{i}" r{i + 1} | "t{i}"' for i in range(rules)]
    return "\n".join([*lines, f'r{rules} ::= "end"'])


@dataclass(frozen=True)
class Hostile:
    """One hostile request and what the server may answer."""

    route: str
    body: dict[str, Any]
    statuses: tuple[int, ...] = (400,)
    param: str | None = None
    """The field a 400 must name (None: not checked)."""
    code: str | None = None
    """The error code a 400 must carry (None: not checked)."""


def _chat(**fields: Any) -> dict[str, Any]:
    return {"messages": USER, "max_tokens": 8, **fields}


HOSTILE: dict[str, Hostile] = {
    # item 1: native crashes (SIGSEGV inside llguidance)
    "defs_chain_1000": Hostile(
        CHAT,
        _chat(
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": defs_chain(1000)}}
        ),
        param="response_format.json_schema.schema",
        code="invalid_grammar",
    ),
    "lark_chain_3000_responses": Hostile(
        RESPONSES,
        {"input": "hi", "max_output_tokens": 8, "grammar": lark_chain(3000)},
        param="grammar",
        code="invalid_grammar",
    ),
    "gbnf_chain_10000": Hostile(
        CHAT, _chat(grammar=gbnf_chain(10_000)), param="grammar", code="invalid_grammar"
    ),
    # item 2: llguidance's bare Exception and its internal state in a message
    "empty_grammar_chat": Hostile(CHAT, _chat(grammar=""), param="grammar", code="invalid_grammar"),
    "empty_grammar_completions": Hostile(
        COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "grammar": ""}, param="grammar", code="invalid_grammar"
    ),
    "empty_grammar_responses": Hostile(
        RESPONSES,
        {"input": "hi", "max_output_tokens": 4, "grammar": ""},
        param="grammar",
        code="invalid_grammar",
    ),
    "undefined_rule": Hostile(CHAT, _chat(grammar="root ::= foo"), param="grammar", code="invalid_grammar"),
    "no_root_rule": Hostile(
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 4, "grammar": 'x ::= "a"'},
        param="grammar",
        code="invalid_grammar",
    ),
    "regex_bomb": Hostile(
        CHAT, _chat(grammar="start: /(a{1000}){1000}/"), param="grammar", code="invalid_grammar"
    ),
    # item 3: lists without a cap
    "samplers_100000": Hostile(
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 4, "temperature": 0.8, "samplers": ["top_k"] * 100_000},
        param="samplers",
    ),
    "dry_breakers_10000": Hostile(
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 4, "dry_multiplier": 0.8, "dry_sequence_breakers": ["x"] * 10_000},
        param="dry_sequence_breakers",
    ),
    "messages_100000": Hostile(CHAT, {"messages": USER * 100_000, "max_tokens": 4}, param="messages"),
    "stop_1000": Hostile(COMPLETIONS, {"prompt": "hi", "max_tokens": 4, "stop": ["zz"] * 1000}, param="stop"),
    "content_parts_10000": Hostile(
        CHAT,
        {
            "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 10_000}],
            "max_tokens": 4,
        },
        param="messages.0.content",
    ),
    # within the bounds: accepted, and bounded
    "lark_chain_400": Hostile(CHAT, _chat(grammar=lark_chain(400)), statuses=(200,)),
    "dry_breakers_64": Hostile(
        COMPLETIONS,
        {
            "prompt": "hi",
            "max_tokens": 8,
            "dry_multiplier": 0.8,
            "dry_sequence_breakers": [f"b{i}" for i in range(64)],
        },
        statuses=(200,),
    ),
    "samplers_32": Hostile(
        COMPLETIONS,
        {"prompt": "hi", "max_tokens": 8, "temperature": 0.8, "samplers": ["top_k"] * 32},
        statuses=(200,),
    ),
}
"""Every hostile request, by name."""
