"""The per-model half of a constraint: llguidance's token table, built from the engine's own tokenizer.

Built once per model (about 0.2 s for a 49k vocabulary) and shared by every request. The table is
made from our token bytes, our special-token set and our stop ids, and checked against our
tokenizer entry by entry at build time, so a mask bit i always means our token i; the tokenize
callback llguidance forces text with is checked there too (it must spell exactly what it is given,
on SentencePiece vocabularies that prefix a space as well).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import TypeVar

import llguidance

from infer.engine.grammar import limits
from infer.engine.grammar.compile_worker import one_line
from infer.engine.grammar.spec import GrammarError, GrammarSpec
from infer.engine.text.tokenizer import Tokenizer


class VocabularyMismatchError(RuntimeError):
    """llguidance's view of a token differs from ours (a mask would then allow the wrong tokens)."""


TOKENIZE_PROBES = ("{", " {", '"key": [1, 2.5]}', "\n", "  x", "yes", " no", "a\tb")
"""Texts the tokenize callback must spell exactly when the table is verified: the forced text of
JSON and of grammars, with and without a leading space (where a space-prefixing SentencePiece
encoder went wrong)."""


class _Encoder:
    """The callable + attributes `llguidance.TokenizerWrapper` reads from a tokenizer.

    llguidance calls it for text it has to force (the `{` a JSON object starts with, a grammar's
    literal) and expects tokens that spell exactly that text, as a piece in the middle of the
    output: our `encode_fragment`. Should those tokens ever spell anything else, it answers with
    llguidance's greedy tokenization over the token table instead (always exact, maybe not the
    encoder's choice of tokens): a wrong answer would break the grammar at its first forced text.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tokenizer = tokenizer
        self.eos_token_id = tokenizer.eos_id if tokenizer.eos_id is not None else min(tokenizer.stop_ids)
        self.bos_token_id = tokenizer.bos_id
        self.tokens = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        self.special_token_ids = sorted(tokenizer.special_ids)
        self.greedy: Callable[[str], list[int]] | None = None
        """llguidance's greedy tokenizer, set once the LLTokenizer over this encoder exists."""

    def __call__(self, text: str) -> list[int]:
        if not isinstance(text, str):
            # TokenizerWrapper probes with bytes first; refusing them makes it pass str.
            raise TypeError("the grammar tokenizer takes text")
        ids = self._tokenizer.encode_fragment(text)
        if self.greedy is not None and b"".join(self.tokens[i] for i in ids) != text.encode("utf-8"):
            return self.greedy(text)
        return ids


def build_lltokenizer(tokenizer: Tokenizer, vocab_size: int) -> llguidance.LLTokenizer:
    """llguidance's tokenizer for ours, over the model's `vocab_size` logits (padded ids past the
    tokenizer's own are never allowed), with our stop ids as its end-of-sequence tokens, then
    verified token by token (raises VocabularyMismatchError)."""
    if not tokenizer.stop_ids:
        raise VocabularyMismatchError("the tokenizer has no stop token: a grammar could never end")
    encoder = _Encoder(tokenizer)
    lltok = llguidance.LLTokenizer(
        llguidance.TokenizerWrapper(encoder), n_vocab=vocab_size, eos_token=sorted(tokenizer.stop_ids)
    )
    encoder.greedy = lltok.greedy_tokenize
    verify_mapping(lltok, tokenizer, encoder.tokens)
    verify_tokenize(lltok)
    return lltok


def verify_mapping(lltok: llguidance.LLTokenizer, tokenizer: Tokenizer, tokens: Sequence[bytes]) -> None:
    """Every token: the same bytes (plain tokens) and the same special flag; the same stop ids."""
    special = tokenizer.special_ids
    for token_id, data in enumerate(tokens):
        is_special = token_id in special
        if data.startswith(b"\xff") and not is_special:
            # llguidance marks its special tokens with a leading 0xFF byte, so it takes our plain
            # token for byte 0xFF as special too. 0xFF never occurs in UTF-8: no text grammar could
            # allow that token anyway, and llguidance never does.
            continue
        if lltok.is_special_token(token_id) != is_special:
            raise VocabularyMismatchError(
                f"token {token_id} is {'' if is_special else 'not '}special for us but not for llguidance"
            )
        if not is_special and lltok.decode_bytes([token_id]) != data:
            raise VocabularyMismatchError(f"token {token_id}: llguidance's bytes differ from ours")
    if set(lltok.eos_tokens) != set(tokenizer.stop_ids):
        raise VocabularyMismatchError(
            f"llguidance's end tokens {sorted(lltok.eos_tokens)} differ from ours "
            f"{sorted(tokenizer.stop_ids)}"
        )


def verify_tokenize(lltok: llguidance.LLTokenizer, probes: Sequence[str] = TOKENIZE_PROBES) -> None:
    """llguidance's tokenization of each probe (through our callback) spells exactly the probe."""
    for text in probes:
        spelled = lltok.decode_bytes(lltok.tokenize_str(text))
        if spelled != text.encode("utf-8"):
            raise VocabularyMismatchError(
                f"the grammar tokenizer spells {text!r} as {spelled!r}: forced text would break constraints"
            )


class GrammarVocabulary:
    """One model's token table for constraints, built on first use (not at load: most requests have
    no constraint) and kept; thread-safe, as submissions come from server threads."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = int(vocab_size)
        self._lltok: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()

    @property
    def lltokenizer(self) -> llguidance.LLTokenizer:
        """The verified llguidance tokenizer (built once)."""
        with self._lock:
            if self._lltok is None:
                self._lltok = build_lltokenizer(self.tokenizer, self.vocab_size)
            return self._lltok

    def matcher(self, spec: GrammarSpec) -> llguidance.LLMatcher:
        """A fresh matcher for `spec` at its start state (raises GrammarError if it cannot be built),
        built on a thread with a known deep stack (`limits.MATCHER_STACK_MB`): building compiles the
        grammar again, in native code that recurses with its nesting."""
        lltok = self.lltokenizer
        parser_limits = llguidance.LLParserLimits(**limits.PARSER_LIMITS)
        matcher = on_deep_stack(
            lambda: llguidance.LLMatcher(lltok, spec.grammar, log_level=0, limits=parser_limits),
            limits.MATCHER_STACK_MB,
        )
        if matcher.is_error():
            raise GrammarError(
                f"invalid {spec.kind.replace('_', ' ')}: {one_line(matcher.get_error())}", spec.parameter
            )
        return matcher


T = TypeVar("T")

_STACK_SIZE_LOCK = threading.Lock()
"""Guards the process-wide `threading.stack_size` while a deep-stack thread is made."""


def on_deep_stack(work: Callable[[], T], stack_mb: int) -> T:
    """`work()` run on a new thread with a `stack_mb` MiB stack (whatever `ulimit -s` says); its
    result or its exception."""
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = work()
        except BaseException as exc:
            box["error"] = exc

    with _STACK_SIZE_LOCK:
        previous = threading.stack_size(stack_mb * 2**20)
        try:
            thread = threading.Thread(target=run, name="grammar-matcher", daemon=True)
            thread.start()
        finally:
            threading.stack_size(previous)
    thread.join()
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]
