"""llama.cpp's tokenizer test vectors: `ggml-vocab-*.gguf` vocabularies (no tensors) with `.gguf.inp` /
`.gguf.out` cases, from `vendor/llama.cpp/models/` of the llama-cpp-python sdist on PyPI.

The files are ~80 MB, too big for the repository, so they are taken from the sdist at test time: the
extraction in the llama.cpp build cache (`scripts/llamacpp_build.py`'s `default_cache_dir()`, shared
with the peer benchmark) when it is there, else the cached sdist, else one downloaded with pip; only
the `ggml-vocab-*` members are extracted.
"""

from __future__ import annotations

import os
import shutil
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import llamacpp_build as lb

SDIST_VERSION = "0.3.36"
OFFLINE_ENV = "INFER_OFFLINE_VOCAB"
"""Set to 1 where PyPI cannot be reached: the vector tests then skip instead of failing."""

_MODELS = Path("vendor") / "llama.cpp" / "models"
_PREFIX = "ggml-vocab-"
_STAMP = ".infer-vocab-vectors"
"""Written beside the files once they are all extracted, so that an interrupted extraction is redone."""
_SEPARATOR = "\n__ggml_vocab_test__\n"
"""The line between two cases of a `.inp` file (llama.cpp's tests/test-tokenizer-0.cpp)."""


class VocabsUnavailable(RuntimeError):
    """The sdist could be neither found in the cache nor downloaded; the message says what was tried."""


@dataclass(frozen=True)
class VocabCase:
    """One input text and the ids llama.cpp tokenizes it to (no BOS, special-token text as text)."""

    text: str
    ids: tuple[int, ...]


def offline() -> bool:
    """Whether the environment says the vectors cannot be fetched (`INFER_OFFLINE_VOCAB=1`)."""
    return os.environ.get(OFFLINE_ENV, "") not in ("", "0")


def models_dir(cache: Path | None = None, download: bool = True) -> Path:
    """The folder holding the `ggml-vocab-*` files, extracting them (and downloading the sdist, unless
    `download` is false) once.

    Raises VocabsUnavailable when neither the cache nor pip can provide them.
    """
    cache = lb.default_cache_dir() if cache is None else cache
    src = cache / "src"
    llama_cpp = src / f"llama_cpp_python-{SDIST_VERSION}" / "vendor" / "llama.cpp"
    models = llama_cpp / "models"
    # A full extraction by llamacpp_build (CMakeLists.txt there) or one of ours that finished.
    if (models / _STAMP).is_file() or (
        (llama_cpp / "CMakeLists.txt").is_file() and any(models.glob(f"{_PREFIX}*.gguf.inp"))
    ):
        return models
    sdist = lb.find_sdist(cache, SDIST_VERSION)
    if sdist is None and not download:
        raise VocabsUnavailable(f"no llama-cpp-python {SDIST_VERSION} sdist in {cache / 'sdist'}")
    if sdist is None:
        try:
            sdist = lb.download_sdist(cache, SDIST_VERSION, log=lambda _line: None)
        except (lb.BuildError, OSError) as exc:
            raise VocabsUnavailable(
                f"llama.cpp's tokenizer vectors need the llama-cpp-python {SDIST_VERSION} sdist: none in "
                f"{cache / 'sdist'} and {exc}. Run with network access to PyPI once, or set "
                f"{OFFLINE_ENV}=1 to skip these tests."
            ) from exc
    _extract_vocabs(sdist, models)
    return models


def _extract_vocabs(sdist: Path, models: Path) -> None:
    """Extract the sdist's `models/ggml-vocab-*` files into `models`, then write the stamp."""
    models.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=models.parent) as tmp, tarfile.open(sdist) as tar:
        wanted = [
            m
            for m in tar.getmembers()
            if m.isfile()
            and Path(m.name).parent.parts[1:] == _MODELS.parts
            and Path(m.name).name.startswith(_PREFIX)
        ]
        if not wanted:
            raise VocabsUnavailable(f"{sdist} has no {_MODELS}/{_PREFIX}* files")
        tar.extractall(tmp, members=wanted, filter="data")
        for member in wanted:
            # Each file is moved in whole, so a reader never sees a half-written one.
            shutil.move(Path(tmp) / member.name, models / Path(member.name).name)
    (models / _STAMP).write_text(f"{sdist.name}\n", encoding="utf-8")


def read_cases(vocab: Path) -> list[VocabCase]:
    """The cases of `vocab` (a `.gguf` path) from its `.inp` and `.out` files, read as llama.cpp's
    test-tokenizer-0 does: inputs split at the separator line (no case after a trailing one), one
    output line of space-separated ids per input, and a repeated input counted once (its last ids)."""
    raw = vocab.with_name(vocab.name + ".inp").read_bytes().decode("utf-8")
    texts = raw.split(_SEPARATOR)
    if texts and texts[-1] == "":
        texts.pop()
    lines = vocab.with_name(vocab.name + ".out").read_bytes().decode("utf-8").split("\n")
    if lines and lines[-1] == "":
        lines.pop()
    if len(texts) != len(lines):
        raise ValueError(f"{vocab.name}: {len(texts)} inputs but {len(lines)} output lines")
    by_text = {text: tuple(int(t) for t in line.split()) for text, line in zip(texts, lines, strict=True)}
    return [VocabCase(text, ids) for text, ids in by_text.items()]
