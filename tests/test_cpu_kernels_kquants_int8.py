"""The integer int8-activation K-quant kernels (kquants_int8.py, activations per 256-block as llama.cpp's
Q8_K): against the quantized-activation reference in float64, bit-identical across batch sizes and
positions, and across the int8 paths."""

from __future__ import annotations

import numpy as np
import pytest
from test_cpu_kernels_kquants import N_IN, N_OUT, TYPES, random_blocks, reference_weights, rel_err

from infer.engine.backends.cpu_kernels import KERNELS, kquants_int8
from infer.engine.backends.cpu_kernels import kquants_tiles_int8 as tiles
from infer.engine.backends.cpu_kernels.activations import quantize_activations_k
from infer.engine.backends.cpu_kernels.simd_int8 import AVX2, PORTABLE, VNNI, available_paths

# One test worker compiles and runs the CPU kernel tests: beside each other on two workers, a cold
# run (a fresh clone) compiled the same K-quant kernels twice at once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("cpu_kernels")


@pytest.fixture(scope="module", params=TYPES)
def case(request: pytest.FixtureRequest) -> tuple[str, np.ndarray, np.ndarray]:
    type_name = request.param
    blocks = random_blocks(type_name, N_OUT, N_IN, seed=10 + TYPES.index(type_name))
    return type_name, blocks, reference_weights(type_name, blocks, N_IN)


def _rows(seed: int, count: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    scale = rng.uniform(0.1, 10, size=(count, 1)).astype(np.float32)
    return rng.standard_normal((count, N_IN)).astype(np.float32) * scale


def test_the_engine_registry_runs_the_integer_kernels() -> None:
    for type_name in TYPES:
        assert KERNELS[type_name].matmul_int8 is getattr(kquants_int8, f"{type_name.lower()}_matmul_int8")
        assert KERNELS[type_name].quantize is quantize_activations_k


def test_q8_k_quantization_follows_llama_cpp() -> None:
    """Per 256: the value of largest magnitude maps to -127, xd = 1 / iscale, xb the sums of 16."""
    x = _rows(1, 3)
    x[1, 256:512] = 0.0  # an all-zero block: scale 0, quants 0
    xq, xd, xb = quantize_activations_k(x)
    blocks = x.reshape(3, -1, 256)
    peak = np.take_along_axis(blocks, np.abs(blocks).argmax(axis=-1)[..., None], axis=-1)[..., 0]
    iscale = np.where(peak != 0, np.float32(-127.0) / np.where(peak != 0, peak, 1), 0).astype(np.float32)
    scaled = blocks * iscale[..., None]
    want = np.minimum(127, np.sign(scaled) * np.floor(np.abs(scaled) + 0.5)).astype(np.int8)
    assert np.array_equal(xq, want.reshape(x.shape))
    assert np.array_equal(xd[iscale != 0], (np.float32(1.0) / iscale[iscale != 0]))
    assert xd[1, 1] == 0 and not xq[1, 256:512].any()
    assert np.array_equal(xb, xq.reshape(3, -1, 16).astype(np.int32).sum(axis=-1))
    assert (np.abs(xq).max(axis=-1) == 127).all()


def _peak_as_llama_cpp(block: np.ndarray) -> np.float32:
    """quantize_row_q8_K_ref's loop: the first value whose magnitude beats every earlier one (a NaN
    never does), 0 when none is above 0."""
    amax, peak = np.float32(0.0), np.float32(0.0)
    for v in block:
        if abs(v) > amax:
            amax, peak = abs(v), v
    return peak


@pytest.mark.parametrize("rows", [3, 40], ids=["serial", "parallel"])
def test_q8_k_block_peak_follows_llama_cpp_at_the_edges(rows: int) -> None:
    """The peak of each 256-block, found as an integer maximum of the magnitudes' bits, is llama.cpp's
    on ties of opposite sign, NaN, signed zeros and subnormals, in the serial and the parallel version."""
    x = _rows(7, rows)
    x[0, 10], x[0, 20] = 5e3, -5e3  # a tie: the first one is the peak (maps to -127)
    x[0, 256 + 30], x[0, 256 + 3] = -7e3, 7e3  # the positive one first this time
    x[1, 5] = np.nan  # skipped, as the C loop's `ax > amax` skips it
    x[1, 256:512] = np.nan  # a block of NaN only: scale 0, quants 0
    x[2, :256] = -0.0  # signed zeros only: scale 0
    x[2, 256:512] = 0.0
    x[2, 300] = np.float32(1e-40)  # subnormals only, one of them the largest
    x[2, 260] = np.float32(-3e-41)
    x[rows - 1, 600] = np.float32(-1e-30)  # a small normal peak beside subnormals: iscale finite
    x[rows - 1, 512:600] = np.float32(2e-41)
    x[rows - 1, 601:768] = np.float32(-9e-41)
    xq, xd, _ = quantize_activations_k(x)
    blocks = x.reshape(rows, -1, 256)
    with np.errstate(over="ignore"):  # a subnormal peak: -127 / peak overflows, in C as here
        for b in range(rows):
            for k in range(blocks.shape[1]):
                peak = _peak_as_llama_cpp(blocks[b, k])
                want = np.float32(0.0) if peak == 0 else np.float32(1.0) / (np.float32(-127.0) / peak)
                assert xd[b, k] == want, (b, k)
                finite = peak != 0 and np.isfinite(np.float32(-127.0) / peak)  # subnormal: iscale overflows
                if finite and not np.isnan(blocks[b, k]).any():
                    assert xq[b, 256 * k + int(np.argmax(blocks[b, k] == peak))] == -127
        assert xd[0, 0] == np.float32(1.0) / (np.float32(-127.0) / np.float32(5e3))
        assert xd[0, 1] == np.float32(1.0) / (np.float32(-127.0) / np.float32(7e3))
        assert xd[1, 1] == 0 and not xq[1, 256:512].any() and xd[2, 0] == 0
        assert xd[2, 1] == np.float32(1.0) / (np.float32(-127.0) / np.float32(1e-40))


def test_matches_the_quantized_activation_reference(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    type_name, blocks, w = case
    worst_q, worst_f = 0.0, 0.0
    for n_b in range(1, 17):
        x = _rows(n_b, n_b)
        xq, xd, xb = quantize_activations_k(x)
        out = np.full((n_b, N_OUT), np.nan, np.float32)
        KERNELS[type_name].matmul_int8(blocks, xq, xd, xb, out)
        x_deq = (xq.reshape(n_b, -1, 256).astype(np.float64) * xd[..., None]).reshape(n_b, N_IN)
        worst_q = max(worst_q, rel_err(out, x_deq @ w.astype(np.float64).T))
        worst_f = max(worst_f, rel_err(out, x.astype(np.float64) @ w.astype(np.float64).T))
    assert worst_q <= 2e-6, f"{type_name}: vs quantized-activation reference {worst_q:.2e}"
    assert worst_q < worst_f <= 3e-2  # it really quantized, and only that far


def test_a_row_has_the_same_bits_in_every_batch(case: tuple[str, np.ndarray, np.ndarray]) -> None:
    """Alone (one activation row: weight rows two a loop, N_OUT odd so a last one alone) == at every
    position of batches of 1..40 rows (every group size and remainder of the row dots, and from
    tiles.MIN_ROWS rows the tiled kernel: one, two and three groups of lanes, partial)."""
    type_name, blocks, _ = case
    rows = _rows(300, 40)
    acts = quantize_activations_k(rows)

    def run(index: np.ndarray) -> np.ndarray:
        out = np.full((index.size, N_OUT), np.nan, np.float32)
        KERNELS[type_name].matmul_int8(blocks, *(np.ascontiguousarray(a[index]) for a in acts), out)
        return out

    alone = np.concatenate([run(np.array([i])) for i in range(40)])
    rng = np.random.default_rng(7)
    for n_b in range(1, 41):
        order = rng.permutation(40)[:n_b]
        batch = run(order)
        for pos, i in enumerate(order):
            assert np.array_equal(batch[pos], alone[i]), f"{type_name}: row {i} at {pos} of {n_b}"


@pytest.mark.parametrize("n_b", [1, 7, 37])
@pytest.mark.parametrize("path", [PORTABLE, AVX2, VNNI])
def test_every_int8_path_gives_the_same_bits(
    case: tuple[str, np.ndarray, np.ndarray], path: int, n_b: int
) -> None:
    """The integer lanes are exact, so each path (one the host lacks runs as portable) gives the bits of
    the host's best path: a decode row's paired weight rows (1 row), the row dots (7) and the tiled
    kernel (37)."""
    type_name, blocks, _ = case
    x = _rows(400, n_b)
    acts = quantize_activations_k(x)
    best = np.full((n_b, N_OUT), np.nan, np.float32)
    KERNELS[type_name].matmul_int8(blocks, *acts, best)
    got = np.full_like(best, np.nan)
    kquants_int8.matmul_int8_path(type_name, blocks, *acts, got, path)
    assert np.array_equal(got, best), f"{type_name}: path {path} (host has {available_paths()})"
    assert (n_b >= tiles.MIN_ROWS) == (n_b == 37)  # the two kernels are the ones compared


def test_bad_shapes_are_refused() -> None:
    blocks = random_blocks("Q4_K", 4, 512, seed=9)
    kernel = KERNELS["Q4_K"].matmul_int8
    xq, xd, xb = np.zeros((2, 512), np.int8), np.zeros((2, 2), np.float32), np.zeros((2, 32), np.int32)
    with pytest.raises(ValueError, match="out must be"):
        kernel(blocks, xq, xd, xb, np.empty((1, 4), np.float32))
    with pytest.raises(ValueError, match="xd must be"):
        kernel(blocks, xq, xd[:, :1].copy(), xb, np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="xb must be"):
        kernel(blocks, xq, xd, xb[:, :16].copy(), np.empty((2, 4), np.float32))
    with pytest.raises(ValueError, match="multiple of 256"):
        kernel(
            blocks,
            np.zeros((1, 544), np.int8),
            xd[:1],
            np.zeros((1, 34), np.int32),
            np.empty((1, 4), np.float32),
        )
