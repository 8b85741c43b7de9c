"""Speed of the numba CPU kernels on the decode shapes of the default model (SmolLM2-135M).

Usage: python scripts/bench_kernels.py [--rows 1,2,4,8,16] [--repeats 30] [--threads 2] [--mode both]
       [--stat median|min] [--no-numpy]
Prints the median ms per shape and row count B for the kernels (Q4_1 layers, Q8_0 vocabulary) and for
numpy float32 x @ W.T on the same shapes, then one token's matmuls (30 layers + vocabulary) per B.
Target: B=1 token well under llama.cpp's ~7 ms on the 2-core machine; B rows far less than B x one row.
Weights are random valid blocks (timing does not depend on values), --copies distinct sets per layer
shape used in turn so they stream from memory as in a real token. BLAS is held to 1 thread around the
numba-parallel kernels and gets --threads for the numpy rows.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable

import numba
import numpy as np
from threadpoolctl import threadpool_limits

from infer.engine.backends.cpu_kernels import KERNELS, QuantKernels, cpu_features, quantize_activations

LAYERS = 30
SHAPES: tuple[tuple[str, str, int, int, int], ...] = (
    # name, GGUF type, out, in, times per token
    ("qkv", "Q4_1", 960, 576, LAYERS),
    ("o", "Q4_1", 576, 576, LAYERS),
    ("gate+up", "Q4_1", 3072, 576, LAYERS),
    ("down", "Q4_1", 576, 1536, LAYERS),
    ("vocab", "Q8_0", 49152, 576, 1),
)


def random_blocks(type_name: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random bytes with valid, small half-precision block scales (d, and m for Q4_1)."""
    kern = KERNELS[type_name]
    nb = cols // kern.block_elements
    blocks = rng.integers(0, 256, size=(rows, nb, kern.block_bytes), dtype=np.uint8)
    scales = 2 if type_name == "Q4_1" else 1
    halves = (rng.standard_normal((rows, nb, scales)) * 0.01).astype(np.float16)
    blocks[:, :, : 2 * scales] = halves.view(np.uint8)
    return blocks.reshape(rows, nb * kern.block_bytes)


def dequantized(type_name: str, blocks: np.ndarray, cols: int) -> np.ndarray:
    """float32 copy of the weights (the numpy comparison)."""
    out = np.empty((blocks.shape[0], cols), np.float32)
    KERNELS[type_name].dequantize_rows(blocks, 0, blocks.shape[0], out)
    return out


def timed_ms(fn: Callable[[], object], repeats: int, stat: str) -> float:
    """Median (or minimum) wall time in ms of `repeats` calls after three warm-up calls."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return (min(times) if stat == "min" else statistics.median(times)) * 1e3


def make_call(
    mode: str,
    kern: QuantKernels,
    blocks: list[np.ndarray],
    dense: list[np.ndarray] | None,
    x: np.ndarray,
    out: np.ndarray,
) -> Callable[[], object]:
    """One matmul of `mode` per call, cycling through the weight copies (as a token cycles through its
    layers, so the weights come from memory, not from a warm cache). int8 includes quantizing the
    activations, as a decode step would."""
    if mode == "exact":
        copies = itertools.cycle(blocks)
        return lambda: kern.matmul_exact(next(copies), x, out)
    if mode == "int8":
        assert kern.matmul_int8 is not None
        copies = itertools.cycle(blocks)
        quantize = kern.quantize or quantize_activations
        return lambda: kern.matmul_int8(next(copies), *quantize(x), out)
    assert dense is not None
    copies = itertools.cycle(dense)
    return lambda: np.matmul(x, next(copies).T, out=out)


def main() -> None:
    """Print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,8,16")
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--mode", choices=("exact", "int8", "both"), default="both")
    parser.add_argument("--no-numpy", action="store_true")
    parser.add_argument(
        "--copies", type=int, default=30, help="distinct weight sets per layer shape (1: cache-warm weights)"
    )
    parser.add_argument(
        "--stat", choices=("median", "min"), default="median", help="min is steadier on a shared machine"
    )
    args = parser.parse_args()
    row_counts = [int(v) for v in args.rows.split(",")]
    numba.set_num_threads(args.threads)
    features = cpu_features()
    print(f"threads {args.threads}, cpu {features.cpu_name} ({features.best}), numba {numba.__version__}")
    rng = np.random.default_rng(0)
    weights = {
        name: [random_blocks(t, out, cols, rng) for _ in range(min(args.copies, times))]
        for name, t, out, cols, times in SHAPES
    }
    modes = ("exact", "int8") if args.mode == "both" else (args.mode,)
    if not args.no_numpy:
        modes = (*modes, "numpy")
    totals: dict[tuple[str, int], float] = {}
    print(f"{'shape':8} {'mode':6} " + " ".join(f"{'B=' + str(b):>8}" for b in row_counts))
    for name, type_name, out_rows, cols, times in SHAPES:
        kern = KERNELS[type_name]
        dense = [dequantized(type_name, w, cols) for w in weights[name]] if "numpy" in modes else None
        for mode in modes:
            cells = []
            for rows in row_counts:
                x = rng.standard_normal((rows, cols)).astype(np.float32)
                out = np.empty((rows, out_rows), np.float32)
                call = make_call(mode, kern, weights[name], dense, x, out)
                threads = args.threads if mode == "numpy" else 1
                with threadpool_limits(threads, user_api="blas"):
                    ms = timed_ms(call, args.repeats, args.stat)
                totals[mode, rows] = totals.get((mode, rows), 0.0) + ms * times
                cells.append(f"{ms:8.3f}")
            print(f"{name:8} {mode:6} " + " ".join(cells))
    print("one token's matmuls (30 layers + vocabulary), ms; rows/s in brackets")
    for mode in modes:
        print(
            f"{'token':8} {mode:6} "
            + " ".join(f"{totals[mode, b]:8.2f}" for b in row_counts)
            + "   ("
            + " ".join(f"{b / totals[mode, b] * 1e3:.0f}" for b in row_counts)
            + ")"
        )


if __name__ == "__main__":
    main()
