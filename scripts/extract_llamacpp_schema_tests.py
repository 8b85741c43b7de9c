"""Extract the JSON-schema cases of llama.cpp's `tests/test-grammar-integration.cpp` into a data file.

Every `test_schema(description, schema, {passing...}, {failing...})` call of the file becomes one
entry of `tests/data/llamacpp_schema_cases.json`: `{"description", "schema", "pass", "fail"}`, the
schema parsed from its JSON text, the strings as C++ gives them (raw strings as they are, ordinary
string literals with their escapes resolved). `tests/test_grammar_llamacpp_schemas.py` matches them
through infer's schema path. The source is the `llama-cpp-python` sdist that scripts/llamacpp_build.py
keeps in its cache (downloaded there if missing):

    python scripts/extract_llamacpp_schema_tests.py [--version 0.3.36]
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tarfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import llamacpp_build

MEMBER = "vendor/llama.cpp/tests/test-grammar-integration.cpp"
OUTPUT = Path(__file__).resolve().parents[1] / "tests" / "data" / "llamacpp_schema_cases.json"

_TOKEN = re.compile(
    r'(?P<raw>R"(?P<delim>[^(]*)\((?P<body>.*?)\)(?P=delim)")'
    r'|(?P<str>"(?:[^"\\]|\\.)*")'
    r"|(?P<comment>//[^\n]*)"
    r"|(?P<punct>[{}(),;])"
    r"|(?P<space>\s+)",
    re.S,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "'": "'", "0": "\0"}


def _unescape(literal: str) -> str:
    """The value of an ordinary C++ string literal (the escapes the test file uses)."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES[m.group(1)], literal[1:-1])


def _tokens(text: str) -> list[str | tuple[str]]:
    """Strings as 1-tuples, punctuation as plain strings; comments and space dropped."""
    out: list[str | tuple[str]] = []
    position = 0
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None:
            raise ValueError(f"unexpected text at {position}: {text[position : position + 40]!r}")
        position = match.end()
        if match.group("raw") is not None:
            out.append((match.group("body"),))
        elif match.group("str") is not None:
            out.append((_unescape(match.group("str")),))
        elif match.group("punct") is not None:
            out.append(match.group("punct"))
    return out


def extract(source: str) -> list[dict]:
    """The test_schema cases of the C++ source, in file order."""
    cases = []
    for start in (m.end() for m in re.finditer(r"\btest_schema\(", source)):
        if source[start - len("void test_schema(") : start] == "void test_schema(":
            continue  # the definition, not a call
        end = source.index(");\n", start)
        tokens = _tokens(source[start:end])
        strings: list[list[str]] = [[]]
        depth = 0
        for token in tokens:
            if token == "{":
                depth += 1
                strings.append([])
            elif token == "}":
                depth -= 1
            elif isinstance(token, tuple):
                strings[-1].append(token[0])
        description, schema = strings[0]
        passing, failing = strings[1], strings[2]
        cases.append(
            {"description": description, "schema": json.loads(schema), "pass": passing, "fail": failing}
        )
    return cases


def main() -> None:
    """Write OUTPUT from the cached (or downloaded) sdist."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default="0.3.36")
    args = parser.parse_args()
    cache = llamacpp_build.default_cache_dir()
    sdist = llamacpp_build.find_sdist(cache, args.version) or llamacpp_build.download_sdist(
        cache, args.version, print
    )
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(f"llama_cpp_python-{args.version}/{MEMBER}")
        assert member is not None
        source = member.read().decode("utf-8")
    cases = extract(source)
    document = {
        "source": f"llama-cpp-python {args.version} sdist, {MEMBER} (MIT, see LICENSE.llama.cpp)",
        "cases": cases,
    }
    OUTPUT.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n")
    print(f"{len(cases)} schema cases -> {OUTPUT}")


if __name__ == "__main__":
    main()
