"""The cpu backend's row kernels (cpu_kernels/rowops.py): the vectorisable exp, and every row op giving
a row the same bits alone or in a batch (the ops' accuracy against float64 is in
test_backend_conformance.py, which runs them as the `cpu-exact` backend)."""

from __future__ import annotations

import numba
import numpy as np
import pytest

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.cpu import CpuBackend, DenseWeight
from infer.engine.backends.cpu_kernels.rowops import exp_f32
from infer.engine.backends.kv_cache import KVCache

BACKEND = CpuBackend(kernels="exact")


@numba.njit
def _exp_all(x: np.ndarray) -> np.ndarray:
    out = np.empty_like(x)
    for i in range(x.shape[0]):
        out[i] = exp_f32(x[i])
    return out


def test_exp_f32_is_within_two_ulp_of_exp_and_clamps_its_range() -> None:
    x = np.concatenate(
        [np.linspace(-87, 88, 400_001), np.random.default_rng(0).uniform(-20, 20, 100_000)]
    ).astype(np.float32)
    got = _exp_all(x).astype(np.float64)
    expected = np.exp(x.astype(np.float64))
    ulp = np.spacing(expected.astype(np.float32)).astype(np.float64)
    assert (np.abs(got - expected) <= 2 * ulp).all()
    ends = _exp_all(np.asarray([-200.0, -88.0, 89.0, 500.0, np.inf, -np.inf], dtype=np.float32))
    assert 0 < ends[0] == ends[1] < 2e-38 and ends[5] == ends[0]  # clamped at -87: tiny, never 0
    assert np.isfinite(ends[2:5]).all() and ends[2] == ends[3] == ends[4] > 1e38  # clamped at 88
    assert np.isnan(_exp_all(np.asarray([np.nan], dtype=np.float32))).all()


def _rows_alone(op, x: np.ndarray) -> np.ndarray:
    return np.concatenate([op(x[i : i + 1].copy()) for i in range(x.shape[0])])


@pytest.mark.parametrize(("rows", "width"), [(2, 100), (7, 100), (16, 100), (16, 4100)])
def test_row_ops_give_each_row_the_same_bits_alone_or_in_a_batch(rows: int, width: int) -> None:
    rng = np.random.default_rng(rows)
    # 16 x 4100 passes activations.PARALLEL_ELEMENTS: those ops split the rows over the threads; a width
    # that is no multiple of the vector width runs every row through a vector loop and its remainder
    heads, head_dim = 3, 16
    x = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    norm = DenseWeight(rng.standard_normal(width).astype(np.float32))
    for op in (
        lambda a: BACKEND.rms_norm(a, norm, 1e-5),
        lambda a: BACKEND.rms_norm(a, None, 1e-6),
        lambda a: BACKEND.silu_mul(a, width // 2),
        lambda a: BACKEND.gelu_mul(a, width // 2),
    ):
        assert np.array_equal(op(x.copy()).view(np.uint32), _rows_alone(op, x).view(np.uint32))
    q = rng.standard_normal((rows, heads, head_dim)).astype(np.float32)
    rotations = np.exp(1j * rng.uniform(-np.pi, np.pi, (rows, head_dim // 2))).astype(np.complex64)
    together = BACKEND.rope(q.copy(), rotations)
    for i in range(rows):
        assert (BACKEND.rope(q[i : i + 1].copy(), rotations[i : i + 1]) == together[i : i + 1]).all()


def test_rms_norm_normalises_the_last_axis_of_any_shape() -> None:
    x = np.random.default_rng(6).standard_normal((2, 3, 32)).astype(np.float32)
    got = BACKEND.rms_norm(x, None, 1e-6)
    assert got.shape == x.shape
    assert (got.reshape(6, 32) == BACKEND.rms_norm(x.reshape(6, 32), None, 1e-6)).all()
    assert (BACKEND.rms_norm(x[0, 0], None, 1e-6) == got[0, 0]).all()


def test_rope_of_a_strided_view_leaves_its_source_alone() -> None:
    rng = np.random.default_rng(3)
    qkv = rng.standard_normal((4, 3 * 16)).astype(np.float32)  # rows of q | k | v, as a linear returns
    source = qkv.copy()
    rotations = np.exp(1j * rng.uniform(-np.pi, np.pi, (4, 8))).astype(np.complex64)
    rotated = BACKEND.rope(qkv[:, 16:32].reshape(4, 1, 16), rotations)
    expected = CpuBackend(kernels="blas").rope(source[:, 16:32].reshape(4, 1, 16).copy(), rotations)
    np.testing.assert_allclose(rotated, expected, rtol=1e-6, atol=1e-6)
    assert (qkv == source).all()  # more than one row: the view is not contiguous, so a copy turns


def test_write_kv_puts_each_row_at_its_slot_and_position() -> None:
    rng = np.random.default_rng(4)
    kernels, blas = (KVCache.allocate(b, 2, 4, 2, 16, 8) for b in (BACKEND, CpuBackend(kernels="blas")))
    slots, positions = np.asarray([3, 0, 3, 1]), np.asarray([0, 5, 1, 15])
    k, v = (rng.standard_normal((4, 2, 8)).astype(np.float32) for _ in range(2))
    for backend, cache in ((BACKEND, kernels), (CpuBackend(kernels="blas"), blas)):
        backend.write_kv(cache, 1, slots, positions, k, v)
    assert (kernels.keys == blas.keys).all() and (kernels.values == blas.values).all()
    assert (kernels.keys[1, 3, :, 1] == k[2]).all() and not kernels.keys[0].any()


def test_a_plan_works_out_its_kernel_rows_once() -> None:
    plan = AttentionPlan.build(np.asarray([0, 2, 1]), np.asarray([5, 0, 9]), np.asarray([1, 20, 3]))
    short = plan.short_rows(16)
    assert short is plan.short_rows(16)
    assert short.rows.tolist() == [0, 21, 22, 23]
    assert short.slots.tolist() == [0, 1, 1, 1] and short.visible.tolist() == [6, 10, 11, 12]
    assert short.first.tolist() == [0, 0, 0, 0]
    windowed = plan.with_window(4).short_rows(16)
    assert windowed.first.tolist() == [2, 6, 7, 8]
