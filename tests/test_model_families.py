"""Every model family against transformers in float32, from tiny random models.

`tests/reference/families/<name>/` holds one family's tiny model as a safetensors folder (`hf/`) and
as llama.cpp's converter writes it (`f32.gguf`, `q8_0.gguf`), with transformers' float32 greedy ids
and top-5 logits of three prompts (`oracle.json`; made by scripts/family_oracles.py, see the README
there). Each source runs on the `exact` CPU kernels: its greedy 32 tokens must equal transformers',
and its top-5 logits must agree to 1e-4 relative. A family a GGUF file cannot carry all of (Mistral's
sliding window: the converter writes none; Gemma 2's query_pre_attn_scalar) has a second oracle for
what the file alone says (`gguf_reading`), and the Q8_0 file is held to transformers on the numbers it
holds (`q8_0_reading`): Q8_0 moves these scaled random weights enough that the F32 path holds only a
few steps.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model

FAMILIES_DIR = Path(__file__).parent / "reference" / "families"
SOURCES = ("f32.gguf", "q8_0.gguf", "hf")


def _families() -> list[str]:
    return sorted(d.name for d in FAMILIES_DIR.iterdir() if (d / "oracle.json").is_file())


@cache
def _oracle(family: str) -> dict[str, Any]:
    return json.loads((FAMILIES_DIR / family / "oracle.json").read_text())


def _reference(oracle: dict[str, Any], source: str) -> dict[str, Any]:
    """The oracle a source is held to: transformers on the folder's config (hf), on what the GGUF
    says where it cannot say everything (`gguf_reading`), and for Q8_0 on the numbers the file
    holds (`q8_0_reading`: every matrix round-tripped through Q8_0)."""
    if source == "q8_0.gguf":
        return oracle["q8_0_reading"]
    return oracle.get("gguf_reading", oracle) if source.endswith(".gguf") else oracle


def _greedy_path(model: Any, prompts: list[dict[str, Any]]) -> list[list[np.ndarray]]:
    """Logits of every step of every prompt's reference path: the prompts prefilled together in one
    batch, then each step decoded for all of them together (one row each), feeding the reference
    tokens so one wrong pick does not hide the steps after it."""
    cache_ = model.make_cache(len(prompts), 128)
    lengths = [len(p["ids"]) for p in prompts]
    ids = np.asarray([t for p in prompts for t in p["ids"]], dtype=np.int64)
    segments = tuple(Segment(slot, 0, n) for slot, n in enumerate(lengths))
    logits = model.forward(ForwardBatch(ids, segments, np.cumsum(lengths) - 1), cache_)
    steps = [[logits[row].copy()] for row in range(len(prompts))]
    for step in range(len(prompts[0]["greedy"]) - 1):
        tokens = np.asarray([p["greedy"][step] for p in prompts], dtype=np.int64)
        segments = tuple(Segment(slot, n + step, 1) for slot, n in enumerate(lengths))
        logits = model.forward(ForwardBatch(tokens, segments, np.arange(len(prompts))), cache_)
        for row in range(len(prompts)):
            steps[row].append(logits[row].copy())
    return steps


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("family", _families())
def test_greedy_32_and_top5_logits_equal_transformers(family: str, source: str) -> None:
    oracle = _oracle(family)
    checkpoint = load_checkpoint(FAMILIES_DIR / family / source)
    if source.endswith(".gguf"):
        assert checkpoint.config.architecture == oracle["gguf_architecture"]
    reference = _reference(oracle, source)
    model = build_model(checkpoint, CpuBackend(kernels="exact"))
    prompts = [{"ids": p["ids"], **r} for p, r in zip(oracle["prompts"], reference["prompts"], strict=True)]
    assert len(prompts) == 3 and all(len(p["greedy"]) == 32 for p in prompts)
    for row, (prompt, path) in enumerate(zip(prompts, _greedy_path(model, prompts), strict=True)):
        picks = [int(np.argmax(logits)) for logits in path]
        assert picks == prompt["greedy"], f"{family} {source} prompt {row}"
        for step, (logits, expected) in enumerate(zip(path, prompt["steps"], strict=True)):
            np.testing.assert_allclose(
                logits[expected["top5_ids"]],
                expected["top5_logits"],
                rtol=1e-4,
                atol=1e-5,
                err_msg=f"{family} {source} prompt {row} step {step}",
            )


def test_the_oracles_discriminate() -> None:
    """Each oracle's picks are clear (top-2 gap), and the families' paths differ from one another,
    so a family run as another would fail."""
    paths = {}
    for family in _families():
        oracle = _oracle(family)
        assert oracle["min_gap"] >= 1e-2, family
        paths[family] = tuple(tuple(p["greedy"]) for p in oracle["prompts"])
    assert len(set(paths.values())) == len(paths)


@pytest.mark.parametrize("family", _families())
def test_the_engine_decodes_every_family_as_transformers_with_the_prompts_batched(family: str) -> None:
    """The whole engine (scheduler, chunked prefill, batched decode, host sampling) on each family:
    the three prompts submitted together give transformers' greedy ids."""
    from infer.engine import EngineConfig, Request, SamplingParams, load_engine

    oracle = _oracle(family)
    reference = oracle.get("gguf_reading", oracle)
    engine = load_engine(
        FAMILIES_DIR / family / "f32.gguf", EngineConfig(ctx_size=128, max_num_seqs=4), cpu_kernels="exact"
    )
    try:
        greedy = SamplingParams(temperature=0.0)
        streams = [
            engine.submit(Request(tuple(p["ids"]), greedy, max_tokens=32, ignore_eos=True))
            for p in oracle["prompts"]
        ]
        for stream, expected in zip(streams, reference["prompts"], strict=True):
            assert list(stream.result().token_ids) == expected["greedy"], family
    finally:
        engine.shutdown()


@pytest.mark.parametrize("family", _families())
def test_the_int8_kernels_run_every_family_on_its_blocks(family: str) -> None:
    """The speed issue's int8 kernels (activations quantized to 8 bits too, so not bit-exact): every
    matrix of the Q8_0 file, a mixture-of-experts layer's experts included, runs on its blocks (no
    float copy), and along the reference path (teacher-forced) the picks stay transformers' at the
    first step of every prompt and at most steps (at least 20 of 32; measured 24 to 32 here)."""
    oracle = _oracle(family)
    reference = _reference(oracle, "q8_0.gguf")
    model = build_model(load_checkpoint(FAMILIES_DIR / family / "q8_0.gguf"), CpuBackend(kernels="int8"))
    assert model.float_copies == set()
    prompts = [{"ids": p["ids"], **r} for p, r in zip(oracle["prompts"], reference["prompts"], strict=True)]
    for prompt, path in zip(prompts, _greedy_path(model, prompts), strict=True):
        picks = [int(np.argmax(logits)) for logits in path]
        assert picks[0] == prompt["greedy"][0], family
        assert sum(a == b for a, b in zip(picks, prompt["greedy"], strict=True)) >= 20, (family, picks)
