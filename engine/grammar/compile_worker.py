"""The grammar-compile worker's handler: turns a constraint into llguidance's grammar in a separate
process, where a crash of llguidance's native code (a stack overflow on a deep grammar, an allocation
that aborts) ends the worker and not the server.

A job is ``{"kind", "source", "choices", "json_options", "limits", "smoke_steps"}``; the reply is
``{"grammar", "lark"}`` (``lark``: the Lark text a GBNF grammar became, for kind ``lark_or_gbnf``) or
``{"error"}``, one line. Besides compiling and validating, a job runs a *smoke match*: a matcher over
a byte-level vocabulary (the 256 bytes plus an end token) computes its first masks and follows the
lowest allowed byte for ``smoke_steps`` tokens, so a grammar whose lexer explodes when matched (a
regex like ``(a{1000}){1000}``) fails here, in the worker's CPU and time limits, rather than in
the server's step loop.

This file imports only the standard library and llguidance: the worker loads it by path without
importing ``infer`` (:mod:`infer.engine.workers.serve`).
"""

from __future__ import annotations

import json
from typing import Any

import llguidance
from llguidance.gbnf_to_lark import any_to_lark

_BYTE_VOCABULARY = 257
"""The smoke match's tokens: bytes 0-255, then the end token."""


class GrammarRejected(Exception):
    """llguidance (or the GBNF converter) refused the constraint; the message is for the client."""


class _Bytes:
    """A byte-level tokenizer for llguidance's TokenizerWrapper: token i is byte i, 256 ends."""

    def __init__(self) -> None:
        self.eos_token_id = 256
        self.bos_token_id = None
        self.tokens = [bytes([i]) for i in range(256)] + [b"\xff<end>"]
        self.special_token_ids = [256]

    def __call__(self, text: str) -> list[int]:
        return list(text.encode("utf-8"))


_tokenizer: list[llguidance.LLTokenizer] = []


def prepare() -> None:
    """Build the byte-level tokenizer before the limits apply (the worker calls this once)."""
    wrapper = llguidance.TokenizerWrapper(_Bytes())
    _tokenizer.append(llguidance.LLTokenizer(wrapper, n_vocab=_BYTE_VOCABULARY, eos_token=[256]))


def one_line(text: str, limit: int = 300) -> str:
    """`text` on one line, cut at `limit` characters; llguidance's `<non-verbose/>` marker removed."""
    line = " ".join(str(text).replace("<non-verbose/>", " ").split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _grammar(kind: str, source: str, choices: list[str], json_options: dict[str, Any]) -> tuple[str, str]:
    """(llguidance grammar, Lark text or "") for one constraint."""
    matcher = llguidance.LLMatcher
    label = kind.replace("_", " ")
    try:
        if kind == "json_schema":
            return matcher.grammar_from_json_schema(source, overrides=json_options), ""
        if kind == "json_object":
            return matcher.grammar_from_json_schema({"type": "object"}, overrides=json_options), ""
        if kind == "regex":
            return matcher.grammar_from_regex(source), ""
        if kind == "choice":
            alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
            return matcher.grammar_from_lark(f"start: {alternatives}"), ""
    except ValueError as exc:
        raise GrammarRejected(f"invalid {label}: {one_line(str(exc))}") from None
    lark = source
    if kind == "lark_or_gbnf":
        try:
            lark = any_to_lark(source)
        except Exception as exc:  # the converter raises a bare Exception for a grammar without root
            raise GrammarRejected(f"invalid GBNF grammar: {one_line(str(exc))}") from None
    return matcher.grammar_from_lark(lark), lark


def _smoke_match(grammar: str, limits: llguidance.LLParserLimits, steps: int) -> None:
    """Match the first `steps` tokens of the lowest-byte path; GrammarRejected on a matcher error."""
    matcher = llguidance.LLMatcher(_tokenizer[0], grammar, log_level=0, limits=limits)
    for _ in range(steps + 1):
        if matcher.is_error():
            raise GrammarRejected(f"the grammar fails when matched: {one_line(matcher.get_error())}")
        if matcher.is_stopped():
            return
        mask = matcher.compute_bitmask()
        if matcher.is_error():
            continue
        allowed = [i for i in range(_BYTE_VOCABULARY) if mask[i // 8] >> (i % 8) & 1]
        if not allowed:
            raise GrammarRejected("the grammar allows no text at all")
        if allowed[0] == 256:
            return  # only the end is allowed: the match is complete
        matcher.consume_token(allowed[0])


def handle(request: dict[str, Any]) -> dict[str, Any]:
    """One compile job (see the module docstring)."""
    limits = llguidance.LLParserLimits(**request["limits"])
    kind = str(request["kind"])
    grammar, lark = _grammar(kind, str(request["source"]), list(request["choices"]), request["json_options"])
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, limits=limits)
    if is_error or messages:
        # A warning is a feature llguidance would not enforce: refused, never silently ignored.
        detail = "; ".join(one_line(m) for m in messages) or "rejected by llguidance"
        label = "grammar" if kind == "lark_or_gbnf" else kind.replace("_", " ")
        raise GrammarRejected(f"invalid {label}: {one_line(detail)}")
    _smoke_match(grammar, limits, int(request["smoke_steps"]))
    return {"grammar": grammar, "lark": lark}


def describe(exc: BaseException, memory_mb: int) -> str:
    """The one-line message for a failed job."""
    if isinstance(exc, GrammarRejected):
        return str(exc)
    if isinstance(exc, MemoryError):
        return f"compiling the grammar needed more than {memory_mb} MiB of memory"
    if isinstance(exc, RecursionError):
        return "the grammar nests too deeply to compile"
    return f"the grammar could not be compiled: {type(exc).__name__}: {one_line(str(exc))}"
