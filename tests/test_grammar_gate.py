"""`infer gate` with constrained anchors (the same keys as the flags) and `--audit`, on the tiny model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_process import infer_cli
from synthetic import BOS_ID

from infer.cli.gate.check import AnchorResult, AnchorRun
from infer.cli.gate.command import audit_anchor
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.profiles.settings import resolve_settings

pytest_plugins = ["conftest_synthetic"]

ANCHORS = """\
version: 1
defaults:
  profile: cpu
  model: {model}
  n_predict: 24
anchors:
  - name: regex
    prompt: "hello the"
    sampler: {{temperature: 1.0, seed: 4}}
    regex: "(the|sea|is)( (the|sea|is)){{1,4}}"
  - name: choice
    prompt: "hello"
    sampler: {{temperature: 0}}
    choice: ["a, b", "sea"]
  - name: schema
    prompt: "hello"
    sampler: {{temperature: 0}}
    json_schema:
      type: object
      properties: {{word: {{enum: [sea, world]}}}}
      required: [word]
      additionalProperties: false
  - name: grammar-file
    prompt: "hello"
    sampler: {{temperature: 0}}
    grammar: g.lark
"""


def test_constrained_anchors_bless_pass_and_audit(tmp_path: Path, tiny_gguf: Path) -> None:
    (tmp_path / "g.lark").write_text('start: "is " ("it" | "the")\n')
    path = tmp_path / "anchors.yaml"
    path.write_text(ANCHORS.format(model=tiny_gguf))
    blessed = infer_cli("gate", str(path), "--bless", "-t", "1")
    assert blessed.returncode == 0, blessed.stderr
    checked = infer_cli("gate", str(path), "--audit", "--json", "-t", "1")
    assert checked.returncode == 0, checked.stderr + checked.stdout
    report = json.loads(checked.stdout)
    assert [a["status"] for a in report["anchors"]] == ["pass"] * 4
    assert [a["got"].get("finish_reason") for a in report["anchors"]] == ["stop"] * 4


def test_the_audit_fails_an_anchor_whose_tokens_the_grammar_forbids(tiny_gguf: Path) -> None:
    engine = load_engine(tiny_gguf, EngineConfig(ctx_size=32, max_num_seqs=1))
    settings = resolve_settings({"model": str(tiny_gguf), "regex": "(the|sea)+"}, env={})
    good = tuple(engine.tokenizer.encode("thesea", add_bos=False))
    for tokens, verdict in ((good, "pass"), ((*good, BOS_ID), "fail")):
        run = AnchorRun(tokens, (), "", "stop", 1, {}, 0.0)
        result = AnchorResult("regex", "pass", {}, {}, 0.0)
        audit_anchor(engine, settings, run, result)
        assert result.status == verdict
        if verdict == "fail":
            assert result.problems == [
                f"audit: token {len(good)} (id {BOS_ID}) is not allowed by the regex /(the|sea)+/ constraint"
            ]


@pytest.mark.parametrize("bad", ['regex: "a("', "choice: []\n    json_object: true\n    regex: a"])
def test_a_bad_constraint_in_an_anchor_exits_2(tmp_path: Path, tiny_gguf: Path, bad: str) -> None:
    path = tmp_path / "anchors.yaml"
    path.write_text(
        f"version: 1\ndefaults: {{model: {tiny_gguf}, n_predict: 4}}\nanchors:\n"
        f"  - name: x\n    prompt: hi\n    sampler: {{temperature: 0}}\n    {bad}\n"
    )
    result = infer_cli("gate", str(path))
    assert result.returncode == 2 and result.stderr.startswith("infer: error:"), result.stderr
