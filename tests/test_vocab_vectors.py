"""Our tokenizer against llama.cpp's own tokenizer test vectors (tests/test-tokenizer-0.cpp): every case of
every causal-LM vocabulary in `vendor/llama.cpp/models/` of the llama-cpp-python 0.3.36 sdist.

Each case is tokenized as that test does: no BOS (`add_special=false`) and special-token text as plain
text (`parse_special=false`), and must give exactly llama.cpp's ids. The files come from the sdist at
test time (tests/llamacpp_vocabs.py: the build cache, else a pip download of ~75 MB, once); when they
cannot be had the tests fail, unless INFER_OFFLINE_VOCAB=1 says to skip them.

Vocabularies left out: `bert-bge` and `nomic-bert-moe` are BERT encoders (WordPiece and an
XLM-RoBERTa Unigram model, `tokenizer.ggml.model` `bert`/`t5`) for embeddings, which this engine does
not run; `aquila`, `baichuan`, `gpt-neox` and `nomic-bert-moe` ship no `.inp`/`.out` cases.
"""

from __future__ import annotations

import io
import json
import tarfile
from collections.abc import Iterator
from pathlib import Path

import llamacpp_vocabs
import pytest
from llamacpp_vocabs import VocabCase, VocabsUnavailable, models_dir, offline, read_cases

from infer.engine.loader.gguf import open_reader, read_metadata
from infer.engine.text.tokenizer import Tokenizer, _end_of_generation

CAUSAL_VOCABULARIES = (
    "command-r",
    "deepseek-coder",
    "deepseek-llm",
    "falcon",
    "gemma-4",
    "gpt-2",
    "llama-bpe",
    "llama-spm",
    "mpt",
    "phi-3",
    "qwen2",
    "qwen35",
    "refact",
    "starcoder",
)
"""The sdist's vocabularies with cases, less the BERT ones (see the module docstring)."""
WITHOUT_CASES = ("aquila", "baichuan", "gpt-neox", "nomic-bert-moe")
EXTRA_CASES = Path(__file__).resolve().parent / "data" / "vocab" / "llamacpp_extra_cases.json"
"""Cases of our own on the same vocabularies, with llama.cpp's ids (tests/data/README.md): the
shipped ones cannot tell qwen35 from qwen2 or deepseek-llm from deepseek-coder."""


@pytest.fixture(scope="module")
def models() -> Path:
    """The sdist's models folder, fetched on first use; a clear failure when it cannot be."""
    try:
        return models_dir(download=not offline())
    except VocabsUnavailable as exc:
        reason = str(exc)
    # Outside the `except`, so that the report is the one message, not a chain of tracebacks.
    if offline():
        pytest.skip(f"{llamacpp_vocabs.OFFLINE_ENV} is set and {reason}")
    pytest.fail(reason, pytrace=False)


def _tokenizer(models: Path, name: str) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(read_metadata(open_reader(models / f"ggml-vocab-{name}.gguf")))


def _mismatches(tokenizer: Tokenizer, cases: list[VocabCase]) -> Iterator[str]:
    for case in cases:
        got = tokenizer.encode(case.text, parse_special=False, add_bos=False)
        if tuple(got) != case.ids:
            yield f"{case.text[:60]!r}: llama.cpp {list(case.ids)[:16]}, ours {got[:16]}"


def test_the_sdist_holds_the_vocabularies_we_test(models: Path) -> None:
    """A vocabulary added to (or missing from) the folder is a decision to make, not a silent pass."""
    with_cases = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf.inp") for p in models.glob("*.inp")}
    every = {p.name.removeprefix("ggml-vocab-").removesuffix(".gguf") for p in models.glob("*.gguf")}
    assert with_cases == set(CAUSAL_VOCABULARIES) | {"bert-bge"}
    assert every == with_cases | set(WITHOUT_CASES)


@pytest.mark.parametrize("name", CAUSAL_VOCABULARIES)
def test_every_case_matches_llamacpp(models: Path, name: str) -> None:
    cases = read_cases(models / f"ggml-vocab-{name}.gguf")
    assert cases, f"{name}: no cases"
    failed = list(_mismatches(_tokenizer(models, name), cases))
    passed = len(cases) - len(failed)
    assert not failed, f"{name}: {passed}/{len(cases)} cases match llama.cpp; first failures:\n" + "\n".join(
        failed[:5]
    )


# ---- what the vectors do not tell apart ------------------------------------------------------------


def _extra_cases() -> dict[str, list[VocabCase]]:
    spec = json.loads(EXTRA_CASES.read_text(encoding="utf-8"))
    return {name: [VocabCase(c["text"], tuple(c["ids"])) for c in cases] for name, cases in spec.items()}


@pytest.mark.parametrize(("name", "cases"), sorted(_extra_cases().items()))
def test_our_cases_match_llamacpp(models: Path, name: str, cases: list[VocabCase]) -> None:
    """Combining marks (qwen35 keeps them in words, qwen2 does not), DeepSeek LLM's own letter and
    punctuation classes and trailing spaces, ideographic spaces, Gemma 4's newline runs and
    end-of-generation tokens, all tokenized by llama.cpp's test-tokenizer-0."""
    failed = list(_mismatches(_tokenizer(models, name), cases))
    assert not failed, f"{name}: {len(cases) - len(failed)}/{len(cases)} match:\n" + "\n".join(failed[:5])


def test_gemma4_newline_runs_bos_and_end_of_generation(models: Path) -> None:
    """llama.cpp encodes a run of newlines that is a token as that token (runs of up to 31 are), adds
    BOS to Gemma 4 prompts whatever the metadata says, and makes <|tool_response> (user-defined in
    the file) an end-of-generation control token, and </s> a normal one."""
    gemma4 = _tokenizer(models, "gemma-4")
    for run in range(1, 32):
        assert gemma4.encode("\n" * run, add_bos=False) == [gemma4.token_id("\n" * run)], run
    assert gemma4.add_bos and gemma4.encode("hi")[0] == gemma4.bos_id == 2
    tool_response, turn_end, s_end = (gemma4.token_id(t) for t in ("<|tool_response>", "<turn|>", "</s>"))
    assert {tool_response, turn_end} <= gemma4.stop_ids & gemma4.control_ids
    assert s_end not in gemma4.stop_ids | gemma4.special_ids
    assert gemma4.encode("<|tool_response>", add_bos=False) == [tool_response]
    text = "  Hello\n\n\tworld ü 🦙 <0x41>"
    assert gemma4.decode(gemma4.encode(text, add_bos=False)) == text


@pytest.mark.parametrize(
    ("tokens", "stops", "types"),
    [
        # Any type becomes a stopping control token (Gemma 3's user-defined </s>, Qwen 2's normal one).
        (["a", "</s>", "<|im_end|>", "[EOS]"], {1, 2, 3}, [1, 3, 3, 3]),
        # gpt-oss: <|end|> closes a message, not the generation, and stays text.
        (["<|return|>", "<|call|>", "<|end|>"], {0, 1}, [3, 3, 4]),
        (["<|calls|>", "<|flush|>", "<|end|>"], {0, 1}, [3, 3, 4]),
        (["<|endoftext|>", "<|end|>"], {0, 1}, [3, 3]),  # Phi-3: <|end|> ends the turn
        # Gemma 4's </s> is an ordinary token.
        (["</s>", "<|tool_response>"], {1}, [1, 3]),
    ],
)
def test_end_of_generation_fix_ups_are_llamacpps(
    tokens: list[str], stops: set[int], types: list[int]
) -> None:
    assert _end_of_generation(tokens, [1, 4, 4, 1][: len(tokens)], frozenset()) == (types, stops)


def test_plamo_eos_named_by_the_metadata_makes_s_ordinary() -> None:
    assert _end_of_generation(["<|plamo:eos|>", "</s>"], [3, 3], frozenset({0})) == ([3, 1], frozenset())


# ---- fetching the vectors ----------------------------------------------------------------------------


def _fake_sdist(cache: Path) -> None:
    """A stand-in sdist in `cache/sdist`: one vocabulary's three files and a file not to extract."""
    root = f"llama_cpp_python-{llamacpp_vocabs.SDIST_VERSION}"
    vocab = f"{root}/vendor/llama.cpp/models/ggml-vocab-x.gguf"
    files = {
        vocab: b"GGUF",
        f"{vocab}.inp": b"a\n__ggml_vocab_test__\n\n__ggml_vocab_test__\nb b\n__ggml_vocab_test__\n",
        f"{vocab}.out": b" 1 2\n\n3  4\n",
        f"{root}/vendor/llama.cpp/CMakeLists.txt": b"",
    }
    (cache / "sdist").mkdir(parents=True)
    with tarfile.open(cache / "sdist" / f"{root}.tar.gz", "w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))


def test_only_the_vocab_files_are_extracted_from_a_cached_sdist(tmp_path: Path) -> None:
    _fake_sdist(tmp_path)
    models = models_dir(tmp_path)
    assert sorted(p.name for p in models.iterdir()) == [
        ".infer-vocab-vectors", "ggml-vocab-x.gguf", "ggml-vocab-x.gguf.inp", "ggml-vocab-x.gguf.out",
    ]  # fmt: skip
    assert not (models.parent / "CMakeLists.txt").exists()
    assert read_cases(models / "ggml-vocab-x.gguf") == [
        VocabCase("a", (1, 2)), VocabCase("", ()), VocabCase("b b", (3, 4)),
    ]  # fmt: skip
    assert models_dir(tmp_path) == models  # the second call finds the stamp


def test_no_sdist_and_no_download_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(cache: Path, version: str | None, log: object) -> Path:
        raise llamacpp_vocabs.lb.BuildError("pip download llama-cpp-python==0.3.36 failed: no network")

    monkeypatch.setattr(llamacpp_vocabs.lb, "download_sdist", refuse)
    with pytest.raises(VocabsUnavailable, match=r"no network.*INFER_OFFLINE_VOCAB=1"):
        models_dir(tmp_path)
