"""Gemma 3 270M (Q4_K_M GGUF) against its oracles: llama.cpp's and transformers' tokenization, and
transformers' float32 greedy paths with top-5 logits, including a prompt longer than twice the sliding
window (tests/reference/gemma3_long_transformers.json, made by scripts/gemma3_long_oracle.py)."""

from __future__ import annotations

import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.models.gemma3 import Gemma3Model

pytestmark = [pytest.mark.real_model, pytest.mark.slow]

CHUNK = 256
"""Prefill chunk of the long prompt (the engine's chunks sit at fixed multiples too)."""


@pytest.fixture(scope="module")
def checkpoint(gemma3_model_path):
    return load_checkpoint(gemma3_model_path)


@pytest.fixture(scope="module")
def model(checkpoint) -> Gemma3Model:
    return build_model(checkpoint, CpuBackend(kernels="exact"))


def test_tokenizer_equals_both_references_on_every_probe(checkpoint, gemma3_references) -> None:
    tokenizer = checkpoint.tokenizer
    llamacpp, hf = gemma3_references["llamacpp"]["tokenize"], gemma3_references["transformers"]["tokenize"]
    assert [p["text"] for p in llamacpp] == [p["text"] for p in hf]
    for probe, hf_probe in zip(llamacpp, hf, strict=True):
        text = probe["text"]
        assert tokenizer.encode(text, add_bos=False) == probe["ids_parse_special"] == hf_probe["hf_ids"], text
        assert tokenizer.encode(text, parse_special=False, add_bos=False) == probe["ids_plain"], text
    for case in gemma3_references["llamacpp"]["greedy_32"]:  # BOS added, as add_bos_token asks
        assert tokenizer.encode(case["prompt"]) == case["prompt_ids"]
    assert tokenizer.chat_template is None  # the GGUF ships none: --chat refuses, --raw works


def _follow(model, cache, cases: list[dict], slots: list[int], starts: list[int], first_logits) -> None:
    """Decode every case's reference path together, one row each per step, checking the argmax and
    the top-5 logits (to 1e-3) at every step."""
    logits = first_logits
    for step in range(len(cases[0]["greedy_ids"])):
        for row, case in enumerate(cases):
            expected = case["steps"][step]
            label = f"{case['prompt'][:40]!r} step {step}"
            assert int(np.argmax(logits[row])) == case["greedy_ids"][step], label
            np.testing.assert_allclose(
                logits[row][expected["top_ids"]], expected["top_logits"], atol=1e-3, err_msg=label
            )
        tokens = np.asarray([case["greedy_ids"][step] for case in cases], dtype=np.int64)
        segments = tuple(Segment(slot, start + step, 1) for slot, start in zip(slots, starts, strict=True))
        logits = model.forward(ForwardBatch(tokens, segments, np.arange(len(cases))), cache)


def test_greedy_32_and_top5_logits_equal_transformers(model, gemma3_references) -> None:
    cases = gemma3_references["transformers"]["greedy_32"]
    assert len(cases) == 4
    cache = model.make_cache(len(cases), 128)
    ids = [t for c in cases for t in c["prompt_ids"]]
    lengths = [len(c["prompt_ids"]) for c in cases]
    segments = tuple(Segment(slot, 0, n) for slot, n in enumerate(lengths))
    last = np.cumsum(lengths) - 1
    first = model.forward(ForwardBatch(np.asarray(ids, dtype=np.int64), segments, last), cache)
    _follow(model, cache, cases, list(range(len(cases))), lengths, first)


def test_prompt_longer_than_the_window_decodes_as_transformers(model, checkpoint, gemma3_references) -> None:
    case = gemma3_references["long"]
    window = model.config.sliding_window
    assert case["sliding_window"] == window == 512
    ids = case["prompt_ids"]
    assert len(ids) >= 1024 and checkpoint.tokenizer.encode(case["prompt"]) == ids
    # The oracle discriminates: without the window transformers decodes otherwise.
    assert case["greedy_ids_without_window"] != case["greedy_ids"]
    cache = model.make_cache(1, len(ids) + 64)
    for start in range(0, len(ids), CHUNK):
        chunk = ids[start : start + CHUNK]
        batch = ForwardBatch(
            np.asarray(chunk, dtype=np.int64), (Segment(0, start, len(chunk)),), np.asarray([len(chunk) - 1])
        )
        logits = model.forward(batch, cache)
    _follow(model, cache, [case], [0], [len(ids)], logits)


def test_cli_pull_names_the_terms_and_raw_greedy_equals_transformers(
    gemma3_model_path, gemma3_references
) -> None:
    import json

    from cli_process import infer_cli

    pulled = infer_cli("models", "pull", "gemma3-270m")
    assert pulled.returncode == 0 and pulled.stdout.strip() == str(gemma3_model_path)
    assert "Gemma Terms of Use" in pulled.stderr
    case = gemma3_references["transformers"]["greedy_32"][2]
    run = infer_cli(
        "generate", "--model", "gemma3-270m", "--raw", "--temp", "0", "-n", "32", "--ignore-eos", "--json",
        case["prompt"],
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["token_ids"] == case["greedy_ids"]
    chat = infer_cli("generate", "--model", "gemma3-270m", "--chat", "hi")
    assert chat.returncode == 2 and "no chat template" in chat.stderr
    assert len(chat.stderr.strip().splitlines()) <= 2  # the error (after the float-copy notice)
