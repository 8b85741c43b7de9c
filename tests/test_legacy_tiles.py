"""The tiled int8 kernel of the legacy types (legacy_tiles_int8.py) against the row dots: every output
row has the bits the row dots give that activation row alone, on every int8 path, for every group
remainder, an odd last block and weight rows past a whole tile."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from infer.engine.backends.cpu_kernels import legacy_int8, legacy_tiles_int8, simd_int8
from infer.engine.backends.cpu_kernels.activations import quantize_activations

TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")
PATHS = (simd_int8.PORTABLE, simd_int8.AVX2, simd_int8.VNNI)


def _blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    weights = rng.standard_normal((rows, cols)).astype(np.float32)
    weights[0] *= 40.0  # large scales: Q8_0 quants reach -128..127, the nibble types their extremes
    return gguf_quants.quantize(weights, getattr(GGMLQuantizationType, type_name))


@pytest.mark.parametrize("type_name", TYPES)
def test_tiled_rows_have_the_bits_of_each_row_alone(type_name) -> None:
    rng = np.random.default_rng(11)
    kind = type_name.lower()
    for rows, cols in ((37, 96), (16, 256)):  # 3 blocks: a pair and an odd last one; 37: a tile and more
        blocks = _blocks(type_name, rows, cols, rng)
        x = rng.standard_normal((40, cols)).astype(np.float32)
        x[3] = 0.0  # an all-zero row: scales 0
        xq, xs = quantize_activations(x)
        alone = np.empty((40, rows), np.float32)
        for b in range(40):
            legacy_int8.matmul_int8_path(type_name, blocks, xq[b : b + 1], xs[b : b + 1], alone[b : b + 1], 1)
        for path in PATHS:
            for batch in (1, 9, 17, 40):  # one lane, part of a group, a group and more, several groups
                out = np.full((batch, rows), np.nan, np.float32)
                legacy_tiles_int8.tiled_kernel(kind, path)(blocks, xq[:batch], xs[:batch], out)
                assert np.array_equal(out.view(np.uint32), alone[:batch].view(np.uint32)), (path, batch)
                rows_out = np.full((batch, rows), np.nan, np.float32)
                legacy_int8.bound_kernel(kind, path, tiles=False)(blocks, xq[:batch], xs[:batch], rows_out)
                assert np.array_equal(rows_out.view(np.uint32), out.view(np.uint32)), (path, batch)


def test_the_public_kernels_take_the_tiled_kernel_from_min_rows_with_the_same_bits() -> None:
    rng = np.random.default_rng(12)
    path = legacy_int8.INT8_PATH
    start = legacy_tiles_int8.min_rows("q4_0", path)
    if start == legacy_tiles_int8.NEVER:
        pytest.skip("this host's int8 path never takes the tiled kernel")
    blocks = _blocks("Q4_0", 24, 128, rng)
    x = rng.standard_normal((start + 3, 128)).astype(np.float32)
    xq, xs = quantize_activations(x)
    batched = np.empty((start + 3, 24), np.float32)
    legacy_int8.q4_0_matmul_int8(blocks, xq, xs, batched)
    tiled = np.empty_like(batched)
    legacy_tiles_int8.tiled_kernel("q4_0", path)(blocks, xq, xs, tiled)
    below = np.empty((start - 1, 24), np.float32)
    legacy_int8.q4_0_matmul_int8(blocks, xq[: start - 1], xs[: start - 1], below)
    assert np.array_equal(batched.view(np.uint32), tiled.view(np.uint32))
    assert np.array_equal(below.view(np.uint32), batched[: start - 1].view(np.uint32))


def test_min_rows_follows_the_paths_the_host_runs() -> None:
    paths = simd_int8.available_paths()
    assert legacy_tiles_int8.min_rows("q4_0", simd_int8.PORTABLE) == legacy_tiles_int8.NEVER
    assert (legacy_tiles_int8.min_rows("q4_0", simd_int8.VNNI) < legacy_tiles_int8.NEVER) == (
        simd_int8.VNNI in paths
    )
    assert legacy_tiles_int8.min_rows("q8_0", simd_int8.AVX2) == legacy_tiles_int8.NEVER


def test_bench_legacy_tiles_prints_both_kernels_and_their_ratio() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "bench_legacy_tiles.py"
    args = ["--types", "q4_0", "--paths", "portable", "--rows", "3,17", "--shape", "32x64", "--repeats", "1"]
    done = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True, check=True)
    lines = [line for line in done.stdout.splitlines() if " rows: row dots " in line]
    assert [line.split()[2] for line in lines] == ["3", "17"]
    assert all("GOP/s, tiled" in line and line.endswith("x") for line in lines)
    assert "q4_0 portable: the public kernel takes the tiled one never" in done.stdout
