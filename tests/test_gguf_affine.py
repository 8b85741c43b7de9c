"""GGUF Q4_0/Q4_1/Q8_0 blocks as affine groups of 32 (the metal backend's weight layout): numpy only."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize

from infer.engine.backends.gguf_affine import BLOCK_BYTES, dequantize_affine, to_affine


@pytest.mark.parametrize("quant", sorted(BLOCK_BYTES))
def test_affine_groups_give_gguf_py_floats_bit_for_bit(quant: str) -> None:
    rng = np.random.default_rng(5)
    weights = (rng.standard_normal((7, 96)) * rng.uniform(0.001, 30.0, (7, 1))).astype(np.float32)
    blocks = quantize(weights, GGMLQuantizationType[quant])
    expected = dequantize(blocks, GGMLQuantizationType[quant]).reshape(weights.shape)
    groups = to_affine(blocks, quant, weights.shape)
    assert groups.packed.dtype == np.uint32 and groups.packed.shape == (7, 96 * groups.bits // 32)
    assert groups.scales.shape == groups.biases.shape == (7, 3)
    np.testing.assert_array_equal(dequantize_affine(groups), expected)


def test_rows_of_partial_blocks_and_other_types_are_refused() -> None:
    with pytest.raises(ValueError, match="whole blocks"):
        to_affine(np.zeros((2, 20), np.uint8), "Q4_1", (2, 48))
    with pytest.raises(ValueError, match="Q4_K"):
        to_affine(np.zeros((2, 144), np.uint8), "Q4_K", (2, 256))
