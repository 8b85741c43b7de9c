"""Benchmark the K-quant CPU kernels (Q4_K, Q5_K, Q6_K) against numpy float32 `x @ W.T`.

    python scripts/bench_kquants.py [--threads 2] [--repeats 50] [--compile]

Prints the median ms of `matmul_exact`, `matmul_int8` (kernel only, activations already quantized) and
`dequantize_rows` (whole matrix) for B in 1, 4, 16 on shapes 640x2048 and 2048x768 (out x in), beside
numpy's float32 matmul on the dequantized weights, plus cold variants of exact and numpy (weights cycled
through 256 MB of copies, so that they come from DRAM as in a real decode step). Numba runs on `--threads`
threads with BLAS held to one thread around it (mixing the two pools costs milliseconds per switch); numpy
gets `--threads` BLAS threads. On a shared, loaded machine use `--threads 1`: a parallel launch whose second
core is busy waits a scheduler tick (4-16 ms medians for both engines).
`--compile` first measures numba compile time in fresh subprocesses: cold (empty cache folder) and warm.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from functools import partial

import numba
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from threadpoolctl import threadpool_limits

from infer.engine.backends.cpu_kernels.kquants_int8 import KQUANT_KERNELS
from infer.engine.backends.cpu_kernels.registry import QuantKernels

SHAPES = [(640, 2048), (2048, 768)]
"""(out, in). Gemma 3 270M's 2048x640 (in = 640) cannot be a K-quant tensor (rows are whole 256-weight
super-blocks; llama.cpp falls back to another type there), so the second shape uses in = 768."""
BATCHES = [1, 4, 16]

_FIRST_CALL = """
import time, numpy as np
t0 = time.perf_counter()
from infer.engine.backends.cpu_kernels.kquants_int8 import KQUANT_KERNELS
for k in KQUANT_KERNELS.values():
    w = np.zeros((8, k.block_bytes), np.uint8)
    x = np.zeros((1, 256), np.float32)
    k.matmul_exact(w, x, np.empty((1, 8), np.float32))
    k.matmul_int8(w, *k.quantize(x), np.empty((1, 8), np.float32))
    k.dequantize_rows(w, 0, 8, np.empty((8, 256), np.float32))
print(time.perf_counter() - t0)
"""


def random_blocks(type_name: str, n_out: int, n_in: int, rng: np.random.Generator) -> np.ndarray:
    """Random valid blocks: random scale/quant bytes, finite f16 d and dmin."""
    kern = KQUANT_KERNELS[type_name]
    n_sb = n_in // 256
    raw = rng.integers(0, 256, size=(n_out, n_sb, kern.block_bytes), dtype=np.uint8)
    halves = (rng.standard_normal((n_out, n_sb, 2)) * 0.01).astype(np.float16).view(np.uint8)
    if type_name == "Q6_K":
        raw[:, :, 208:210] = halves[:, :, 0:2]
    else:
        raw[:, :, 0:4] = halves.reshape(n_out, n_sb, 4)
    return raw.reshape(n_out, n_sb * kern.block_bytes)


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after three warm-up calls, in ms."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def compile_seconds() -> tuple[float, float]:
    """Import + first call of every kernel in a fresh interpreter: cold (empty cache) and warm."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        command = [sys.executable, "-c", _FIRST_CALL]
        runs = [
            float(subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout)
            for _ in range(2)
        ]
    return runs[0], runs[1]


COLD_BYTES = 256 << 20
"""Weights cycled through for the cold columns: more than any last-level cache, as in a real decode step
where every matrix comes from DRAM once per token."""


def cycling(fn: Callable[[int], object], n: int) -> Callable[[], None]:
    """A call that runs fn(0), fn(1), ..., fn(n - 1), fn(0), ... on successive calls."""
    state = [0]

    def call() -> None:
        fn(state[0])
        state[0] = (state[0] + 1) % n

    return call


def bench_shape(kern: QuantKernels, n_out: int, n_in: int, args: argparse.Namespace) -> None:
    """Print one table line per batch size for one type and shape."""
    rng = np.random.default_rng(n_out * 7 + n_in)
    blocks = random_blocks(kern.type_name, n_out, n_in, rng)
    w = dequantize(blocks, GGMLQuantizationType[kern.type_name]).reshape(n_out, n_in)
    copies = max(2, COLD_BYTES // w.nbytes)
    cold_w = np.broadcast_to(w, (copies, n_out, n_in)).copy()
    cold_blocks = np.broadcast_to(blocks, (copies, *blocks.shape)).copy()
    tile = np.empty((n_out, n_in), np.float32)
    with threadpool_limits(1):
        dq = median_ms(partial(kern.dequantize_rows, blocks, 0, n_out, tile), args.repeats)
    for n_b in BATCHES:
        x = rng.standard_normal((n_b, n_in)).astype(np.float32)
        acts = kern.quantize(x)
        out = np.empty((n_b, n_out), np.float32)
        with threadpool_limits(1):
            exact = median_ms(partial(kern.matmul_exact, blocks, x, out), args.repeats)
            int8 = median_ms(partial(kern.matmul_int8, blocks, *acts, out), args.repeats)
            exact_cold = median_ms(
                cycling(lambda i, x=x, out=out: kern.matmul_exact(cold_blocks[i], x, out), copies),
                args.repeats,
            )
        with threadpool_limits(args.threads):
            ref = median_ms(partial(np.matmul, x, w.T), args.repeats)
            ref_cold = median_ms(cycling(lambda i, x=x: x @ cold_w[i].T, copies), args.repeats)
        print(
            f"{kern.type_name:5} {f'{n_out}x{n_in}':>10} {n_b:3d} {exact:8.3f} {int8:8.3f} {ref:8.3f}"
            f" {exact_cold:8.3f} {ref_cold:8.3f} {dq:8.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--compile", action="store_true", help="also measure cold and warm compile time")
    args = parser.parse_args()
    if args.compile:
        cold, warm = compile_seconds()
        print(f"compile (import + first call of all 9 kernels): cold {cold:.1f} s, warm {warm:.2f} s")
    numba.set_num_threads(args.threads)
    print(f"threads {args.threads}, median of {args.repeats}, ms; cold: weights cycled through 256 MB copies")
    print(f"{'type':5} {'out x in':>10} {'B':>3} {'exact':>8} {'int8':>8} {'numpy':>8}", end="")
    print(f" {'ex cold':>8} {'np cold':>8} {'dequant':>8}")
    for kern in KQUANT_KERNELS.values():
        for n_out, n_in in SHAPES:
            bench_shape(kern, n_out, n_in, args)


if __name__ == "__main__":
    main()
