"""Tokenizer: llama.cpp's tokenization of the default model, a SentencePiece vocabulary, tokenizer.json."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import pytest
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from infer.engine.text.detokenizer import IncrementalDetokenizer
from infer.engine.text.tokenizer import Tokenizer, TokenizerError


@pytest.fixture(scope="module")
def smollm_metadata(default_model_path: Path) -> dict[str, Any]:
    """The default model's GGUF key/values, as the loader hands them over."""
    reader = gguf.GGUFReader(default_model_path)
    return {key: field.contents() for key, field in reader.fields.items()}


@pytest.fixture(scope="module")
def smollm(smollm_metadata: dict[str, Any]) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm_metadata)


# ---- the default model (gpt2 byte-level BPE, "smollm" pre-tokenizer) against llama.cpp ----------


@pytest.mark.real_model
def test_matches_llamacpp_with_special_parsing(smollm: Tokenizer, llamacpp_reference: dict) -> None:
    for case in llamacpp_reference["tokenize"]:
        assert smollm.encode(case["text"], parse_special=True) == case["ids_parse_special"], case["text"]


@pytest.mark.real_model
def test_matches_llamacpp_without_special_parsing(smollm: Tokenizer, llamacpp_reference: dict) -> None:
    for case in llamacpp_reference["tokenize"]:
        assert smollm.encode(case["text"], parse_special=False) == case["ids_plain"], case["text"]


@pytest.mark.real_model
def test_decode_round_trips_every_probe(smollm: Tokenizer, llamacpp_reference: dict) -> None:
    for case in llamacpp_reference["tokenize"]:
        assert smollm.decode(smollm.encode(case["text"])) == case["text"]
        assert smollm.decode(smollm.encode(case["text"], parse_special=False)) == case["text"]


@pytest.mark.real_model
def test_special_ids_and_flags(smollm: Tokenizer) -> None:
    assert smollm.vocab_size == 49152
    assert (smollm.bos_id, smollm.eos_id, smollm.eot_id) == (1, 2, None)
    assert smollm.special_ids == frozenset(range(17))
    # <|im_end|> is the EOS; <|endoftext|> also ends generation (llama.cpp treats both as end-of-generation).
    assert smollm.stop_ids == frozenset({0, 2})
    assert smollm.add_bos is False
    assert smollm.chat_template is not None and "<|im_start|>" in smollm.chat_template


@pytest.mark.real_model
def test_add_bos_override(smollm: Tokenizer) -> None:
    assert smollm.encode("Hello world!", add_bos=True) == [1, 19556, 905, 17]
    assert smollm.encode("Hello world!") == [19556, 905, 17]


@pytest.mark.real_model
def test_decode_skip_special(smollm: Tokenizer) -> None:
    ids = smollm.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert smollm.decode(ids) == "<|im_start|>user\nhi<|im_end|>\n"
    assert smollm.decode(ids, skip_special=True) == "user\nhi\n"


@pytest.mark.real_model
def test_token_text(smollm: Tokenizer) -> None:
    assert smollm.token_text(905) == " world"
    assert smollm.token_text(2) == "<|im_end|>"
    texts = smollm.token_texts()
    assert len(texts) == 49152 and texts[905] == " world"
    assert smollm.token_texts() is texts  # cached
    # '中文字符测试' is split mid-character: token 116 is the last byte of "符" (E7 AC A6).
    assert smollm.token_bytes(116) == b"\xa6" and smollm.token_text(116) == "\ufffd"


@pytest.mark.real_model
def test_bad_ids_are_rejected(smollm: Tokenizer) -> None:
    with pytest.raises(ValueError, match="49152"):
        smollm.decode([1, 49152])
    with pytest.raises(ValueError, match="-1"):
        smollm.token_text(-1)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"tokenizer.ggml.tokens": None}, "tokenizer.ggml.tokens"),
        ({"tokenizer.ggml.model": "t5"}, "tokenizer.ggml.model"),
        ({"tokenizer.ggml.pre": "no-such-pre"}, "tokenizer.ggml.pre"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "tokenizer.ggml.token_type"),
        ({"tokenizer.ggml.eos_token_id": 10**6}, "tokenizer.ggml.eos_token_id"),
        ({"tokenizer.ggml.merges": ["nospace"]}, "tokenizer.ggml.merges"),
        ({"tokenizer.ggml.bos_token_id": "1"}, "tokenizer.ggml.bos_token_id"),
    ],
)
@pytest.mark.real_model
def test_bad_metadata_names_the_field(smollm_metadata: dict[str, Any], change: dict, field: str) -> None:
    metadata = {**smollm_metadata, **change}
    with pytest.raises(TokenizerError, match=field.replace(".", r"\.")):
        Tokenizer.from_gguf_metadata(metadata)


# ---- a tiny SentencePiece (llama) vocabulary -------------------------------------------------------

_SPM_PIECES = ["▁", "h", "e", "l", "o", "w", "r", "d", "é", "▁h", "ll", "▁he", "llo", "▁hello", "▁w", "or"]
_SPM_PIECES += ["▁wor", "ld", "▁world"]


def spm_metadata() -> dict[str, Any]:
    """A llama-style GGUF vocabulary: unk/bos/eos, 256 byte tokens, <|im_end|>, scored pieces."""
    tokens = ["<unk>", "<s>", "</s>", "<|im_end|>"] + [f"<0x{b:02X}>" for b in range(256)] + _SPM_PIECES
    types = [2, 3, 3, 3] + [6] * 256 + [1] * len(_SPM_PIECES)
    # Longer pieces score higher, so merging runs toward whole words.
    scores = [0.0] * 260 + [float(len(p)) for p in _SPM_PIECES]
    return {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
        "tokenizer.ggml.add_space_prefix": True,
    }


def spm_id(piece: str) -> int:
    return 260 + _SPM_PIECES.index(piece)


def byte_id(value: int) -> int:
    return 4 + value


def test_spm_encode_uses_pieces_and_byte_fallback() -> None:
    tok = Tokenizer.from_gguf_metadata(spm_metadata())
    assert tok.add_bos is True and tok.bos_id == 1 and tok.stop_ids == frozenset({2, 3})
    ids = tok.encode("hello 中 world")
    # "中" is not a piece: it falls back to its three UTF-8 bytes E4 B8 AD.
    assert ids == [
        1,
        spm_id("▁hello"),
        spm_id("▁"),
        byte_id(0xE4),
        byte_id(0xB8),
        byte_id(0xAD),
        spm_id("▁world"),
    ]
    assert tok.encode("héllo", add_bos=False) == [spm_id("▁h"), spm_id("é"), spm_id("llo")]


def test_spm_decode_drops_only_the_prefixed_space() -> None:
    tok = Tokenizer.from_gguf_metadata(spm_metadata())
    ids = tok.encode("hello 中 world")
    assert tok.decode(ids, skip_special=True) == "hello 中 world"
    assert tok.decode(ids) == "<s> hello 中 world"
    assert tok.decode([spm_id("▁world"), spm_id("▁hello")]) == "world hello"
    assert tok.token_text(spm_id("▁world")) == " world"
    assert tok.token_text(byte_id(0xE4)) == "\ufffd"
    # (Text after a special token does not round-trip: the encoder prefixes it with a space.)
    for text in ["hello world", "  hello", "中中", "wé", "hello 中"]:
        assert tok.decode(tok.encode(text), skip_special=False).removeprefix("<s> ") == text


def test_spm_special_token_splitting() -> None:
    tok = Tokenizer.from_gguf_metadata(spm_metadata())
    # After a special token the encoder prefixes a space again (llama.cpp and HF legacy behaviour).
    assert tok.encode("hello<|im_end|>world", add_bos=False) == [spm_id("▁hello"), 3, spm_id("▁world")]
    plain = tok.encode("<|im_end|>", parse_special=False, add_bos=False)
    assert 3 not in plain and tok.decode(plain) == "<|im_end|>"


def test_spm_detokenizer_keeps_word_spaces_and_joins_bytes() -> None:
    tok = Tokenizer.from_gguf_metadata(spm_metadata())
    ids = tok.encode("hello 中 world")
    detok = IncrementalDetokenizer(tok)
    deltas = [detok.add(i) for i in ids]
    assert deltas == ["", "hello", " ", "", "", "中", " world"]
    assert detok.flush() == ""
    # A continuation: the first generated piece keeps its space.
    detok = IncrementalDetokenizer(tok, prompt_ids=ids)
    assert detok.add(spm_id("▁hello")) == " hello"
    # A fresh stream: the prefixed space is dropped, as decode does.
    assert IncrementalDetokenizer(tok, prompt_ids=[1]).add(spm_id("▁hello")) == "hello"


def test_spm_detokenizer_flushes_incomplete_bytes_like_decode() -> None:
    tok = Tokenizer.from_gguf_metadata(spm_metadata())
    ids = [spm_id("▁hello"), byte_id(0xE4), byte_id(0xB8)]
    detok = IncrementalDetokenizer(tok)
    assert [detok.add(i) for i in ids] == ["hello", "", ""]
    tail = detok.flush()
    assert tail == "\ufffd" and "hello" + tail == tok.decode(ids)


# ---- tokenizer.json (safetensors model directories) ----------------------------------------------


def write_byte_level_tokenizer(path: Path) -> None:
    """A small byte-level BPE tokenizer.json: every byte, a few merges, two special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {ch: i for i, ch in enumerate(sorted(alphabet))}
    merges = [("h", "e"), ("l", "l"), ("he", "ll"), ("hell", "o"), ("Ġ", "w")]
    for left, right in merges:
        vocab[left + right] = len(vocab)
    hf = HFTokenizer(models.BPE(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken("<|im_start|>", special=True), AddedToken("<|im_end|>", special=True)])
    path.write_text(hf.to_str())


def test_from_hf_files(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    write_byte_level_tokenizer(path)
    config = {"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>", "chat_template": "{{ x }}"}
    tok = Tokenizer.from_hf_files(path, config)
    start, end = 256 + 5, 256 + 6
    assert tok.vocab_size == 263 and (tok.bos_id, tok.eos_id) == (start, end)
    assert tok.special_ids == frozenset({start, end}) and tok.stop_ids == frozenset({end})
    assert tok.chat_template == "{{ x }}" and tok.add_bos is False
    text = "hello wé 中🤖"
    ids = tok.encode(text)
    assert ids[0] == 256 + 3  # "hello" is one merged token
    assert tok.decode(ids) == text
    ids = tok.encode("<|im_start|>hello<|im_end|>")
    assert ids[0] == start and ids[-1] == end
    assert tok.decode(ids, skip_special=True) == "hello"


def test_from_hf_files_rejects_unknown_special(tmp_path: Path) -> None:
    path = tmp_path / "tokenizer.json"
    write_byte_level_tokenizer(path)
    with pytest.raises(TokenizerError, match="eos_token"):
        Tokenizer.from_hf_files(path, {"eos_token": "</s>"})
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"model": 1}))
    with pytest.raises(TokenizerError, match=r"bad\.json"):
        Tokenizer.from_hf_files(bad, None)


def test_lone_surrogate_is_a_clear_error(smollm: Tokenizer) -> None:
    """JSON allows "\ud800" escapes and undecodable argv bytes become surrogates: a ValueError naming
    the position, not a TypeError from deep inside `tokenizers`."""
    with pytest.raises(ValueError, match="lone surrogate at character 1"):
        smollm.encode("a\ud800b")


@pytest.mark.real_model
def test_byte_level_tokens_render_as_the_alphabet_defines(smollm: Tokenizer, smollm_metadata: dict) -> None:
    """Every token of the default model's vocabulary renders to the bytes the GPT-2 alphabet gives
    character by character (a token with a character outside it stays UTF-8 text), as the translate
    table and pattern that replaced the per-character loop must."""
    from infer.engine.text.tokenizer import _byte_level_decoder_table, _ByteLevelAlphabet

    table = _byte_level_decoder_table()

    def by_definition(token: str) -> bytes:
        if all(ch in table for ch in token):
            return bytes(table[ch] for ch in token)
        return token.encode("utf-8")

    tokens = smollm_metadata["tokenizer.ggml.tokens"]
    special = set(smollm.special_ids)
    rendered = [smollm.token_bytes(i) for i in range(len(tokens))]
    expected = [t.encode("utf-8") if i in special else by_definition(t) for i, t in enumerate(tokens)]
    assert rendered == expected
    assert any(b >= 0x80 for token in rendered for b in token)  # multi-byte pieces were covered
    # characters outside the alphabet, ASCII and latin-1 included, and the alphabet's own edge cases
    alphabet = _ByteLevelAlphabet.build()
    for token in ("", "a b", "\xa0", "\xad", "é", "Ġé", "ĠĊ", "]^-\\", "\u0100\u0143", "日本", "Ġ\x7f"):
        assert alphabet.bytes_of(token) == by_definition(token), token
