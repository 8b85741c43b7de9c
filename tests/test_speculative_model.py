"""Speculative decoding on the default model: the same tokens as plain decoding with prompt lookup
and with a draft model (the model drafting for itself: the only compatible one at hand), alone and 8
at a time, greedy and seeded; and gate anchors that pin speculation counters fail when one is edited.
The synthetic-model matrix is in tests/test_speculative.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_process import infer_cli

from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.events import DoneEvent
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams
from infer.engine.speculative import SpecConfig

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

N_TOKENS = 16
PROMPTS = (
    "List the colours red, green, blue, red, green, blue, red,",
    "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef mul(a, b):\n",
    "Once upon a time",
    "The capital of France is",
    "Copy exactly: the quick brown fox jumps over the lazy dog. Copy: the quick",
    "1, 2, 3, 4, 5, 6,",
    "Hello! How are you today?",
    "A haiku about the sea:",
)
SAMPLERS = {"greedy": SamplingParams(temperature=0.0), "t1.3": SamplingParams(temperature=1.3, seed=3)}
SPECS = {
    "lookup-2": SpecConfig("prompt_lookup", num_tokens=2),
    "lookup-8": SpecConfig("prompt_lookup", num_tokens=8, ngram_max=4),
    "draft": SpecConfig("draft_model", num_tokens=4, p_min=0.5),
}


@pytest.fixture(scope="module")
def engine(default_model_path: Path) -> Engine:
    cfg = EngineConfig(ctx_size=256, max_num_seqs=8, max_batched_tokens=512, batch_size=64)
    return load_engine(default_model_path, cfg, cpu_kernels="exact", draft_model=default_model_path)


def requests(engine: Engine, params: SamplingParams, spec: SpecConfig | None) -> list[Request]:
    return [
        Request(tuple(engine.tokenizer.encode(p)), params, max_tokens=N_TOKENS, ignore_eos=True, spec=spec)
        for p in PROMPTS
    ]


def run_all(engine: Engine, batch: list[Request]) -> list[DoneEvent]:
    streams = [engine.submit(r) for r in batch]
    while engine.step():
        pass
    return [s.result().done for s in streams]


@pytest.mark.parametrize("sampler", list(SAMPLERS))
def test_default_model_speculation_gives_the_tokens_of_plain_decoding(engine: Engine, sampler: str) -> None:
    params = SAMPLERS[sampler]
    plain = [d.token_ids for d in run_all(engine, requests(engine, params, None))]
    for name, spec in SPECS.items():
        batched = run_all(engine, requests(engine, params, spec))
        assert [d.token_ids for d in batched] == plain, name
        alone = engine.generate(requests(engine, params, spec)[0]).done
        assert alone.token_ids == plain[0], name
        assert alone.counters == batched[0].counters, name
        if sampler == "greedy":
            assert sum(d.counters["accepted_tokens"] for d in batched) > 0, name


GATE_FILE = """\
version: 1
defaults:
  profile: cpu
  n_predict: 16
anchors:
  - name: copy
    prompt: "red, green, blue, red, green, blue, red, green,"
    sampler: {temperature: 0}
  - name: seeded
    prompt: "1, 2, 3, 4, 5,"
    sampler: {temperature: 0.8, seed: 5}
"""


def test_gate_pins_speculation_counters(tmp_path: Path) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(GATE_FILE)
    plain = infer_cli("gate", str(path), "--bless")
    assert plain.returncode == 0, plain.stderr
    hashes = [a["expect"]["sha256"] for a in yaml.safe_load(path.read_text())["anchors"]]

    blessed = infer_cli("gate", str(path), "--profile", "cpu-fast", "--bless")
    assert blessed.returncode == 0, blessed.stderr
    data = yaml.safe_load(path.read_text())
    assert [a["expect"]["sha256"] for a in data["anchors"]] == hashes, "speculation changed the tokens"
    counters = data["anchors"][0]["expect"]["counters"]
    assert counters["drafts"] > 0 and counters["accepted_tokens"] > 0

    again = infer_cli("gate", str(path), "--profile", "cpu-fast", "--json")
    assert again.returncode == 0, again.stderr

    data["anchors"][0]["expect"]["counters"]["accepted_tokens"] += 1
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    edited = infer_cli("gate", str(path), "--profile", "cpu-fast", "--json")
    assert edited.returncode == 1
    report = json.loads(edited.stdout)
    copy, seeded = report["anchors"]
    assert copy["status"] == "fail" and seeded["status"] == "pass"
    assert copy["got"]["sha256"] == hashes[0], "the tokens are unchanged: only the counter differs"
    problems = [p for p in copy["problems"] if "counters.accepted_tokens" in p]
    assert problems and "speculation counter changed" in problems[0]
