"""Incremental detokenizer on the default model: whole characters only, and the same text as decode."""

from __future__ import annotations

import random
from pathlib import Path

import gguf
import pytest

from infer.engine.text.detokenizer import IncrementalDetokenizer
from infer.engine.text.tokenizer import Tokenizer

pytestmark = pytest.mark.real_model

CORPUS = [
    "中文字符测试，日本語のテキスト、한국어 문장.",
    "emoji 🤖🚀 end 👩‍👩‍👧 family 🇫🇷 flag",
    "café naïve résumé Ångström façade",
    "mixed: Привет мир, γειά σου, مرحبا, שלום, नमस्ते 123",
    "math ∑∫√∞ ≠ ≤ and arrows → ⇒",
    "trailing multibyte 😀",
    "a replacement char \ufffd in the source text",
]


@pytest.fixture(scope="module")
def smollm(default_model_path: Path) -> Tokenizer:
    reader = gguf.GGUFReader(default_model_path)
    return Tokenizer.from_gguf_metadata({key: field.contents() for key, field in reader.fields.items()})


def stream(tok: Tokenizer, ids: list[int], *, skip_special: bool = True) -> tuple[list[str], str]:
    detok = IncrementalDetokenizer(tok, skip_special=skip_special)
    deltas = [detok.add(i) for i in ids]
    return deltas, detok.flush()


def test_probe_strings_and_corpus_stream_whole_characters(
    smollm: Tokenizer, llamacpp_reference: dict
) -> None:
    texts = [case["text"] for case in llamacpp_reference["tokenize"]] + CORPUS
    split_characters = 0
    for text in texts:
        ids = smollm.encode(text, parse_special=False)
        deltas, tail = stream(smollm, ids)
        if "\ufffd" not in text:
            assert all("\ufffd" not in d for d in deltas), (text, deltas)
        assert "".join(deltas) + tail == smollm.decode(ids, skip_special=True) == text
        assert tail == ""  # every text ends on a whole character
        split_characters += deltas.count("")
    # The corpus must really split characters across tokens, or this test proves nothing.
    assert split_characters >= 10


def test_split_character_appears_on_its_last_byte(smollm: Tokenizer) -> None:
    ids = smollm.encode("字符")
    deltas, tail = stream(smollm, ids)
    # 字 is one token; 符 (E7 AC A6) comes as two tokens, and appears only with the second.
    assert deltas == ["字", "", "符"] and tail == ""


def test_special_tokens_render_nothing_when_skipped(smollm: Tokenizer) -> None:
    ids = smollm.encode("<|im_start|>assistant\nHi there<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    detok = IncrementalDetokenizer(smollm, skip_special=True)
    deltas = [detok.add(i) for i in ids]
    assert deltas[0] == "" and deltas[-1] == ""
    assert detok.token_count == len(ids)
    assert "".join(deltas) + detok.flush() == "assistant\nHi there"
    deltas, tail = stream(smollm, ids, skip_special=False)
    assert (
        deltas[-1] == "<|im_end|>" and "".join(deltas) + tail == "<|im_start|>assistant\nHi there<|im_end|>"
    )


def test_invalid_and_truncated_bytes_match_decode(smollm: Tokenizer) -> None:
    by_bytes = {smollm.token_bytes(i): i for i in range(smollm.vocab_size)}
    # A stray continuation byte, a lead byte cut short by ASCII, and a lead byte at the very end.
    ids = [by_bytes[b"\x80"], by_bytes[b"a"], by_bytes[b"\xe4"], by_bytes[b"b"], by_bytes[b"\xf0"]]
    deltas, tail = stream(smollm, ids)
    assert "".join(deltas) == "\ufffda\ufffdb" and tail == "\ufffd"
    assert "".join(deltas) + tail == smollm.decode(ids)


def test_random_id_sequences_keep_the_invariant(smollm: Tokenizer) -> None:
    rng = random.Random(1234)
    for _ in range(200):
        ids = [rng.randrange(smollm.vocab_size) for _ in range(rng.randrange(1, 40))]
        for skip in (True, False):
            deltas, tail = stream(smollm, ids, skip_special=skip)
            assert "".join(deltas) + tail == smollm.decode(ids, skip_special=skip)


def test_bad_id_is_rejected(smollm: Tokenizer) -> None:
    detok = IncrementalDetokenizer(smollm)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        detok.add(smollm.vocab_size)


def test_shown_special_tokens_render_their_text(smollm: Tokenizer) -> None:
    # A tool-call marker that is a control token must reach the call parser as text.
    start, end = smollm.token_id("<|im_start|>"), smollm.token_id("<|im_end|>")
    assert start in smollm.control_ids and end in smollm.control_ids
    ids = [start, *smollm.encode("hi", parse_special=False, add_bos=False), end]
    shown = IncrementalDetokenizer(smollm, shown_special=[start])
    assert "".join(shown.add(i) for i in ids) + shown.flush() == "<|im_start|>hi"
    plain = IncrementalDetokenizer(smollm)
    assert "".join(plain.add(i) for i in ids) + plain.flush() == "hi"
