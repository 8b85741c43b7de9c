"""The model writer of scripts/bench_sizes.py: its random blocks have the weight statistics it promises
for every type it writes, and each mix gives each tensor the type llama-quantize would."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_sizes as bs


@pytest.mark.parametrize("kind", sorted(bs._SCALE_AT, key=lambda k: k.name))
def test_random_blocks_have_mean_zero_and_the_asked_spread(kind: gguf.GGMLQuantizationType) -> None:
    rows, cols = 64, 512
    blocks = bs.random_blocks(kind, rows, cols, 0.02, np.random.default_rng(3))
    weights = gguf.quants.dequantize(blocks, kind).astype(np.float64)
    assert weights.shape == (rows, cols)
    assert abs(weights.mean()) < 0.003  # Q4_0 has no min: its quants q - 8 average -0.5 (d / 2)
    assert 0.015 < weights.std() < 0.025


@pytest.mark.parametrize("mix", bs.MIXES + bs.OTHER_MIXES)
def test_every_mix_has_a_file_type_and_a_q6_k_output(mix: str) -> None:
    assert mix in bs._FILE_TYPES
    assert bs.tensor_type(mix, "output", 0, 16) == (gguf.GGMLQuantizationType.Q8_0 if mix == "Q8_0" else
                                                     gguf.GGMLQuantizationType.Q6_K)  # fmt: skip
    body = bs.tensor_type(mix, "other", 5, 16)
    assert body.name == {"Q4_K_M": "Q4_K", "Q5_K_M": "Q5_K"}.get(mix, mix)
    assert bs.tensor_type(mix, "other", 5, 16) in bs._SCALE_AT  # the writer can make its blocks
