"""Make the chat-template oracle: every template in tests/data/templates rendered by transformers.

Each template (llama.cpp's `models/templates/*.jinja`, copied from the llama-cpp-python 0.3.36 sdist)
is rendered by Hugging Face transformers' own renderer, `apply_chat_template(conversation,
tools=..., tokenize=False, add_generation_prompt=True)`, for one system/user/assistant/user
conversation, twice: without tools and with tools (a list of JSON-schema function dicts, the form
transformers passes on to the template). A template that refuses the conversation (a system message,
tools, ...) records transformers' exception type and message instead of the text.

The tokenizer is a minimal one whose only special tokens are the BOS and EOS texts below, so the
template sees exactly `bos_token` and `eos_token` besides the conversation (what our engine passes).
`strftime_now` reads a fixed clock (`NOW`) so the oracle is reproducible; the test pins the same
clock on our side (`render_chat(..., now=...)`).

Run once, in a throwaway virtual environment (transformers is never a project dependency):

    python3 -m venv /tmp/oracle-venv
    /tmp/oracle-venv/bin/pip install "transformers==5.24.0" "jinja2==3.1.6" tokenizers
    /tmp/oracle-venv/bin/python scripts/chat_template_oracle.py tests/data/templates \
        tests/reference/chat_templates_transformers.json

Only the JSON output is committed. It stores each template's sha256 (not its text) and, per case,
`{"text": ...}` or `{"error": {"type", "message"}}`; the shared inputs are stored once at the top.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
from pathlib import Path
from typing import Any

NOW = datetime.datetime(2025, 3, 14, 15, 9, 26)
"""The clock `strftime_now` reads (on both sides)."""

BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"

MESSAGES: list[dict[str, Any]] = [
    {"role": "system", "content": "You are a helpful assistant. Answer briefly."},
    {"role": "user", "content": "What is the weather like in Paris today?"},
    {"role": "assistant", "content": "It is sunny in Paris, around 21 °C."},
    {"role": "user", "content": 'And in Zürich? Use "celsius" & <b>no</b> markup.'},
]
"""System, user, assistant, user: non-ASCII text, quotes and HTML characters (tojson must keep them)."""

TOOLS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Get the current weather in a city (°C or °F).",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "The city, e.g. Zürich"},
                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                },
                "required": ["city"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "get_time",
            "description": "The local time in a timezone.",
            "parameters": {
                "type": "object",
                "properties": {"timezone": {"type": "string"}},
                "required": ["timezone"],
            },
        },
    },
]
"""Two tools as transformers hands them to a template (JSON-schema function dicts)."""

CASES: dict[str, list[dict[str, Any]] | None] = {"plain": None, "tools": TOOLS}
"""Case name -> the `tools` argument."""


class _FixedClock(datetime.datetime):
    """`datetime` whose `now()` is NOW (transformers' `strftime_now` calls `datetime.now()`)."""

    @classmethod
    def now(cls, tz: Any = None) -> datetime.datetime:  # type: ignore[override]
        return NOW


def _tokenizer() -> Any:
    """A tokenizer whose only special tokens are BOS_TOKEN and EOS_TOKEN (templates need no vocabulary)."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from transformers import PreTrainedTokenizerFast

    vocab = {BOS_TOKEN: 0, EOS_TOKEN: 1, "[UNK]": 2}
    backend = Tokenizer(WordLevel(vocab, unk_token="[UNK]"))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, bos_token=BOS_TOKEN, eos_token=EOS_TOKEN)
    assert set(tokenizer.special_tokens_map) == {"bos_token", "eos_token"}, tokenizer.special_tokens_map
    return tokenizer


def render_case(tokenizer: Any, template: str, tools: list[dict[str, Any]] | None) -> dict[str, Any]:
    """Transformers' rendering of MESSAGES, or the exception it raised."""
    try:
        text = tokenizer.apply_chat_template(
            [dict(message) for message in MESSAGES],
            tools=tools,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=True,
        )
    except Exception as exc:  # the oracle records whatever transformers raised
        return {"error": {"type": type(exc).__name__, "message": str(exc)}}
    return {"text": text}


def main() -> None:
    """Render every `*.jinja` in the folder both ways and write the JSON."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("templates", type=Path, help="folder of *.jinja chat templates")
    parser.add_argument("output", type=Path, help="JSON file to write")
    args = parser.parse_args()

    import jinja2
    import transformers
    from transformers.utils import chat_template_utils

    chat_template_utils.datetime = _FixedClock  # type: ignore[attr-defined, misc]
    tokenizer = _tokenizer()
    templates: dict[str, Any] = {}
    for path in sorted(args.templates.glob("*.jinja")):
        source = path.read_text(encoding="utf-8")
        entry: dict[str, Any] = {"sha256": hashlib.sha256(source.encode("utf-8")).hexdigest()}
        for case, tools in CASES.items():
            entry[case] = render_case(tokenizer, source, tools)
        templates[path.name] = entry
        outcome = ", ".join(f"{case}: {'error' if 'error' in entry[case] else 'ok'}" for case in CASES)
        print(f"{path.name}: {outcome}")
    oracle = {
        "made_by": "scripts/chat_template_oracle.py",
        "transformers": transformers.__version__,
        "jinja2": jinja2.__version__,
        "call": "apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=True)",
        "now": NOW.isoformat(),
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "messages": MESSAGES,
        "cases": {case: {"tools": tools} for case, tools in CASES.items()},
        "templates": templates,
    }
    args.output.write_text(json.dumps(oracle, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    print(f"wrote {args.output} ({len(templates)} templates)")


if __name__ == "__main__":
    main()
