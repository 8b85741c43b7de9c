"""The numpy backend's ops against float64 formulas, including the ranges where the fast paths give up."""

from __future__ import annotations

import mmap
import sys

import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.backends.kv_cache import KVCache

BACKEND = CpuBackend()


def softmax64(scores: np.ndarray) -> np.ndarray:
    x = scores.astype(np.float64)
    x = np.exp(x - x.max(axis=-1, keepdims=True))
    return x / x.sum(axis=-1, keepdims=True)


def normalised(scores: np.ndarray) -> np.ndarray:
    weights, sums = BACKEND.exp_rows(scores.copy())
    assert sums.shape == (*scores.shape[:-1], 1)
    return weights / sums


@pytest.mark.parametrize(
    "scale, shift",
    [
        (1.0, 0.0),  # typical attention scores: the unshifted path
        (30.0, 0.0),  # rows spanning +-90: exp overflows unshifted
        (1.0, 80.0),  # every score near 80: sums past 1e30, weights @ values could overflow
        (1.0, -90.0),  # every score near -90: whole rows underflow unshifted
    ],
)
def test_exp_rows_is_a_softmax_whatever_the_range(scale: float, shift: float) -> None:
    scores = (np.random.default_rng(0).standard_normal((4, 3, 3, 37)) * scale + shift).astype(np.float32)
    got = normalised(scores)
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, softmax64(scores), rtol=2e-5, atol=1e-7)
    # As attention uses it: unnormalised weights times large values, divided afterwards.
    values = (np.random.default_rng(1).standard_normal((4, 3, 37, 8)) * 1e6).astype(np.float32)
    weights, sums = BACKEND.exp_rows(scores.copy())
    out = (weights @ values) / sums
    np.testing.assert_allclose(out, softmax64(scores) @ values.astype(np.float64), rtol=1e-4, atol=1.0)


def test_exp_rows_treats_each_row_on_its_own() -> None:
    """One out-of-range row in a batch changes nothing in the other rows, bit for bit."""
    rng = np.random.default_rng(4)
    scores = rng.standard_normal((6, 3, 1, 20)).astype(np.float32)
    alone_weights, alone_sums = BACKEND.exp_rows(scores.copy())
    mixed = scores.copy()
    mixed[4, 1, 0] += 95.0  # this row overflows unshifted
    weights, sums = BACKEND.exp_rows(mixed.copy())
    keep = np.ones(scores.shape[:-1], dtype=bool)
    keep[4, 1, 0] = False
    assert np.array_equal(weights[keep], alone_weights[keep])
    assert np.array_equal(sums[keep], alone_sums[keep])
    np.testing.assert_allclose((weights / sums)[4, 1, 0], softmax64(mixed)[4, 1, 0], rtol=2e-5, atol=1e-7)


def test_exp_rows_with_masked_positions() -> None:
    scores = np.random.default_rng(1).standard_normal((5, 2, 1, 9)).astype(np.float32)
    scores[:, :, :, 6:] = -np.inf
    scores[2, :, :, 1:] = -np.inf  # a row that sees one position
    got = normalised(scores)
    assert (got[..., 6:] == 0).all() and np.allclose(got[2, :, :, 0], 1.0)
    np.testing.assert_allclose(got, softmax64(scores), rtol=2e-5, atol=1e-7)


def test_silu_mul_matches_float64_including_saturation() -> None:
    rng = np.random.default_rng(2)
    width = 40
    gate_up = rng.standard_normal((6, 2 * width)).astype(np.float32) * 4
    gate_up[0, :width] = np.linspace(-120, 120, width)  # exp(-g) overflows for the most negative
    gate_up[0, width:] = np.linspace(-3, 3, width)
    g, u = gate_up[:, :width].astype(np.float64), gate_up[:, width:].astype(np.float64)
    expected = g / (1 + np.exp(-g)) * u
    for layout in (gate_up.copy(), np.asfortranarray(gate_up)):
        got = BACKEND.silu_mul(layout, width)
        assert np.isfinite(got).all()
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("order", ["C", "F"])
def test_rms_norm_for_either_memory_order(order: str) -> None:
    rng = np.random.default_rng(3)
    x = np.asarray(rng.standard_normal((7, 64)).astype(np.float32), order=order)
    weight = rng.standard_normal(64).astype(np.float32)
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-5) * weight
    np.testing.assert_allclose(BACKEND.rms_norm(x, weight, 1e-5), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape", [(2, 3, 5), (1, 4, 16, 64), (7,)])
def test_zeros_start_on_a_cache_line(shape: tuple[int, ...]) -> None:
    # The KV cache comes from here: a 256-byte key row must not straddle an extra cache line.
    arrays = [BACKEND.zeros(shape) for _ in range(8)]  # several, so one lucky malloc cannot pass alone
    for array in arrays:
        assert array.ctypes.data % 64 == 0
        assert array.shape == shape and array.dtype == np.float32 and array.flags.c_contiguous
        assert not array.any()


def _resident_bytes() -> int:
    """This process's resident set (Linux /proc), in bytes."""
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * mmap.PAGESIZE


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/statm")
def test_a_released_cache_slot_gives_its_memory_back() -> None:
    """Writing a slot commits its pages; releasing it returns them (RSS falls back) and the slot
    reads as zeros; the other slot keeps its data."""
    cache = KVCache.allocate(CpuBackend(), layers=4, slots=2, kv_heads=2, capacity=4096, head_dim=128)
    per_slot = cache.keys[:, 0].nbytes * 2  # keys and values: 16 MiB
    idle = _resident_bytes()
    a, b = cache.acquire(), cache.acquire()
    assert (a, b) == (0, 1)
    cache.keys[:, b] = 1.0
    cache.values[:, b] = 2.0
    cache.keys[:, a, :, :16] = 3.0
    written = _resident_bytes()
    assert written - idle > 0.9 * per_slot
    cache.release(b)
    assert written - _resident_bytes() > 0.9 * per_slot
    assert not cache.keys[:, b].any() and not cache.values[:, b].any()
    assert (cache.keys[:, a, :, :16] == 3.0).all() and not cache.keys[:, a, :, 16:].any()
