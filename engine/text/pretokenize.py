"""llama.cpp's pre-tokenization of GGUF BPE vocabularies, keyed by `tokenizer.ggml.pre`, as `tokenizers`
pre-tokenizers.

Each vocabulary's regexes are those of llama.cpp's `llama-vocab.cpp`, applied in order: each one splits
every piece the previous ones produced into its matches and the text between them. They must match
llama.cpp's, not the model's original tokenizer.json, because our reference outputs are llama.cpp's.

llama.cpp runs a regex without `\\p{..}` classes through `std::wregex` after replacing every non-ASCII
whitespace character by a vertical tab, so such a character matches `\\s` there but never a class of
literal characters. The literal classes below leave whitespace out (`&&\\S`) to behave the same way
(U+3000, the ideographic space, sits inside the CJK and full-width ranges).
"""

from __future__ import annotations

from tokenizers import Regex, pre_tokenizers

__all__ = [
    "ADD_BOS_BY_DEFAULT",
    "GEMMA4_SPLIT",
    "IGNORE_MERGES",
    "is_supported",
    "pre_tokenizer",
]


def _char_class(ranges: str) -> str:
    """A regex class of the code points in `ranges` ("41-5A B5 ..." in hex), whitespace left out."""
    items = []
    for item in ranges.split():
        first, _, last = item.partition("-")
        items.append(f"\\x{{{first}}}" + (f"-\\x{{{last}}}" if last else ""))
    return f"[{''.join(items)}&&\\S]"


_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)"
_LLAMA3 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen 3.5: Qwen 2's, with combining marks (\p{M}) kept in words instead of punctuation runs.
_QWEN35 = (
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_STARCODER = (r"\p{N}", _GPT2)
_BLOOM = (r" ?[^(\s|.,!?…。，、।۔،)]+",)
# Han (U+4E00-9FA5), everything from Samaritan to Han (U+0800-4E00) and Hangul (U+AC00-D7FF).
_CJK = _char_class("4E00-9FA5 800-4E00 AC00-D7FF") + "+"
# DeepSeek LLM's letters: an explicit list of cased-letter ranges (Latin, Greek, Cyrillic, Armenian
# capitals, Georgian, Cherokee, Glagolitic, Coptic, full-width Latin, Deseret...), not \p{L}.
_DEEPSEEK_LLM_LETTERS = _char_class(
    "41-5A 61-7A B5 C0-D6 D8-F6 F8-1BA 1BC-1BF 1C4-293 295-2AF 370-373 376 377 37B-37D 37F 386 388-38A"
    " 38C 38E-3A1 3A3-3F5 3F7-481 48A-52F 531-556 10A0-10C5 13A0-13F5 13F8-13FD 1C90-1CBA 1CBD-1CBF"
    " 1D00-1D2B 1D6B-1D77 1D79-1D9A 1E00-1F15 1F18-1F1D 1F20-1F45 1F48-1F4D 1F50-1F57 1F59 1F5B 1F5D"
    " 1F5F-1F7D 1F80-1FB4 1FB6-1FBC 1FBE 1FC2-1FC4 1FC6-1FCC 1FD0-1FD3 1FD6-1FDB 1FE0-1FEC 1FF2-1FF4"
    " 1FF6-1FFC 2102 2107 210A-2113 2115 2119-211D 2124 2126 2128 212A-212D 212F-2134 2139 213C-213F"
    " 2145-2149 214E 2183 2184 2C00-2C7B 2C7E-2CE4 2CEB-2CEE 2CF2 2CF3 A640-A66D A680-A69B A722-A76F"
    " A771-A787 A78B-A78E AB70-ABBF FB00-FB06 FB13-FB17 FF21-FF3A FF41-FF5A 10400-1044F 104B0-104D3"
    " 104D8-104FB 10C80-10CB2 10CC0-10CF2 118A0-118DF 1E900-1E943"
)
# ... and its punctuation: printable ASCII other than digits, full-width forms, curly quotes, 、。
_DEEPSEEK_LLM_PUNCTUATION = _char_class("21-2F 3A-7E FF01-FF0F FF1A-FF5E 2018-201F 3000-3002")

_REGEXES: dict[str, tuple[str, ...]] = {
    "default": (r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"),
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "dbrx", "smaug-bpe"), (_LLAMA3,)
    ),
    **dict.fromkeys(("glm4", "chatglm-bpe"), (_LLAMA3,)),
    **dict.fromkeys(("gpt-2", "phi-2", "mpt", "olmo", "jais", "exaone4", "roberta-bpe"), (_GPT2,)),
    **dict.fromkeys(
        ("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"), _STARCODER
    ),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "stablelm2", "megrez"), (_QWEN2,)),
    "qwen35": (_QWEN35,),
    "falcon": (r"[\p{P}\$\+<=>\^~\|`]+", _GPT2, r"[0-9][0-9][0-9]"),
    "deepseek-coder": (r"[\r\n]", r"\s?\p{L}+", r"\s?\p{P}+", _CJK, r"\p{N}"),
    # `\s+$` in llama.cpp ends at the end of each piece; `\z` says so (no piece holds a newline
    # but the lone ones the first regex isolates).
    "deepseek-llm": (
        r"[\r\n]",
        rf"\s?{_DEEPSEEK_LLM_LETTERS}+",
        rf"\s?{_DEEPSEEK_LLM_PUNCTUATION}+",
        r"\s+\z",
        _CJK,
        r"\p{N}+",
    ),
    **dict.fromkeys(("poro-chat", "bloom", "gpt3-finnish"), _BLOOM),
    "viking": (*_BLOOM, r"\p{N}"),
}

GEMMA4_SPLIT = r"[^\n]+|\n+"
"""Gemma 4's only split (its tokenizer model `gemma4`: BPE over SentencePiece-style text, spaces as
"▁"): newline runs apart from the rest, so that merges never cross a newline."""

IGNORE_MERGES = frozenset({"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken"})
"""llama.cpp looks a whole pre-tokenized word up in the vocabulary before merging for these."""

ADD_BOS_BY_DEFAULT = frozenset(
    {"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral", "tekken", "chameleon"}
)
"""llama.cpp adds BOS for these when the metadata does not say."""


def is_supported(pre: str) -> bool:
    """Whether `pre` (a `tokenizer.ggml.pre` value) names a pre-tokenizer we reproduce."""
    return pre in _REGEXES


def pre_tokenizer(pre: str) -> pre_tokenizers.PreTokenizer:
    """The byte-level BPE pre-tokenizer for `pre`: its regex splits, then GPT-2's byte alphabet."""
    splits = [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in _REGEXES[pre]]
    return pre_tokenizers.Sequence(
        [*splits, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
    )
