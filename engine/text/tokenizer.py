"""Text <-> token ids, built with Hugging Face `tokenizers` from GGUF metadata or a `tokenizer.json`.

Encoding is delegated to `tokenizers` (configured to match llama.cpp for GGUF files: the same
pre-tokenizer regexes per `tokenizer.ggml.pre` (`infer.engine.text.pretokenize`), the same
special-token splitting and end-of-generation tokens). Decoding does not go through `tokenizers`:
every token is rendered once to its raw bytes, and text is those bytes joined and read as UTF-8.
That makes `decode` and the incremental detokenizer (`infer.engine.text.detokenizer`) agree by
construction, and gives samplers and grammars per-token bytes.
"""

from __future__ import annotations

import json
import re
import threading
from array import array
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from itertools import accumulate
from pathlib import Path
from typing import Any

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from infer.engine.text import pretokenize

__all__ = ["Tokenizer", "TokenizerError"]

# GGUF token types (llama.cpp `llama_token_type`).
_TYPE_NORMAL, _TYPE_UNKNOWN, _TYPE_CONTROL, _TYPE_USER_DEFINED, _TYPE_UNUSED, _TYPE_BYTE = 1, 2, 3, 4, 5, 6

_SPM_SPACE = "▁"

# End-of-generation texts of llama.cpp's vocabulary loader (llama-vocab.cpp), for vocabularies whose
# metadata names one EOS only (SmolLM2's <|endoftext|> next to its <|im_end|> EOS, Llama 3's
# <|eot_id|>/<|eom_id|>, Gemma 4's <turn|>...).
_EOG_TEXTS = frozenset(
    {
        "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
        "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
        "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
        "<｜end▁of▁sentence｜>", "[e~[",
    }
)  # fmt: skip


class TokenizerError(Exception):
    """The tokenizer data (GGUF metadata or tokenizer files) is missing a field or is inconsistent."""


class _PackedBytes(Sequence[bytes]):
    """Byte strings kept back to back in one bytes object, each read as a slice: a 128k vocabulary's
    tokens as 128k small objects held ~8 MB of the heap, packed ~1.5 MB."""

    def __init__(self, items: Sequence[bytes]) -> None:
        self._blob = b"".join(items)
        self._ends = array("q", accumulate(len(item) for item in items))

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, index: int) -> bytes:  # type: ignore[override]
        if not -len(self._ends) <= index < len(self._ends):
            raise IndexError("token index out of range")
        index %= len(self._ends)
        start = self._ends[index - 1] if index else 0
        return self._blob[start : self._ends[index]]


def _byte_level_decoder_table() -> dict[str, int]:
    """GPT-2's printable-character alphabet for bytes, inverted: character -> byte value."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    table = {chr(b): b for b in printable}
    extra = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + extra)] = b
            extra += 1
    return table


@dataclass(frozen=True)
class _ByteLevelAlphabet:
    """GPT-2's byte alphabet as a `str.translate` table (each character to its byte, as the latin-1
    character of that value) and a pattern finding any character outside it. A vocabulary's tokens
    are converted in C this way: a per-character loop took 0.15 s of a 1.3 s start-up (49,152 tokens)."""

    translation: dict[int, str]
    outside: re.Pattern[str]

    @classmethod
    def build(cls) -> _ByteLevelAlphabet:
        """The alphabet of `_byte_level_decoder_table`."""
        table = _byte_level_decoder_table()
        pattern = re.compile(f"[^{re.escape(''.join(table))}]")
        return cls({ord(ch): chr(b) for ch, b in table.items()}, pattern)

    def bytes_of(self, token: str) -> bytes:
        """The bytes a byte-level BPE token stands for."""
        # A character outside the byte alphabet cannot come from byte-level BPE; keep it as UTF-8 text.
        if self.outside.search(token):
            return token.encode("utf-8")
        return token.translate(self.translation).encode("latin-1")


def _spm_bytes(token: str, token_type: int) -> bytes:
    if token_type == _TYPE_BYTE and len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        return bytes([int(token[3:5], 16)])
    return token.replace(_SPM_SPACE, " ").encode("utf-8")


def _field(
    metadata: dict[str, Any], key: str, kind: type, default: Any = None, required: bool = False
) -> Any:
    value = metadata.get(key, default)
    if value is None:
        if required:
            raise TokenizerError(f"GGUF metadata has no {key}")
        return None
    if (kind is int and isinstance(value, bool)) or not isinstance(value, kind):
        raise TokenizerError(f"GGUF metadata {key} should be {kind.__name__}, got {type(value).__name__}")
    return value


def _token_id(metadata: dict[str, Any], key: str, vocab_size: int) -> int | None:
    value = _field(metadata, key, int)
    if value is None or value == -1 or value == 0xFFFFFFFF:  # llama.cpp writes "none" as -1
        return None
    if not 0 <= value < vocab_size:
        raise TokenizerError(f"GGUF metadata {key}={value} is outside the vocabulary (size {vocab_size})")
    return value


def _spm_merges(tokens: list[str], token_types: list[int], scores: list[float]) -> list[tuple[str, str]]:
    """Merges equivalent to SentencePiece BPE: joining two pieces into a higher-scored piece first."""
    vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}
    candidates: list[tuple[float, int, int, int]] = []
    for merged_id, merged in enumerate(tokens):
        if token_types[merged_id] != _TYPE_NORMAL:
            continue
        for cut in range(1, len(merged)):
            left, right = vocab.get(merged[:cut]), vocab.get(merged[cut:])
            if left is not None and right is not None:
                candidates.append((-scores[merged_id], merged_id, left, right))
    candidates.sort()
    return [(tokens[left], tokens[right]) for _, _, left, right in candidates]


def _end_of_generation(
    tokens: list[str], token_types: list[int], named: frozenset[int]
) -> tuple[list[int], frozenset[int]]:
    """llama.cpp's end-of-generation fix-ups of a GGUF vocabulary: the token types to use and the
    tokens that end generation besides `named` (the metadata's EOS, EOT and EOM).

    Every token spelled as one of `_EOG_TEXTS` ends generation and becomes a control token whatever
    its type (so it is matched in text only with special parsing, and `skip_special` drops it), except
    `<|end|>` next to `<|return|>`/`<|call|>` or `<|calls|>`/`<|flush|>` (gpt-oss, Solar Open: a
    user-defined token that does not stop), and `</s>` next to `<|tool_response>` (Gemma 4) or
    `<|plamo:eos|>` (a normal token).
    """
    types = list(token_types)
    eog = {i for i, text in enumerate(tokens) if text in _EOG_TEXTS}
    for i in eog:
        types[i] = _TYPE_CONTROL
    texts = {tokens[i] for i in eog | named}

    def demote(text: str, token_type: int) -> None:
        for i in [i for i in eog if tokens[i] == text]:
            eog.discard(i)
            types[i] = token_type

    if "<|end|>" in texts and texts & {"<|call|>", "<|calls|>"} and texts & {"<|return|>", "<|flush|>"}:
        demote("<|end|>", _TYPE_USER_DEFINED)
    if texts & {"<|tool_response>", "<|plamo:eos|>"}:
        demote("</s>", _TYPE_NORMAL)
    return types, frozenset(eog)


def _gguf_merges(metadata: dict[str, Any]) -> list[tuple[str, str]]:
    """`tokenizer.ggml.merges` as pairs, each entry split at its first space after the first character
    (as llama.cpp does: a merge's left part may itself be a space)."""
    merges = []
    for entry in _field(metadata, "tokenizer.ggml.merges", list, required=True):
        cut = entry.find(" ", 1) if isinstance(entry, str) else -1
        if cut < 0:
            raise TokenizerError(f"GGUF metadata tokenizer.ggml.merges has a bad entry {entry!r}")
        merges.append((entry[:cut], entry[cut + 1 :]))
    return merges


def _spm_decoder() -> decoders.Decoder:
    """`tokenizers`' decoding of SentencePiece-style pieces: "▁" as space, <0xXX> tokens as bytes."""
    return decoders.Sequence([decoders.Replace(_SPM_SPACE, " "), decoders.ByteFallback()])


def _spm_token_bytes(tokens: list[str], token_types: list[int], special: frozenset[int]) -> list[bytes]:
    """Each SentencePiece-style token's bytes; special tokens are their own text."""
    return [
        t.encode("utf-8") if i in special else _spm_bytes(t, token_types[i]) for i, t in enumerate(tokens)
    ]


class Tokenizer:
    """A model's tokenizer: `encode` text to ids, `decode` ids to text, per-token text for samplers.

    Build one with `from_gguf_metadata` or `from_hf_files`. Instances are immutable after
    construction and safe to share between threads.
    """

    def __init__(
        self,
        hf: HFTokenizer,
        token_bytes: list[bytes],
        *,
        bos_id: int | None,
        eos_id: int | None,
        eot_id: int | None,
        special_ids: frozenset[int],
        control_ids: frozenset[int],
        extra_stop_ids: frozenset[int] = frozenset(),
        add_bos: bool,
        strip_leading_space: bool,
        chat_template: str | None,
    ) -> None:
        """Low-level constructor; use `from_gguf_metadata` or `from_hf_files`."""
        self._hf = hf
        # A second copy that treats special-token text as plain text (`encode_special_tokens` is
        # tokenizer state, and flipping it per call would race between threads), made on first use:
        # with a 262k vocabulary it costs a second or so and ~200 MB that most runs never need.
        self._hf_plain: HFTokenizer | None = None
        # ... and one that also prefixes no space (`encode_fragment`), the plain one where the
        # encoder prefixes none.
        self._hf_fragment: HFTokenizer | None = None
        self._hf_copies_lock = threading.Lock()
        self._token_bytes = _PackedBytes(token_bytes)
        self.vocab_size: int = len(token_bytes)
        """Number of token ids (the model's embedding rows may be more)."""
        self.bos_id = bos_id
        self.eos_id = eos_id
        self.eot_id = eot_id
        self.special_ids = special_ids
        """Control and user-defined tokens (GGUF token types 3 and 4; added tokens in tokenizer.json)."""
        self.control_ids = control_ids
        """The special tokens that `skip_special` drops (control tokens; user-defined ones are text)."""
        self.stop_ids: frozenset[int] = frozenset(
            i for i in (eos_id, eot_id, *extra_stop_ids) if i is not None
        )
        """Generation stops on any of these: EOS, EOT and the end-of-turn tokens the vocabulary marks."""
        self.add_bos = add_bos
        self.strip_leading_space = strip_leading_space
        """SentencePiece-style vocabularies: decoded text drops the space the encoder prefixed."""
        self.chat_template = chat_template

    def _plain(self) -> HFTokenizer:
        """The copy that encodes special-token text as plain text (built once, on first use)."""
        with self._hf_copies_lock:
            if self._hf_plain is None:
                self._hf_plain = _plain_copy(self._hf.to_str())
            return self._hf_plain

    def _fragment(self) -> HFTokenizer:
        """The plain copy without the space prefix (built once, on first use)."""
        plain = self._plain()
        with self._hf_copies_lock:
            if self._hf_fragment is None:
                self._hf_fragment = plain
                if _adds_space_prefix(self._hf):
                    spec = json.loads(self._hf.to_str())
                    spec["normalizer"] = _without_space_prefix(spec.get("normalizer"))
                    spec["pre_tokenizer"] = _without_space_prefix(spec.get("pre_tokenizer"))
                    self._hf_fragment = _plain_copy(json.dumps(spec))
            return self._hf_fragment

    # ---- construction -------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, metadata: dict[str, Any]) -> Tokenizer:
        """Build from GGUF key/values: `gpt2` (byte-level BPE), `llama` (SentencePiece BPE) or `gemma4`
        (BPE over SentencePiece-style text) vocabularies."""
        model = _field(metadata, "tokenizer.ggml.model", str, required=True)
        tokens = _field(metadata, "tokenizer.ggml.tokens", list, required=True)
        if not tokens or not all(isinstance(t, str) for t in tokens):
            raise TokenizerError("GGUF metadata tokenizer.ggml.tokens must be a non-empty list of strings")
        n = len(tokens)
        token_types = _field(metadata, "tokenizer.ggml.token_type", list, default=[_TYPE_NORMAL] * n)
        if len(token_types) != n:
            raise TokenizerError(
                f"GGUF metadata tokenizer.ggml.token_type has {len(token_types)} entries, not {n}"
            )
        ids = {
            name: _token_id(metadata, f"tokenizer.ggml.{name}_token_id", n)
            for name in ("bos", "eos", "eot", "eom", "unknown")
        }
        named = frozenset(ids[k] for k in ("eos", "eot", "eom") if ids[k] is not None)
        token_types, end_of_generation = _end_of_generation(tokens, token_types, named)
        special = frozenset(i for i, t in enumerate(token_types) if t in (_TYPE_CONTROL, _TYPE_USER_DEFINED))
        control = frozenset(i for i, t in enumerate(token_types) if t == _TYPE_CONTROL)
        vocab = {t: i for i, t in reversed(list(enumerate(tokens)))}  # first id wins on duplicates

        if model == "gpt2":
            pre = _field(metadata, "tokenizer.ggml.pre", str, default="default") or "default"
            if not pretokenize.is_supported(pre):
                raise TokenizerError(
                    f"GGUF metadata tokenizer.ggml.pre={pre!r} is not a supported pre-tokenizer"
                )
            merges = _gguf_merges(metadata)
            hf = HFTokenizer(models.BPE(vocab, merges, ignore_merges=pre in pretokenize.IGNORE_MERGES))
            hf.pre_tokenizer = pretokenize.pre_tokenizer(pre)
            hf.decoder = decoders.ByteLevel()
            alphabet = _ByteLevelAlphabet.build()
            token_bytes = [
                t.encode("utf-8") if i in special else alphabet.bytes_of(t) for i, t in enumerate(tokens)
            ]
            add_space_prefix, add_bos_default = False, pre in pretokenize.ADD_BOS_BY_DEFAULT
        elif model == "gemma4":
            # Gemma 4 (llama.cpp's `gemma4`): BPE with ranked merges, but over UTF-8 text whose spaces
            # are "▁" (no prefix), split only at newline runs, and pieces outside the vocabulary spelled
            # with <0xXX> byte tokens. llama.cpp also takes a newline run whole when it is a token
            # (1 to 31 newlines); Gemma 4's merges build exactly those tokens, so plain BPE agrees.
            hf = HFTokenizer(models.BPE(vocab, _gguf_merges(metadata), byte_fallback=True))
            hf.normalizer = normalizers.Replace(" ", _SPM_SPACE)
            hf.pre_tokenizer = pre_tokenizers.Split(Regex(pretokenize.GEMMA4_SPLIT), behavior="isolated")
            hf.decoder = _spm_decoder()
            token_bytes = _spm_token_bytes(tokens, token_types, special)
            add_space_prefix, add_bos_default = False, True
        elif model == "llama":
            scores = _field(metadata, "tokenizer.ggml.scores", list, required=True)
            if len(scores) != n:
                raise TokenizerError(
                    f"GGUF metadata tokenizer.ggml.scores has {len(scores)} entries, not {n}"
                )
            unk = ids["unknown"]
            hf = HFTokenizer(
                models.BPE(
                    vocab,
                    _spm_merges(tokens, token_types, scores),
                    unk_token=tokens[unk] if unk is not None else None,
                    fuse_unk=True,
                    byte_fallback=True,
                )
            )
            add_space_prefix = bool(_field(metadata, "tokenizer.ggml.add_space_prefix", bool, default=True))
            steps = [normalizers.Prepend(_SPM_SPACE)] if add_space_prefix else []
            hf.normalizer = normalizers.Sequence([*steps, normalizers.Replace(" ", _SPM_SPACE)])
            hf.decoder = _spm_decoder()
            token_bytes = _spm_token_bytes(tokens, token_types, special)
            add_bos_default = True
        else:
            raise TokenizerError(
                f"GGUF metadata tokenizer.ggml.model={model!r} is not supported (gpt2, gemma4, llama)"
            )

        # Special-token text is matched verbatim, before normalization and pre-tokenization, as llama.cpp
        # does; user-defined tokens are matched even when special parsing is off (llama.cpp again).
        hf.add_special_tokens(
            [AddedToken(tokens[i], special=True, normalized=False) for i in sorted(control)]
        )
        hf.add_tokens(
            [AddedToken(tokens[i], special=False, normalized=False) for i in sorted(special - control)]
        )
        add_bos = _field(metadata, "tokenizer.ggml.add_bos_token", bool, default=add_bos_default)
        # llama.cpp adds BOS for Gemma 4 whatever the metadata says (converted files said false).
        add_bos = add_bos or model == "gemma4"
        if add_bos and ids["bos"] is None:
            raise TokenizerError("GGUF metadata asks to add BOS but has no tokenizer.ggml.bos_token_id")
        return cls(
            hf,
            token_bytes,
            bos_id=ids["bos"],
            eos_id=ids["eos"],
            eot_id=ids["eot"],
            special_ids=special,
            control_ids=control,
            extra_stop_ids=end_of_generation | named,
            add_bos=add_bos,
            strip_leading_space=add_space_prefix,
            chat_template=_field(metadata, "tokenizer.chat_template", str),
        )

    @classmethod
    def from_hf_files(cls, tokenizer_json: Path, tokenizer_config: dict[str, Any] | None) -> Tokenizer:
        """Build from a model directory's `tokenizer.json` and parsed `tokenizer_config.json` (or None)."""
        try:
            spec = json.loads(Path(tokenizer_json).read_text(encoding="utf-8"))
            hf = HFTokenizer.from_str(json.dumps(spec))
        except Exception as exc:  # tokenizers raises plain Exception for bad JSON
            raise TokenizerError(f"cannot load {tokenizer_json}: {exc}") from exc
        config = tokenizer_config or {}
        n = hf.get_vocab_size(with_added_tokens=True)
        added = {int(t["id"]): t for t in spec.get("added_tokens", [])}
        special = frozenset(i for i in added if i < n)
        control = frozenset(i for i, t in added.items() if t.get("special") and i < n)

        decoder_kinds = _decoder_kinds(spec.get("decoder"))
        byte_level = "ByteLevel" in decoder_kinds
        strip = "Strip" in decoder_kinds or (
            "Metaspace" in decoder_kinds
            and (spec.get("decoder") or {}).get("prepend_scheme", "always") != "never"
        )
        alphabet = _ByteLevelAlphabet.build()
        token_bytes = []
        for i in range(n):
            text = hf.id_to_token(i)
            if text is None:  # a hole in the id space: renders as nothing
                token_bytes.append(b"")
            elif i in special:
                token_bytes.append(text.encode("utf-8"))
            elif byte_level:
                token_bytes.append(alphabet.bytes_of(text))
            else:
                is_byte = len(text) == 6 and text.startswith("<0x") and text.endswith(">")
                token_bytes.append(_spm_bytes(text, _TYPE_BYTE if is_byte else _TYPE_NORMAL))

        def special_id(key: str) -> int | None:
            value = config.get(key)
            if isinstance(value, dict):
                value = value.get("content")
            if value is None:
                return None
            if not isinstance(value, str) or hf.token_to_id(value) is None:
                raise TokenizerError(f"tokenizer_config {key}={value!r} is not a token of {tokenizer_json}")
            return hf.token_to_id(value)

        bos_id, eos_id = special_id("bos_token"), special_id("eos_token")
        add_bos = config.get("add_bos_token")
        if add_bos is None:  # ask the post-processor whether it prepends BOS
            probe = hf.encode("", add_special_tokens=True).ids
            add_bos = bos_id is not None and probe[:1] == [bos_id]
        template = config.get("chat_template")
        if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
            template = next((t.get("template") for t in template if t.get("name") == "default"), None)
        return cls(
            hf,
            token_bytes,
            bos_id=bos_id,
            eos_id=eos_id,
            eot_id=None,
            special_ids=special,
            control_ids=control,
            extra_stop_ids=frozenset(
                i for i in special if token_bytes[i].decode("utf-8", "replace") in _EOG_TEXTS
            ),
            add_bos=bool(add_bos),
            strip_leading_space=strip,
            chat_template=template if isinstance(template, str) else None,
        )

    # ---- text <-> ids -------------------------------------------------------------------------

    def encode(self, text: str, *, parse_special: bool = True, add_bos: bool | None = None) -> list[int]:
        """Token ids for `text`.

        parse_special: special-token text such as "<|im_start|>" becomes that token (as llama-server
        does); False treats it as plain text. add_bos: prepend BOS; None follows the model's metadata.
        """
        ids = self._checked_encode(self._hf if parse_special else self._plain(), text)
        if self.add_bos if add_bos is None else add_bos:
            if self.bos_id is None:
                raise ValueError("this tokenizer has no BOS token to add")
            ids.insert(0, self.bos_id)
        return ids

    def encode_fragment(self, text: str) -> list[int]:
        """Token ids whose bytes spell exactly `text`, as a piece continuing other text (the forced
        text of a grammar): no BOS, special-token text as plain text, and no space prefix, which
        SentencePiece vocabularies otherwise give the start of a text (`{` would become `▁{`)."""
        return self._checked_encode(self._fragment(), text)

    def decode(self, ids: Sequence[int], *, skip_special: bool = False) -> str:
        """The text of `ids`; bad or incomplete UTF-8 becomes U+FFFD. skip_special drops control tokens."""
        data = b"".join(
            self._token_bytes[i] for i in self._checked(ids) if not (skip_special and i in self.control_ids)
        )
        text = data.decode("utf-8", errors="replace")
        if self.strip_leading_space and text.startswith(" "):
            text = text[1:]
        return text

    @staticmethod
    def _checked_encode(hf: HFTokenizer, text: str) -> list[int]:
        try:
            return hf.encode(text, add_special_tokens=False).ids
        except TypeError:
            # `tokenizers` refuses str with lone surrogates (JSON "\ud800", undecodable argv bytes).
            index = next((i for i, ch in enumerate(text) if "\ud800" <= ch <= "\udfff"), None)
            if index is None:
                raise
            raise ValueError(f"text is not valid Unicode: lone surrogate at character {index}") from None

    def token_id(self, text: str) -> int | None:
        """The id of the token spelled exactly `text` (a special token's text included), or None."""
        return self._hf.token_to_id(text)

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a token contributes to decoded text (a fragment of a character for byte tokens)."""
        return self._token_bytes[self._checked((token_id,))[0]]

    def token_text(self, token_id: int) -> str:
        """The token's own text (spaces as spaces); U+FFFD stands for bytes that are part of a character."""
        return self.token_bytes(token_id).decode("utf-8", errors="replace")  # not the whole table

    def token_texts(self) -> list[str]:
        """The text of every token, indexed by id (computed once; do not modify the list)."""
        return self._token_texts

    @cached_property
    def _token_texts(self) -> list[str]:
        return [b.decode("utf-8", errors="replace") for b in self._token_bytes]

    def _checked(self, ids: Sequence[int]) -> Sequence[int]:
        for i in ids:
            if not 0 <= i < self.vocab_size:
                raise ValueError(f"token id {i} is outside the vocabulary (size {self.vocab_size})")
        return ids


def _decoder_kinds(decoder: dict[str, Any] | None) -> set[str]:
    """The decoder types in a tokenizer.json `decoder` entry, looking inside `Sequence`s."""
    if not decoder:
        return set()
    kinds = {decoder.get("type", "")}
    for child in decoder.get("decoders", []) or []:
        kinds |= _decoder_kinds(child)
    return kinds


def _plain_copy(spec: str) -> HFTokenizer:
    """A tokenizer from its JSON that encodes special-token text as plain text."""
    plain = HFTokenizer.from_str(spec)
    plain.encode_special_tokens = True
    return plain


def _adds_space_prefix(hf: HFTokenizer) -> bool:
    """Whether the normalizer or the pre-tokenizer puts a space marker before the text."""
    for part in (hf.normalizer, hf.pre_tokenizer):
        spec = json.loads(part.__getstate__()) if part is not None else None
        if _without_space_prefix(spec) != spec:
            return True
    return False


def _without_space_prefix(component: dict[str, Any] | None) -> dict[str, Any] | None:
    """A normalizer or pre-tokenizer (tokenizer.json form) with the steps that prefix a space taken
    out: `Prepend` normalizers (as built for GGUF SentencePiece vocabularies, and Llama's
    tokenizer.json) and the prepending of `Metaspace` (older tokenizer.json files)."""
    if component is None:
        return None
    kind = component.get("type")
    if kind == "Prepend":
        return None
    if kind == "Metaspace":
        legacy = {"add_prefix_space": False} if "add_prefix_space" in component else {}
        return {**component, "prepend_scheme": "never", **legacy}
    if kind == "Sequence":
        key = "normalizers" if "normalizers" in component else "pretokenizers"
        steps = [step for c in component.get(key, []) if (step := _without_space_prefix(c)) is not None]
        return {**component, key: steps}
    return component
