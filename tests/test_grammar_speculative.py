"""Constraints with speculative decoding (prompt lookup): drafts cut to the grammar before they are
scheduled, each verify row masked by the state after the drafts before it, the matcher rolled back
with the kept tokens; the same tokens as without speculation.

Skipped until the speculative-decoding branch (`infer.engine.speculative`) is merged; it passed on a
trial merge of the two branches."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.engine.grammar import GrammarSpec, audit_tokens
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

SpecConfig = pytest.importorskip("infer.engine.speculative").SpecConfig
pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

SPECS = {
    "regex": GrammarSpec("regex", r"(the|sea|is)( (the|sea|is)){3,12}"),
    "choice": GrammarSpec("choice", choices=("the sea is the sea", "is the sea")),
    "json": GrammarSpec.json_schema(
        {
            "type": "object",
            "properties": {"w": {"type": "array", "items": {"enum": ["the", "sea", "is"]}, "maxItems": 6}},
            "required": ["w"],
            "additionalProperties": False,
        }
    ),
}


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Engine:
    return load_engine(
        tiny_gguf, EngineConfig(ctx_size=160, max_num_seqs=4, max_batched_tokens=64, batch_size=8)
    )


@pytest.mark.parametrize("kind", list(SPECS))
@pytest.mark.parametrize(
    "params",
    [SamplingParams(temperature=0.0), SamplingParams(temperature=1.0, seed=9)],
    ids=["greedy", "sampled"],
)
def test_prompt_lookup_with_a_grammar_gives_the_tokens_of_plain_decoding(
    engine: Engine, kind: str, params: SamplingParams
) -> None:
    spec = SPECS[kind]
    prompt = tuple(
        engine.tokenizer.encode('the sea is the sea is {"w": ["the", "sea", "is", "the sea is', add_bos=False)
    )
    plain = engine.generate(Request(prompt, params, max_tokens=64, grammar=spec))
    fast = engine.generate(
        Request(prompt, params, max_tokens=64, grammar=spec, spec=SpecConfig("prompt_lookup", num_tokens=4))
    )
    assert fast.token_ids == plain.token_ids
    assert fast.done.finish_reason == plain.done.finish_reason
    assert audit_tokens(spec, engine.grammar_vocabulary, fast.token_ids) is None
    assert fast.done.counters.get("draft_tokens", 0) > 0 or kind == "choice", fast.done.counters
    if kind == "json" and fast.done.finish_reason == "stop":
        json.loads(fast.done.text)
