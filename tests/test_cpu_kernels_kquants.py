"""K-quant CPU kernels (Q4_K, Q5_K, Q6_K) against gguf's numpy dequantizer: exact, int8, dequantize, and
batch invariance (a row's result is bit-identical whatever the batch around it)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from numba import njit

from infer.engine.backends.cpu import read_only
from infer.engine.backends.cpu_kernels.bits import half_to_f32
from infer.engine.backends.cpu_kernels.kquants import KQUANT_KERNELS

# One test worker compiles and runs the CPU kernel tests: beside each other on two workers, a cold
# run (a fresh clone) compiled the same K-quant kernels twice at once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("cpu_kernels")

TYPES = ["Q4_K", "Q5_K", "Q6_K"]
N_OUT = 45  # not a multiple of the kernels' rows per task: the last task is partial
N_IN = 768  # three super-blocks


def random_blocks(type_name: str, n_out: int, n_in: int, seed: int) -> np.ndarray:
    """Random but valid blocks: every scale, min and quant byte random, d/dmin finite f16 (some subnormal,
    some negative). gguf 0.19 has no K-quant quantizer, so the blocks are built directly."""
    rng = np.random.default_rng(seed)
    kern = KQUANT_KERNELS[type_name]
    n_sb = n_in // 256
    raw = rng.integers(0, 256, size=(n_out, n_sb, kern.block_bytes), dtype=np.uint8)
    d = (rng.standard_normal((n_out, n_sb, 2)) * 0.01).astype(np.float16)
    d[0, 0, :] = np.float16(3e-6)  # subnormal half
    d[1, 0, 1] = np.float16(0.0)
    halves = d.view(np.uint8)
    if type_name == "Q6_K":
        raw[:, :, 208:210] = halves[:, :, 0:2]
    else:
        raw[:, :, 0:4] = halves.reshape(n_out, n_sb, 4)
    return read_only(raw.reshape(n_out, n_sb * kern.block_bytes))  # as a GGUF's memory map gives them


def reference_weights(type_name: str, blocks: np.ndarray, n_in: int) -> np.ndarray:
    return dequantize(blocks, GGMLQuantizationType[type_name]).reshape(blocks.shape[0], n_in)


def quantize_q8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """llama.cpp's Q8_0 activation quantization: per 32-block d = amax / 127, q = roundf(x / d)."""
    blocks = x.reshape(x.shape[0], -1, 32)
    amax = np.abs(blocks).max(axis=-1)
    d = (amax / np.float32(127.0)).astype(np.float32)
    inv = np.where(d > 0, np.float32(1.0) / np.where(d > 0, d, 1), 0).astype(np.float32)
    scaled = blocks * inv[..., None]
    q = np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)  # round half away from zero, as roundf
    return q.astype(np.int8).reshape(x.shape), d


def rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


@pytest.fixture(scope="module", params=TYPES)
def case(request: pytest.FixtureRequest) -> tuple[str, np.ndarray, np.ndarray]:
    type_name = request.param
    blocks = random_blocks(type_name, N_OUT, N_IN, seed=TYPES.index(type_name))
    return type_name, blocks, reference_weights(type_name, blocks, N_IN)


@njit
def _halves(raw: np.ndarray) -> np.ndarray:
    """half_to_f32 over every 2-byte little-endian half in raw (how the kernels read block scales)."""
    out = np.empty(raw.shape[0] // 2, np.float32)
    for i in range(out.shape[0]):
        out[i] = half_to_f32(raw[2 * i], raw[2 * i + 1])
    return out


def _half(lo: int, hi: int) -> np.float32:
    return _halves(np.asarray([lo, hi], dtype=np.uint8))[0]


def test_half_to_float_matches_numpy_for_every_finite_half() -> None:
    bits = np.arange(1 << 16, dtype=np.uint16)
    want = bits.view(np.float16).astype(np.float32)
    finite = np.isfinite(want)
    got = _halves(bits[finite].view(np.uint8))  # little-endian bytes, as GGUF stores them
    assert np.array_equal(got.view(np.uint32), want[finite].view(np.uint32))  # also -0.0 vs 0.0
    assert np.isinf(_half(0x00, 0x7C)) and np.isnan(_half(0x01, 0x7C))


def test_block_sizes_match_gguf() -> None:
    from gguf.constants import GGML_QUANT_SIZES

    for type_name, kern in KQUANT_KERNELS.items():
        assert kern.type_name == type_name
        assert (kern.block_elements, kern.block_bytes) == GGML_QUANT_SIZES[GGMLQuantizationType[type_name]]


def test_dequantize_rows_equals_gguf(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    type_name, blocks, w = case
    kern = KQUANT_KERNELS[type_name]
    out = np.full((N_OUT, N_IN), np.nan, np.float32)
    kern.dequantize_rows(blocks, 0, N_OUT, out)
    assert np.array_equal(out, w)
    part = np.full((7, N_IN), np.nan, np.float32)
    kern.dequantize_rows(blocks, 11, 18, part)
    assert np.array_equal(part, w[11:18])


def test_dequantize_rows_reads_a_memory_map(case: tuple[str, np.ndarray, np.ndarray], tmp_path) -> None:
    type_name, blocks, w = case
    path = tmp_path / "w.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    out = np.empty((N_OUT, N_IN), np.float32)
    KQUANT_KERNELS[type_name].dequantize_rows(mapped, 0, N_OUT, out)
    assert np.array_equal(out, w)


def test_matmul_exact_matches_float64_reference(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    type_name, blocks, w = case
    rng = np.random.default_rng(100)
    worst = 0.0
    for n_b in range(1, 17):
        x = rng.standard_normal((n_b, N_IN)).astype(np.float32)
        out = np.full((n_b, N_OUT), np.nan, np.float32)
        KQUANT_KERNELS[type_name].matmul_exact(blocks, x, out)
        worst = max(worst, rel_err(out, x.astype(np.float64) @ w.astype(np.float64).T))
    assert worst <= 1e-5, f"{type_name}: relative error {worst:.2e}"


def test_matmul_int8_matches_quantized_and_float_references(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    type_name, blocks, w = case
    rng = np.random.default_rng(200)
    w64 = w.astype(np.float64)
    worst_q, worst_f = 0.0, 0.0
    for n_b in range(1, 17):
        x = rng.standard_normal((n_b, N_IN)).astype(np.float32)
        xq, xs = quantize_q8(x)
        out = np.full((n_b, N_OUT), np.nan, np.float32)
        KQUANT_KERNELS[type_name].matmul_int8(blocks, xq, xs, out)
        x_deq = (xq.reshape(n_b, -1, 32).astype(np.float64) * xs[..., None].astype(np.float64)).reshape(
            n_b, N_IN
        )
        worst_q = max(worst_q, rel_err(out, x_deq @ w64.T))
        worst_f = max(worst_f, rel_err(out, x.astype(np.float64) @ w64.T))
    assert worst_q <= 1e-5, f"{type_name}: vs quantized-activation reference {worst_q:.2e}"
    assert worst_f <= 2e-2, f"{type_name}: vs float reference {worst_f:.2e}"
    assert worst_f > worst_q  # the int8 path really quantized: it cannot beat its own reference


@pytest.mark.parametrize("mode", ["exact", "int8"])
def test_batch_invariance(case: tuple[str, np.ndarray, np.ndarray], mode: str) -> None:
    """A row computed alone == the same row at any position of a batch of 1..16, bit for bit."""
    type_name, blocks, _ = case
    kern = KQUANT_KERNELS[type_name]
    rng = np.random.default_rng(300)

    def run(x: np.ndarray) -> np.ndarray:
        out = np.full((x.shape[0], N_OUT), np.nan, np.float32)
        if mode == "exact":
            kern.matmul_exact(blocks, x, out)
        else:
            xq, xs = quantize_q8(x)
            kern.matmul_int8(blocks, xq, xs, out)
        return out

    rows = rng.standard_normal((16, N_IN)).astype(np.float32) * rng.uniform(0.1, 10, size=(16, 1)).astype(
        np.float32
    )
    alone = np.concatenate([run(rows[i : i + 1]) for i in range(16)])
    for trial in range(12):
        n_b = 16 if trial == 0 else int(rng.integers(1, 17))
        order = rng.permutation(16)[:n_b]
        batch = run(np.ascontiguousarray(rows[order]))
        for pos, i in enumerate(order):
            assert np.array_equal(batch[pos], alone[i]), f"{type_name} {mode}: row {i} at {pos} of {n_b}"


def test_shapes_that_are_not_whole_super_blocks_are_refused() -> None:
    kern = KQUANT_KERNELS["Q4_K"]
    blocks = random_blocks("Q4_K", 4, 512, seed=9)
    with pytest.raises(ValueError, match="multiple of 256"):
        kern.matmul_exact(blocks, np.zeros((1, 640), np.float32), np.empty((1, 4), np.float32))
    with pytest.raises(ValueError, match="row length"):
        kern.matmul_exact(blocks, np.zeros((1, 768), np.float32), np.empty((1, 4), np.float32))
    with pytest.raises(ValueError, match="out must be"):
        kern.matmul_int8(
            blocks, np.zeros((2, 512), np.int8), np.zeros((2, 16), np.float32), np.empty((1, 4), np.float32)
        )


def test_dot_follows_its_documented_order() -> None:
    """The vector dot == a numpy emulation of its order (64 lanes in order, (v0 + v1) + (v2 + v3), then
    halving 16 -> 1), bit for bit: the order is the code's, not the compiler's."""
    from numba import njit

    from infer.engine.backends.cpu_kernels.kquants import _vdot

    @njit
    def vdot(w: np.ndarray, x: np.ndarray) -> np.float32:
        return _vdot(w, x, w.shape[0])

    rng = np.random.default_rng(400)
    for n in (64, 256, 768, 2048):
        w = (rng.standard_normal(n) * rng.uniform(0.01, 100, n)).astype(np.float32)
        x = rng.standard_normal(n).astype(np.float32)
        acc = np.zeros(64, np.float32)
        for i in range(0, n, 64):
            acc = acc + w[i : i + 64] * x[i : i + 64]
        lanes = (acc[0:16] + acc[16:32]) + (acc[32:48] + acc[48:64])
        while lanes.size > 1:
            lanes = lanes[: lanes.size // 2] + lanes[lanes.size // 2 :]
        assert vdot(w, x) == lanes[0]


def test_non_contiguous_activations(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    type_name, blocks, w = case
    rng = np.random.default_rng(500)
    x = np.asfortranarray(rng.standard_normal((3, N_IN)).astype(np.float32))
    out = np.empty((3, N_OUT), np.float32)
    KQUANT_KERNELS[type_name].matmul_exact(blocks, x, out)
    want = np.empty_like(out)
    KQUANT_KERNELS[type_name].matmul_exact(blocks, np.ascontiguousarray(x), want)
    assert np.array_equal(out, want)
    assert rel_err(out, x.astype(np.float64) @ w.astype(np.float64).T) <= 1e-5


@pytest.mark.parametrize("type_name", TYPES)
def test_register_decoded_kernels_give_the_buffer_paths_bits(type_name: str) -> None:
    """Q4_K, Q5_K and Q6_K decode their weights in registers (kquants_simd.py): every output, for B from 1
    to 16 (the groups of 6 and each remainder), has the bits of the dequantize-into-a-buffer path, the
    kernels' first form, whose bits the gate anchors pinned. Blocks include a subnormal and a zero d."""
    from infer.engine.backends.cpu_kernels import kquants

    kind = TYPES.index(type_name)  # _matmul's kind: 0 Q4_K, 1 Q5_K, 2 Q6_K
    blocks = random_blocks(type_name, N_OUT, N_IN, seed=11)
    rng = np.random.default_rng(12)
    for rows in range(1, 17):
        x = rng.standard_normal((rows, N_IN)).astype(np.float32)
        buffered = np.empty((rows, N_OUT), np.float32)
        kquants._matmul(blocks, x, buffered, kind)
        got = np.empty((rows, N_OUT), np.float32)
        KQUANT_KERNELS[type_name].matmul_exact(blocks, x, got)
        np.testing.assert_array_equal(got, buffered)
