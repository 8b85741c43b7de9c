"""RoPE settings from both config.json spellings (transformers 4's rope_theta + rope_scaling and
transformers 5's rope_parameters, flat or per layer type) and from GGUF metadata; a scaling kind the
models do not compute is refused at load, never read and then ignored."""

from __future__ import annotations

from typing import Any

import pytest

from infer.engine.models.base import ModelLoadError, gguf_rope_scaling, hf_rope
from infer.engine.models.gemma3 import GEMMA3_FAMILY
from infer.engine.models.llama import LLAMA_FAMILY

LLAMA: dict[str, Any] = {
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_hidden_layers": 2,
    "intermediate_size": 128,
    "vocab_size": 100,
}
GEMMA: dict[str, Any] = LLAMA | {"head_dim": 16, "sliding_window": 512, "sliding_window_pattern": 6}


def test_llama_reads_rope_parameters_like_rope_theta_and_rope_scaling() -> None:
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    v4 = LLAMA_FAMILY.config_from_hf(LLAMA | {"rope_theta": 5e5, "rope_scaling": scaling}, "llama", {}, "v4")
    v5 = LLAMA_FAMILY.config_from_hf(
        LLAMA | {"rope_parameters": {"rope_theta": 5e5} | scaling}, "llama", {}, "v5"
    )
    assert (v5.rope_theta, v5.rope_scaling) == (v4.rope_theta, v4.rope_scaling) == (5e5, scaling)
    plain = LLAMA_FAMILY.config_from_hf(
        LLAMA | {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, "llama", {}, "v5"
    )
    assert (plain.rope_theta, plain.rope_scaling) == (1e4, {})


def test_gemma3_reads_per_layer_type_rope_parameters() -> None:
    v4 = GEMMA3_FAMILY.config_from_hf(
        GEMMA
        | {
            "rope_theta": 1e6,
            "rope_local_base_freq": 1e4,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
        },
        "gemma3_text",
        {},
        "v4",
    )
    v5 = GEMMA3_FAMILY.config_from_hf(
        GEMMA
        | {
            "rope_parameters": {
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
            }
        },
        "gemma3_text",
        {},
        "v5",
    )
    assert v5 == v4
    assert (v5.rope_theta, v5.rope_local_base_freq, v5.rope_scaling) == (
        1e6,
        1e4,
        {"rope_type": "linear", "factor": 8.0},
    )
    other = GEMMA3_FAMILY.config_from_hf(
        GEMMA
        | {
            "rope_parameters": {
                "full_attention": {"rope_type": "default", "rope_theta": 2e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 2e4},
            }
        },
        "gemma3_text",
        {},
        "v5",
    )
    assert (other.rope_theta, other.rope_local_base_freq, other.rope_scaling) == (2e6, 2e4, {})


@pytest.mark.parametrize("kind", ["yarn", "dynamic", "longrope"])
def test_unsupported_scaling_is_refused_in_either_spelling(kind: str) -> None:
    for raw in (
        LLAMA | {"rope_scaling": {"rope_type": kind, "factor": 4.0}},
        LLAMA | {"rope_parameters": {"rope_type": kind, "factor": 4.0, "rope_theta": 1e4}},
    ):
        with pytest.raises(ModelLoadError, match=kind):
            LLAMA_FAMILY.config_from_hf(raw, "llama", {}, "config.json")
    sliding_scaled = GEMMA | {
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": 1e6},
            "sliding_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4},
        }
    }
    with pytest.raises(ModelLoadError, match="sliding layers"):
        GEMMA3_FAMILY.config_from_hf(sliding_scaled, "gemma3_text", {}, "config.json")


def test_per_type_parameters_without_the_asked_type_are_an_error() -> None:
    with pytest.raises(ValueError, match="no entry for full_attention"):
        hf_rope({"rope_parameters": {"sliding_attention": {"rope_theta": 1e4}}}, 1e6, "full_attention")


def test_gguf_scaling_kinds() -> None:
    assert gguf_rope_scaling({}, "llama", "m.gguf") == {}
    assert gguf_rope_scaling({"llama.rope.scaling.type": "none"}, "llama", "m.gguf") == {}
    linear = {"llama.rope.scaling.type": "linear", "llama.rope.scaling.factor": 4.0}
    assert gguf_rope_scaling(linear, "llama", "m.gguf") == {"rope_type": "linear", "factor": 4.0}
    with pytest.raises(ModelLoadError, match="'yarn'"):
        gguf_rope_scaling({"llama.rope.scaling.type": "yarn"}, "llama", "m.gguf")
    with pytest.raises(ModelLoadError, match="factor must be positive"):
        gguf_rope_scaling({"llama.rope.scaling.type": "linear"}, "llama", "m.gguf")
