"""Shared fixtures: the default model (pulled once into the model cache) and reference oracles."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infer.cli.model_store import GEMMA3_270M, ensure_default_model, pull

REFERENCE_DIR = Path(__file__).resolve().parent / "reference"
"""Copies of the oracles in the steering repo's shared/reference (see its README), so any clone can test."""


@pytest.fixture(scope="session")
def default_model_path() -> Path:
    """Path of the default SmolLM2 GGUF in the model cache (pulled on first use)."""
    return ensure_default_model()


@pytest.fixture(scope="session")
def llamacpp_reference() -> dict:
    """llama.cpp's oracle for the default model (tokenization, chat template, greedy runs)."""
    return json.loads((REFERENCE_DIR / "llamacpp_public.json").read_text())


@pytest.fixture(scope="session")
def transformers_reference() -> dict:
    """transformers float32 oracle for the default model (greedy runs with top-5 logits)."""
    return json.loads((REFERENCE_DIR / "transformers_public.json").read_text())


@pytest.fixture(scope="session")
def gemma3_model_path() -> Path:
    """Path of the Gemma 3 270M GGUF in the model cache (pulled on first use)."""
    return pull(GEMMA3_270M)


@pytest.fixture(scope="session")
def gemma3_references() -> dict[str, dict]:
    """Gemma 3 270M oracles: llama.cpp's, transformers' float32, and the long-prompt transformers run."""
    names = {
        "llamacpp": "gemma3_llamacpp_public.json",
        "transformers": "gemma3_transformers_public.json",
        "long": "gemma3_long_transformers.json",
    }
    return {key: json.loads((REFERENCE_DIR / name).read_text()) for key, name in names.items()}
