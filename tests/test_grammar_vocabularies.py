"""Structured output on every vocabulary type: byte-level BPE (the default model's), SentencePiece
that prefixes a space (llama.cpp's `llama-spm` and `phi-3` test vocabularies, tests/data/vocab) and
Gemma 3's SentencePiece, each on a tiny steered random model (tests/synthetic_vocab.py).

`json_object`, a JSON schema with nested objects and arrays, a choice and three of llama.cpp's GBNF
grammars (tests/data/grammars) must give valid output through the CLI and the server, checked here
without llguidance (json, jsonschema, regular expressions). Before the fix the space-prefix
vocabularies broke at the first forced token: llguidance was told `{` is the token `▁{`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import jsonschema
import pytest
from synthetic_vocab import write_vocab_model
from typer.testing import CliRunner

from infer.cli.main import app
from infer.cli.serve.launch import ServerProcess, start_server
from infer.engine.grammar import VocabularyMismatchError
from infer.engine.grammar import vocabulary as vocabulary_module
from infer.engine.loader.gguf import open_reader, read_metadata
from infer.engine.text.tokenizer import Tokenizer

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

DATA = Path(__file__).resolve().parent / "data"
GRAMMARS = DATA / "grammars"
SPACE_PREFIX_VOCABULARIES = ("llama-spm", "phi-3")

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "maxItems": 3},
        "owner": {
            "type": "object",
            "properties": {
                "id": {"type": "integer", "minimum": 0, "maximum": 99},
                "pets": {"type": "array", "items": {"enum": ["cat", "dog"]}, "minItems": 1, "maxItems": 2},
            },
            "required": ["id", "pets"],
            "additionalProperties": False,
        },
    },
    "required": ["name", "tags", "owner"],
    "additionalProperties": False,
}
CHOICES = ("yes", "no", "maybe so")

# The languages of list.gbnf and chess.gbnf, written out as regular expressions.
_LIST = re.compile(r"(- [^\r\n\x0b\x0c\x85\u2028\u2029]+\n)+")
_MOVE = r"(?:(?:[a-h]x)?[a-h][1-8](?:=[NBKQR])?|[NBKQR][a-h]?[1-8]?x?[a-h][1-8]|O-O(?:-O)?)[+#]?"
_CHESS = re.compile(rf"1\. {_MOVE} {_MOVE}\n(?:[1-9][0-9]?\. {_MOVE} {_MOVE}\n)+")


def _json_object(text: str) -> bool:
    return isinstance(json.loads(text), dict)


def _schema(text: str) -> bool:
    jsonschema.validate(json.loads(text), SCHEMA)
    return True


CHECKS: dict[str, Callable[[str], object]] = {
    "json_object": _json_object,
    "json_schema": _schema,
    "choice": lambda text: text in CHOICES,
    "json.gbnf": _json_object,  # its root is an object
    "list.gbnf": _LIST.fullmatch,
    "chess.gbnf": _CHESS.fullmatch,
}


def _gemma3_source(request: pytest.FixtureRequest) -> Path:
    return Path(request.getfixturevalue("gemma3_model_path"))


SOURCES: dict[str, Callable[[pytest.FixtureRequest], Path]] = {
    "bpe": lambda request: Path(request.getfixturevalue("default_model_path")),
    "llama-spm": lambda request: DATA / "vocab" / "ggml-vocab-llama-spm.gguf",
    "phi-3": lambda request: DATA / "vocab" / "ggml-vocab-phi-3.gguf",
    "gemma3": _gemma3_source,
}
VOCABULARIES = [  # the fast suite serves llama-spm (the case that broke); the rest run with -m slow
    pytest.param("bpe", marks=[pytest.mark.real_model, pytest.mark.slow]),
    "llama-spm",
    pytest.param("phi-3", marks=pytest.mark.slow),
    pytest.param("gemma3", marks=[pytest.mark.real_model, pytest.mark.slow]),  # 262k tokens: ~10 s a load
]


@pytest.fixture(scope="module", params=VOCABULARIES)
def vocab_model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The steered tiny model with the vocabulary named by the parameter: its GGUF."""
    source = SOURCES[request.param](request)
    return write_vocab_model(tmp_path_factory.mktemp(f"vocab-{request.param}"), source)


# ---- the tokenize callback ----------------------------------------------------------------------


@pytest.fixture(scope="module", params=SPACE_PREFIX_VOCABULARIES)
def spm_tokenizer(request: pytest.FixtureRequest) -> Tokenizer:
    path = DATA / "vocab" / f"ggml-vocab-{request.param}.gguf"
    return Tokenizer.from_gguf_metadata(read_metadata(open_reader(path)))


@pytest.mark.parametrize("text", ["{", " {", '{"a": [1, 2]}', "  two", "\n- x\n", "1. e4 e5", "é日本"])
def test_a_fragment_spells_exactly_its_text_and_encode_keeps_the_prefix(
    spm_tokenizer: Tokenizer, text: str
) -> None:
    ids = spm_tokenizer.encode_fragment(text)
    assert b"".join(spm_tokenizer.token_bytes(i) for i in ids) == text.encode()
    prompt = spm_tokenizer.encode(text, add_bos=False)
    assert b"".join(spm_tokenizer.token_bytes(i) for i in prompt) == b" " + text.encode()


def test_the_grammar_tokenizer_forces_text_without_the_space(spm_tokenizer: Tokenizer) -> None:
    lltok = vocabulary_module.build_lltokenizer(spm_tokenizer, spm_tokenizer.vocab_size)
    for text in ("{", '{"', "1. ", "- "):
        assert lltok.decode_bytes(lltok.tokenize_str(text)) == text.encode()


def test_a_callback_that_adds_the_space_falls_back_to_exact_tokens(
    spm_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def with_prefix(self: Tokenizer, text: str) -> list[int]:  # the bug: `{` encoded as `▁{`
        return self.encode(text, parse_special=False, add_bos=False)

    monkeypatch.setattr(Tokenizer, "encode_fragment", with_prefix)
    lltok = vocabulary_module.build_lltokenizer(spm_tokenizer, spm_tokenizer.vocab_size)
    assert lltok.decode_bytes(lltok.tokenize_str('{"a"')) == b'{"a"'


def test_a_callback_that_spells_other_bytes_is_refused_when_verified(
    spm_tokenizer: Tokenizer, monkeypatch: pytest.MonkeyPatch
) -> None:
    def wrong(self: vocabulary_module._Encoder, text: str) -> list[int]:
        if not isinstance(text, str):
            raise TypeError("text only")
        return spm_tokenizer.encode(text, parse_special=False, add_bos=False)  # no fallback

    monkeypatch.setattr(vocabulary_module._Encoder, "__call__", wrong)
    with pytest.raises(VocabularyMismatchError, match=r"spells '\{' as b' \{'"):
        vocabulary_module.build_lltokenizer(spm_tokenizer, spm_tokenizer.vocab_size)


# ---- the CLI ------------------------------------------------------------------------------------


def _cli_flags(constraint: str, tmp_path: Path) -> list[str]:
    if constraint == "json_object":
        return ["--json-object"]
    if constraint == "json_schema":
        path = tmp_path / "schema.json"
        path.write_text(json.dumps(SCHEMA))
        return ["--json-schema", str(path)]
    if constraint == "choice":
        return ["--choice", ",".join(CHOICES)]
    return ["--grammar", str(GRAMMARS / constraint)]


@pytest.mark.parametrize(
    "vocab_model",
    [
        pytest.param("bpe", marks=[pytest.mark.real_model, pytest.mark.slow]),
        "llama-spm",  # the fast suite's CLI runs: one vocabulary (the server covers three)
        pytest.param("phi-3", marks=pytest.mark.slow),
        pytest.param("gemma3", marks=[pytest.mark.real_model, pytest.mark.slow]),
    ],
    indirect=True,
)
@pytest.mark.parametrize("constraint", list(CHECKS))
def test_cli_output_is_valid(vocab_model: Path, constraint: str, tmp_path: Path) -> None:
    args = ["generate", "-m", str(vocab_model), "-t", "1", "-n", "200", "--temp", "0", "--raw", "--json"]
    result = CliRunner().invoke(
        app, [*args, *_cli_flags(constraint, tmp_path), "hello"], env={"INFER_PROFILE": None}
    )
    assert result.exit_code == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["finish_reason"] == "stop", reply
    assert CHECKS[constraint](reply["text"]), reply["text"]


# ---- the server ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def vocab_server(vocab_model: Path) -> Iterator[httpx.Client]:
    """`infer serve` on the model with a choice as its own constraint (requests may bring theirs)."""
    process: ServerProcess = start_server(
        ["-m", str(vocab_model), "-c", "512", "--seed", "3", "--choice", ",".join(CHOICES)]
    )
    with httpx.Client(base_url=process.url, timeout=120) as client:
        yield client
    assert process.stop() == 0, process.stderr
    assert "Traceback" not in process.stderr, process.stderr


def _server_text(client: httpx.Client, constraint: str) -> str:
    common = {"max_tokens": 200, "temperature": 0}
    if constraint in ("json_object", "json_schema"):
        response_format: dict = {"type": "json_object"}
        if constraint == "json_schema":
            response_format = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA}}
        messages = [{"role": "user", "content": "hello"}]
        body = {"messages": messages, "response_format": response_format, **common}
        reply = client.post("/v1/chat/completions", json=body)
        assert reply.status_code == 200, reply.text
        choice = reply.json()["choices"][0]
        assert choice["finish_reason"] == "stop", choice
        return str(choice["message"]["content"])
    body = {"prompt": "hello", **common}
    if constraint != "choice":  # the server's own --choice otherwise
        body["grammar"] = (GRAMMARS / constraint).read_text()
    reply = client.post("/v1/completions", json=body)
    assert reply.status_code == 200, reply.text
    choice = reply.json()["choices"][0]
    assert choice["finish_reason"] == "stop", choice
    return str(choice["text"])


@pytest.mark.parametrize("constraint", list(CHECKS))
def test_server_output_is_valid(vocab_server: httpx.Client, constraint: str) -> None:
    text = _server_text(vocab_server, constraint)
    assert CHECKS[constraint](text), text
