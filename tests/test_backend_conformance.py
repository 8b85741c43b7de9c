"""What every backend must do: each op of the Backend protocol against a float64 numpy reference.

Parametrized over every registered backend whose probe passes here (cpu on this machine; cuda and
metal join as soon as they are implemented and their device is present). Inputs are handed over as
the models hand them: weights through `backend.weight`, activations through `backend.asarray`, and
indices, positions and masks as host numpy arrays.
"""

from __future__ import annotations

import numpy as np
import pytest

from infer.engine.backends import BACKEND_CLASSES, create_backend
from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.base import Backend
from infer.engine.backends.errors import BackendError
from infer.engine.backends.kv_cache import KVCache
from infer.engine.backends.probe import probe_backend

RUNNABLE = [name for name in BACKEND_CLASSES if probe_backend(name) is None]
RTOL, ATOL = 2e-5, 2e-5
CPU_EXACT = "cpu-exact"
"""The cpu backend with its numba kernels (`cpu_kernels: exact`): its row ops are kernels of their own."""


@pytest.fixture(params=[*RUNNABLE, CPU_EXACT])
def backend(request: pytest.FixtureRequest) -> Backend:
    if request.param == CPU_EXACT:
        return create_backend("cpu", kernels="exact")
    return create_backend(request.param)


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def f32(array: np.ndarray) -> np.ndarray:
    return np.asarray(array, dtype=np.float32)


def host(backend: Backend, array: object) -> np.ndarray:
    return np.asarray(backend.to_host(array), dtype=np.float64)


def test_cpu_is_among_the_runnable_backends() -> None:
    assert "cpu" in RUNNABLE


def test_registry_entries_declare_name_probe_and_capabilities() -> None:
    for name, cls in BACKEND_CLASSES.items():
        assert cls.name == name
        assert "float32" in cls.capabilities.dtypes
        assert probe_backend(name) is None or isinstance(probe_backend(name), str)


@pytest.mark.parametrize("name", list(BACKEND_CLASSES))
def test_a_dtype_the_backend_lacks_is_a_clear_error(name: str) -> None:
    cls = BACKEND_CLASSES[name]
    if not cls.implemented:
        with pytest.raises(BackendError, match=name):
            create_backend(name)
        return
    missing = next(d for d in ("float16", "bfloat16", "float64") if d not in cls.capabilities.dtypes)
    with pytest.raises(BackendError, match=f"{missing}.*float32|float32.*{missing}"):
        create_backend(name, missing)
    if probe_backend(name) is not None:  # implemented, but its library or device is missing here
        with pytest.raises(BackendError, match=name):
            create_backend(name, "float32")
        return
    assert create_backend(name, "float32").dtype == "float32"


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(BackendError, match="nope"):
        create_backend("nope")


def test_quant_blocks_outside_the_capabilities_are_refused(backend: Backend) -> None:
    formats = {*type(backend).capabilities.quant_formats, *backend.block_formats}
    missing = next(q for q in ("Q4_0", "Q4_1", "Q8_0", "Q4_K", "Q6_K", "Q5_1", "Q2_K") if q not in formats)
    with pytest.raises(BackendError, match=missing):
        backend.weight(np.zeros(18 * 4, dtype=np.uint8), quant=missing, shape=(4, 32))


@pytest.mark.parametrize("rows", [1, 3, 17])
@pytest.mark.parametrize("with_bias", [False, True])
def test_linear(backend: Backend, rows: int, with_bias: bool) -> None:
    x, w, b = f32(rng(1).standard_normal((rows, 48))), f32(rng(2).standard_normal((40, 48))), None
    expected = x.astype(np.float64) @ w.astype(np.float64).T
    if with_bias:
        b = f32(rng(3).standard_normal(40))
        expected += b
    got = backend.linear(backend.asarray(x), backend.weight(w), backend.weight(b) if with_bias else None)
    assert tuple(got.shape) == (rows, 40)
    np.testing.assert_allclose(host(backend, got), expected, rtol=RTOL, atol=1e-4)


def test_embed(backend: Backend) -> None:
    table = f32(rng(4).standard_normal((50, 16)))
    ids = np.asarray([3, 0, 49, 3, 7], dtype=np.int64)
    got = backend.embed(backend.weight(table), ids)
    np.testing.assert_array_equal(host(backend, got), table[ids].astype(np.float64))


@pytest.mark.parametrize("rows", [1, 5, 40])  # the three paths of the cpu backend's projection
def test_logits(backend: Backend, rows: int) -> None:
    table = f32(rng(5).standard_normal((5000, 24)))  # more than one 4096-row chunk
    x = f32(rng(6).standard_normal((rows, 24)))
    got = backend.logits(backend.asarray(x), backend.weight(table))
    expected = x.astype(np.float64) @ table.astype(np.float64).T
    np.testing.assert_allclose(host(backend, got), expected, rtol=RTOL, atol=1e-4)


@pytest.mark.parametrize("with_weight", [False, True])
def test_rms_norm(backend: Backend, with_weight: bool) -> None:
    x = f32(rng(7).standard_normal((6, 32)) * 3)
    w = f32(rng(8).standard_normal(32))
    x64 = x.astype(np.float64)
    expected = x64 / np.sqrt((x64**2).mean(axis=1, keepdims=True) + 1e-6)
    if with_weight:
        expected *= w
    got = backend.rms_norm(backend.asarray(x), backend.weight(w) if with_weight else None, 1e-6)
    np.testing.assert_allclose(host(backend, got), expected, rtol=RTOL, atol=ATOL)


def test_rope(backend: Backend) -> None:
    rows, heads, dim = 5, 3, 8
    x = f32(rng(9).standard_normal((rows, heads, dim)))
    angles = rng(10).uniform(-np.pi, np.pi, (rows, dim // 2))
    rotations = np.exp(1j * angles).astype(np.complex64)
    even, odd = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]
    expected = np.empty((rows, heads, dim))
    expected[..., 0::2] = even * cos - odd * sin
    expected[..., 1::2] = even * sin + odd * cos
    got = backend.rope(backend.asarray(x.copy()), backend.asarray(rotations))
    np.testing.assert_allclose(host(backend, got), expected, rtol=RTOL, atol=1e-5)


def test_silu_mul(backend: Backend) -> None:
    width = 24
    gate_up = f32(rng(11).standard_normal((4, 2 * width)) * 4)
    g, u = gate_up[:, :width].astype(np.float64), gate_up[:, width:].astype(np.float64)
    got = backend.silu_mul(backend.asarray(gate_up.copy()), width)
    np.testing.assert_allclose(host(backend, got), g / (1 + np.exp(-g)) * u, rtol=1e-5, atol=1e-6)


def test_gelu_mul(backend: Backend) -> None:
    """GeGLU with the tanh gelu (PyTorch's gelu(approximate="tanh")), saturating both ways."""
    width = 24
    gate_up = f32(rng(16).standard_normal((4, 2 * width)) * 4)
    gate_up[0, :2] = (-40.0, 40.0)
    g, u = gate_up[:, :width].astype(np.float64), gate_up[:, width:].astype(np.float64)
    expected = 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3))) * u
    got = backend.gelu_mul(backend.asarray(gate_up.copy()), width)
    np.testing.assert_allclose(host(backend, got), expected, rtol=1e-5, atol=1e-6)


def test_softcap(backend: Backend) -> None:
    """cap * tanh(x / cap): near x for small logits, never past the cap for huge ones."""
    x = f32(rng(17).standard_normal((3, 40)) * 50)
    x[0, :2] = (-1e30, 1e30)
    got = host(backend, backend.softcap(backend.asarray(x.copy()), 30.0))
    np.testing.assert_allclose(got, 30.0 * np.tanh(x.astype(np.float64) / 30.0), rtol=1e-5, atol=1e-5)
    assert np.abs(got).max() <= 30.0


def test_sampling_module_says_where_rows_are_drawn(backend: Backend) -> None:
    """A backend that declares device sampling names its array module; the cpu draws on the host."""
    module = backend.sampling_module
    assert (module is not None) == backend.capabilities.sampling.on_device
    if module is not None:
        assert hasattr(module, "argpartition") and hasattr(module, "take_along_axis")


# ---- write_kv and attention ------------------------------------------------------------------------

HEADS, KV_HEADS, HEAD_DIM, SLOTS, CAPACITY, LAYERS = 4, 2, 8, 5, 32, 2


def reference_attention(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, position: int, window: int | None = None
) -> np.ndarray:
    """One query row q [heads, d] against keys/values [positions, kv_heads, d], seeing <= position
    (and > position - window with a window)."""
    group = HEADS // KV_HEADS
    out = np.empty((HEADS, HEAD_DIM))
    first = 0 if window is None else max(0, position + 1 - window)
    for h in range(HEADS):
        k, v = keys[first : position + 1, h // group], values[first : position + 1, h // group]
        scores = k @ q[h]
        weights = np.exp(scores - scores.max())
        out[h] = weights @ v / weights.sum()
    return out


class Sequences:
    """Host-side truth of what each slot holds, kept next to the backend's cache."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend
        self.cache = KVCache.allocate(backend, LAYERS, SLOTS, KV_HEADS, CAPACITY, HEAD_DIM)
        self.keys = np.zeros((LAYERS, SLOTS, CAPACITY, KV_HEADS, HEAD_DIM))
        self.values = np.zeros_like(self.keys)
        self.generator = rng(12)

    def step(
        self, segments: list[tuple[int, int, int]], layer: int, window: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Write random k/v for `segments` (slot, start, length), attend random q (within `window`
        positions when given); (got, expected)."""
        slots = np.asarray([s for s, _, _ in segments], dtype=np.int64)
        starts = np.asarray([p for _, p, _ in segments], dtype=np.int64)
        lengths = np.asarray([n for _, _, n in segments], dtype=np.int64)
        rows = int(lengths.sum())
        row_slots = np.repeat(slots, lengths)
        positions = np.concatenate([np.arange(p, p + n) for _, p, n in segments])
        k = f32(self.generator.standard_normal((rows, KV_HEADS, HEAD_DIM)))
        v = f32(self.generator.standard_normal((rows, KV_HEADS, HEAD_DIM)))
        q = f32(self.generator.standard_normal((rows, HEADS, HEAD_DIM)))
        b = self.backend
        b.write_kv(self.cache, layer, row_slots, positions, b.asarray(k), b.asarray(v))
        self.keys[layer, row_slots, positions] = k
        self.values[layer, row_slots, positions] = v
        plan = AttentionPlan.build(slots, starts, lengths)
        got = b.attention(
            b.asarray(q), self.cache, layer, plan if window is None else plan.with_window(window)
        )
        layer_keys, layer_values = self.keys[layer], self.values[layer]
        expected = np.stack(
            [
                reference_attention(q[i], layer_keys[slot], layer_values[slot], pos, window)
                for i, (slot, pos) in enumerate(zip(row_slots, positions, strict=True))
            ]
        )
        return host(b, got), expected


@pytest.mark.parametrize("window", [None, 4])
@pytest.mark.parametrize("layer", [0, 1])
def test_prefill_then_decode_attention_with_gqa(backend: Backend, layer: int, window: int | None) -> None:
    """Chunked prefill (a second chunk starting mid-sequence), then batched decode rows of slots of
    different lengths in every arrangement the plan distinguishes; with a sliding window too."""
    seqs = Sequences(backend)
    steps = [
        [(0, 0, 7), (2, 0, 3), (3, 0, 11)],  # prefill only
        [(0, 7, 4), (2, 3, 1)],  # a second chunk beside a decode row
        [(0, 11, 1), (1, 0, 5), (2, 4, 1), (3, 11, 1)],  # decode rows with a hole (slot 1 prefills)
        [(0, 12, 1), (1, 5, 1), (2, 5, 1), (3, 12, 1)],  # aligned decode: rows hold slots 0..3 in order
        [(3, 13, 1), (0, 13, 1)],  # unaligned decode: slot order differs from row order
    ]
    for segments in steps:
        got, expected = seqs.step(segments, layer, window)
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=str(segments))


def test_write_kv_stores_where_attention_reads(backend: Backend) -> None:
    """Written keys and values land at (slot, position) of the layer and nowhere else."""
    seqs = Sequences(backend)
    seqs.step([(4, 0, 6), (1, 0, 2)], layer=1)
    keys = host(backend, seqs.cache.keys).transpose(0, 1, 3, 2, 4)  # -> [layers, slots, pos, kv, d]
    values = host(backend, seqs.cache.values).transpose(0, 1, 3, 2, 4)
    np.testing.assert_array_equal(keys, seqs.keys)
    np.testing.assert_array_equal(values, seqs.values)
    assert not keys[0].any() and keys[1, 4, :6].any() and not keys[1, 4, 6:].any()


def test_a_sequence_attends_only_to_its_own_slot(backend: Backend) -> None:
    """Rewriting another slot's cache leaves a decode row's output unchanged, bit for bit."""
    seqs = Sequences(backend)
    seqs.step([(0, 0, 4), (1, 0, 6)], layer=0)
    q = f32(rng(13).standard_normal((1, HEADS, HEAD_DIM)))
    plan = AttentionPlan.build(np.asarray([0]), np.asarray([3]), np.asarray([1]))
    k = backend.asarray(f32(rng(14).standard_normal((1, KV_HEADS, HEAD_DIM))))
    backend.write_kv(seqs.cache, 0, np.asarray([0]), np.asarray([3]), k, k)
    before = host(backend, backend.attention(backend.asarray(q), seqs.cache, 0, plan))
    noise = backend.asarray(f32(rng(15).standard_normal((6, KV_HEADS, HEAD_DIM)) * 100))
    backend.write_kv(seqs.cache, 0, np.full(6, 1), np.arange(6), noise, noise)
    after = host(backend, backend.attention(backend.asarray(q), seqs.cache, 0, plan))
    np.testing.assert_array_equal(before, after)
