"""The numba CPU kernels on raw GGUF blocks (engine/backends/cpu_kernels, contract in KERNELS.md):
precision against the float64 dequantized reference, dequantize_rows == gguf's dequantize, batch
invariance (a row's result is bit-identical alone or anywhere in a batch of 1..16), activation
quantization == llama.cpp's Q8_0, and every feature path."""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys

import numba
import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gguf_quants

from infer.engine.backends.cpu import read_only
from infer.engine.backends.cpu_kernels import KERNELS, cpu_features, legacy, quantize_activations, simd_int8
from infer.engine.backends.cpu_kernels.activations import PARALLEL_ELEMENTS, quantize_activations_k

# One test worker compiles and runs the CPU kernel tests: beside each other on two workers, a cold
# run (a fresh clone) compiled the same K-quant kernels twice at once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("cpu_kernels")

pytest_plugins = ["conftest_synthetic"]  # tiny_gguf

TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1", "F16", "BF16", "F32")
INT8_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")
ROWS, COLS = 67, 192  # odd row count (uneven split over threads), 6 blocks of 32


def make_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF bytes [rows, row_bytes] of random weights (gguf's own quantizer where it has one)."""
    weights = (rng.standard_normal((rows, cols)) * rng.uniform(0.01, 2.0, size=(rows, 1))).astype(np.float32)
    qtype = GGMLQuantizationType[type_name]
    if type_name == "F32":
        blocks = weights.view(np.uint8)
    elif type_name == "F16":
        blocks = weights.astype(np.float16).view(np.uint8)
    else:
        blocks = np.ascontiguousarray(gguf_quants.quantize(weights, qtype))
    return read_only(blocks)  # as a GGUF's memory map gives them: the kernels compile for that type once


def dequantized(type_name: str, blocks: np.ndarray) -> np.ndarray:
    """gguf's numpy dequantize: the float32 weights [rows, cols]."""
    return gguf_quants.dequantize(blocks, GGMLQuantizationType[type_name])


def relative_error(got: np.ndarray, ref: np.ndarray) -> float:
    """max |got - ref| / max |ref|."""
    return float(np.abs(got.astype(np.float64) - ref).max() / np.abs(ref).max())


def activations(batch: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """float32 rows with a spread of magnitudes per 32-block (as hidden states have)."""
    scale = rng.uniform(0.05, 5.0, size=(batch, cols // 32, 1))
    return (rng.standard_normal((batch, cols // 32, 32)) * scale).reshape(batch, cols).astype(np.float32)


def dequantized_activations(xq: np.ndarray, xs: np.ndarray) -> np.ndarray:
    """float64 values of quantized activations."""
    batch, cols = xq.shape
    return (xq.astype(np.float64).reshape(batch, -1, 32) * xs.astype(np.float64)[..., None]).reshape(
        batch, cols
    )


@pytest.fixture(scope="module")
def weights() -> dict[str, np.ndarray]:
    rng = np.random.default_rng(14)
    return {name: make_blocks(name, ROWS, COLS, rng) for name in TYPES}


def test_registry_covers_the_types_with_gguf_block_sizes() -> None:
    for name in TYPES:
        kernels = KERNELS[name]
        elements, nbytes = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
        assert (kernels.type_name, kernels.block_elements, kernels.block_bytes) == (name, elements, nbytes)
        assert (kernels.matmul_int8 is not None) == (name in INT8_TYPES)


@pytest.mark.parametrize("type_name", TYPES)
def test_exact_matches_float64_reference_for_every_batch_size(type_name, weights) -> None:
    blocks = weights[type_name]
    ref_weights = dequantized(type_name, blocks).astype(np.float64)
    rng = np.random.default_rng(1)
    for batch in range(1, 17):
        x = activations(batch, COLS, rng)
        out = np.full((batch, ROWS), np.nan, np.float32)
        KERNELS[type_name].matmul_exact(blocks, x, out)
        assert relative_error(out, x.astype(np.float64) @ ref_weights.T) <= 1e-5, batch


@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_int8_matches_both_references_for_every_batch_size(type_name, weights) -> None:
    blocks = weights[type_name]
    ref_weights = dequantized(type_name, blocks).astype(np.float64)
    rng = np.random.default_rng(2)
    for batch in range(1, 17):
        x = activations(batch, COLS, rng)
        xq, xs = quantize_activations(x)
        out = np.full((batch, ROWS), np.nan, np.float32)
        KERNELS[type_name].matmul_int8(blocks, xq, xs, out)
        assert relative_error(out, x.astype(np.float64) @ ref_weights.T) <= 2e-2, batch
        same_quantization = dequantized_activations(xq, xs) @ ref_weights.T
        assert relative_error(out, same_quantization) <= 1e-5, batch


@pytest.mark.parametrize("type_name", TYPES)
def test_dequantize_rows_equals_gguf_bit_for_bit(type_name, weights) -> None:
    blocks = weights[type_name]
    ref = dequantized(type_name, blocks)
    for start, stop in ((0, ROWS), (5, 6), (13, 50)):
        out = np.full((stop - start, COLS), np.nan, np.float32)
        KERNELS[type_name].dequantize_rows(blocks, start, stop, out)
        assert np.array_equal(out.view(np.uint32), ref[start:stop].view(np.uint32)), (start, stop)


def _kernel_call(type_name: str, precision: str, blocks: np.ndarray, x: np.ndarray) -> np.ndarray:
    out = np.full((x.shape[0], blocks.shape[0]), np.nan, np.float32)
    if precision == "exact":
        KERNELS[type_name].matmul_exact(blocks, x, out)
    else:
        KERNELS[type_name].matmul_int8(blocks, *quantize_activations(x), out)
    return out


@pytest.mark.parametrize(
    ("type_name", "precision"), [(t, "exact") for t in TYPES] + [(t, "int8") for t in INT8_TYPES]
)
def test_batch_invariance_row_alone_equals_row_in_any_batch(type_name, precision, weights) -> None:
    blocks = weights[type_name]
    rng = np.random.default_rng(3)
    pool = activations(16, COLS, rng)
    alone = np.concatenate([_kernel_call(type_name, precision, blocks, pool[i : i + 1]) for i in range(16)])
    for batch in [*range(1, 17), *range(1, 17)]:  # every group size and remainder of the kernels, twice
        picks = rng.choice(16, size=batch, replace=False)
        together = _kernel_call(type_name, precision, blocks, np.ascontiguousarray(pool[picks]))
        assert np.array_equal(together.view(np.uint32), alone[picks].view(np.uint32)), (batch, picks)


def test_kernels_accept_a_memory_mapped_file(tmp_path, weights) -> None:
    blocks = weights["Q4_1"]
    path = tmp_path / "blocks.bin"
    blocks.tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r", shape=blocks.shape)
    x = activations(3, COLS, np.random.default_rng(4))
    assert np.array_equal(_kernel_call("Q4_1", "exact", mapped, x), _kernel_call("Q4_1", "exact", blocks, x))


def test_quantize_activations_equals_gguf_q8_0() -> None:
    rng = np.random.default_rng(5)
    x = activations(7, 256, rng)
    x[0, :32] = 0.0  # an all-zero block: scale 0, quants 0
    x[1, 32:64] = np.linspace(-4.0, 4.0, 32, dtype=np.float32)  # includes exact .5 multiples
    xq, xs = quantize_activations(x)
    ref = gguf_quants.quantize(x, GGMLQuantizationType.Q8_0).reshape(7, -1, 34)
    assert np.array_equal(xq, ref[..., 2:].copy().view(np.int8).reshape(7, 256))
    assert np.array_equal(xs, ref[..., :2].copy().view(np.float16).astype(np.float32).reshape(7, -1))
    assert not xs[0, 0] and not xq[0, :32].any()


@pytest.mark.parametrize("quantize", [quantize_activations, quantize_activations_k], ids=["q8_0", "q8_k"])
def test_activation_rows_quantize_the_same_alone_or_in_a_batch(quantize) -> None:
    # a batch of PARALLEL_ELEMENTS elements or more splits its rows over the threads, one row does not
    rows = 9
    width = -(-PARALLEL_ELEMENTS // (rows * 256)) * 256
    x = activations(rows, width, np.random.default_rng(8))
    batched = quantize(x)
    for b in range(x.shape[0]):
        for whole, alone in zip(batched, quantize(x[b : b + 1]), strict=True):
            assert np.array_equal(whole[b : b + 1], alone)


def test_quantize_activations_rejects_a_ragged_width() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        quantize_activations(np.zeros((2, 40), np.float32))


def test_half_and_bfloat16_conversions_cover_every_bit_pattern() -> None:
    every = np.arange(65536, dtype=np.uint32).astype(np.uint16)
    f16_blocks = every.view(np.uint8).reshape(1, -1)
    out = np.empty((1, 65536), np.float32)
    KERNELS["F16"].dequantize_rows(f16_blocks, 0, 1, out)
    ref = every.view(np.float16).astype(np.float32)
    finite = np.isfinite(ref) | np.isinf(ref)
    assert np.array_equal(out[0, finite].view(np.uint32), ref[finite].view(np.uint32))
    assert np.isnan(out[0, ~finite]).all()  # NaN payloads may be quieted
    KERNELS["BF16"].dequantize_rows(f16_blocks, 0, 1, out)
    assert np.array_equal(out[0].view(np.uint32), every.astype(np.uint32) << 16)


def test_cpu_features_agree_with_proc_cpuinfo() -> None:
    features = cpu_features()
    assert features.best in ("avx512_vnni", "avx_vnni", "avx2", "portable")
    if os.environ.get("NUMBA_CPU_FEATURES"):
        pytest.skip("NUMBA_CPU_FEATURES sets the target's features (test_cpu_features_follow_numba_s_target)")
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), None)
    except OSError:
        flags = None
    if flags is None:
        pytest.skip("no /proc/cpuinfo flags")
    assert features.avx2 == ("avx2" in flags and "fma" in flags)
    assert features.avx512_vnni == ("avx512_vnni" in flags and "avx512bw" in flags)
    assert features.avx_vnni == ("avx_vnni" in flags)


@pytest.mark.parametrize("type_name", INT8_TYPES)
def test_every_int8_path_gives_the_same_bits_and_passes_precision(type_name, weights) -> None:
    """Run each int8 path explicitly (vpdpbusd, vpmaddubsw, portable widening) even where a better one
    exists; a path the host lacks compiles as portable, so it must still agree."""
    blocks = weights[type_name]
    kernel = functools.partial(legacy.matmul_int8_path, type_name)
    ref_weights = dequantized(type_name, blocks).astype(np.float64)
    rng = np.random.default_rng(6)
    for batch in (1, 3, 4, 6, 9, 16):  # every remainder of the groups of 4
        x = activations(batch, COLS, rng)
        xq, xs = quantize_activations(x)
        results = []
        for path in (simd_int8.PORTABLE, simd_int8.AVX2, simd_int8.VNNI):
            out = np.full((batch, ROWS), np.nan, np.float32)
            kernel(blocks, xq, xs, out, path)
            assert relative_error(out, dequantized_activations(xq, xs) @ ref_weights.T) <= 1e-5, path
            results.append(out)
        for out in results[1:]:
            assert np.array_equal(out.view(np.uint32), results[0].view(np.uint32))


def test_int8_paths_follow_cpu_features() -> None:
    features = cpu_features()
    paths = simd_int8.available_paths()
    assert paths[0] == simd_int8.PORTABLE
    assert (simd_int8.AVX2 in paths) == features.avx2
    assert (simd_int8.VNNI in paths) == (features.avx512_vnni or features.avx_vnni)
    assert paths[-1] == legacy.INT8_PATH


@pytest.mark.parametrize("type_name", TYPES)
def test_result_does_not_depend_on_the_thread_count(type_name, weights) -> None:
    blocks = weights[type_name]
    x = activations(5, COLS, np.random.default_rng(7))
    before = numba.get_num_threads()
    try:
        numba.set_num_threads(1)
        single = _kernel_call(type_name, "exact", blocks, x)
    finally:
        numba.set_num_threads(before)
    assert np.array_equal(single.view(np.uint32), _kernel_call(type_name, "exact", blocks, x).view(np.uint32))


@pytest.mark.parametrize("type_name", ("F16", "BF16", "F32"))
def test_float_rows_of_any_width(type_name) -> None:
    rng = np.random.default_rng(8)
    blocks = make_blocks(type_name, 9, 100, rng)  # 100: not a multiple of 16 or 32
    x = rng.standard_normal((3, 100)).astype(np.float32)
    out = np.empty((3, 9), np.float32)
    KERNELS[type_name].matmul_exact(blocks, x, out)
    ref = x.astype(np.float64) @ dequantized(type_name, blocks).astype(np.float64).T
    assert relative_error(out, ref) <= 1e-5


def test_watch_compiles_sees_a_compilation_and_not_a_second_call() -> None:
    """The compile watch counts a real compilation (and announces it once, before it starts) and
    stays silent when the kernel is already compiled."""
    from infer.engine.backends.cpu_kernels.compile_watch import watch_compiles

    @numba.njit(cache=False)
    def add_one(x):  # a fresh function: numba must compile it
        return x + 1

    announced: list[str] = []
    with watch_compiles(on_first=lambda: announced.append("start")) as first:
        assert add_one(1) == 2
        assert add_one(2.5) == 3.5  # a second signature: a second compilation
    assert (first.kernels, announced) == (2, ["start"])
    assert first.seconds > 0
    with watch_compiles(on_first=lambda: announced.append("again")) as second:
        assert add_one(3) == 4
    assert (second.kernels, second.seconds, announced) == (0, 0.0, ["start"])


@pytest.mark.slow
def test_first_run_says_it_compiles_the_kernels_and_later_runs_do_not(tmp_path, tiny_gguf) -> None:
    """An empty kernel cache: the first `generate` says on stderr that it compiles, with the time;
    the second loads from the cache and says nothing about it. Both print the same text."""
    from cli_process import infer_cli

    env = {"NUMBA_CACHE_DIR": str(tmp_path / "numba"), "INFER_HOME": str(tmp_path / "home")}
    args = (
        "generate",
        "--model",
        str(tiny_gguf),
        "--raw",
        "-n",
        "4",
        "--seed",
        "3",
        "--cpu-kernels",
        "exact",
    )
    first = infer_cli(*args, "hello", env=env)
    second = infer_cli(*args, "hello", env=env)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert re.search(r"compiling CPU kernels, once: \d+\.\d s", first.stderr), first.stderr
    assert "compiling" not in second.stderr, second.stderr
    assert first.stdout == second.stdout


@pytest.mark.parametrize("type_name", INT8_TYPES)
@pytest.mark.parametrize("cols", [32, 224])  # one block; seven (three pairs and an odd last block)
def test_int8_odd_block_counts_and_row_groups(type_name, cols) -> None:
    """The int8 kernels take blocks in pairs with an odd last block apart, and activation rows in
    groups of 8 and 1..7: every batch size 1..16 on every path matches the quantized reference, and
    each row equals itself computed alone (one activation row: two weight rows a loop, and with 21 weight
    rows the last of each tile alone)."""
    rng = np.random.default_rng(9)
    blocks = make_blocks(type_name, 21, cols, rng)
    ref_weights = dequantized(type_name, blocks).astype(np.float64)
    kernel = functools.partial(legacy.matmul_int8_path, type_name)
    pool = activations(16, cols, rng)
    xq_pool, xs_pool = quantize_activations(pool)
    for path in (simd_int8.PORTABLE, simd_int8.AVX2, simd_int8.VNNI):
        alone = np.empty((16, 21), np.float32)
        for i in range(16):
            kernel(blocks, xq_pool[i : i + 1], xs_pool[i : i + 1], alone[i : i + 1], path)
        reference = dequantized_activations(xq_pool, xs_pool) @ ref_weights.T
        assert relative_error(alone, reference) <= 1e-5, path
        for batch in range(1, 17):
            picks = rng.choice(16, size=batch, replace=False)
            out = np.full((batch, 21), np.nan, np.float32)
            kernel(
                blocks, np.ascontiguousarray(xq_pool[picks]), np.ascontiguousarray(xs_pool[picks]), out, path
            )
            assert np.array_equal(out.view(np.uint32), alone[picks].view(np.uint32)), (path, batch)


def test_cpu_features_follow_numba_s_target() -> None:
    """With numba told to compile for an AVX2 machine (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES, how the AVX2
    code is checked on an AVX-512 host), the kernels choose the AVX2 path: a VNNI instruction in code
    compiled without VNNI would not run there."""
    code = (
        "from infer.engine.backends.cpu_kernels import cpu_features, simd_int8\n"
        "f = cpu_features(); print(f.best, f.cpu_name, simd_int8.available_paths())"
    )
    env = {**os.environ, "NUMBA_CPU_NAME": "haswell", "NUMBA_CPU_FEATURES": "+avx,+avx2,+fma,+f16c,-avx512f"}
    shown = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert shown.stdout.split() == ["avx2", "haswell", "(0,", "1)"]
