"""The legacy types' tiled int8 kernel (legacy_tiles_int8.py) against their row dots (simd_int8.py) on one
matrix: GOP/s of each and the ratio, per number of activation rows, on the int8 paths asked for. What
legacy_tiles_int8.min_rows, the row count from which the public kernels take the tiled one, stands on.

    python scripts/bench_legacy_tiles.py --types q4_0,q8_0 --rows 16,32,64,256 --paths avx2,vnni

Random weights at a 1B model's MLP shape (8192 x 2048 by default); both kernels give the same bits
(tests/test_legacy_tiles.py), so only their speed differs. Best of --repeats runs each, side by side.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

from infer.engine.backends.cpu_kernels import legacy_int8, legacy_tiles_int8, simd_int8
from infer.engine.backends.cpu_kernels.activations import quantize_activations
from infer.engine.backends.cpu_kernels.features import cpu_features

PATHS = {"portable": simd_int8.PORTABLE, "avx2": simd_int8.AVX2, "vnni": simd_int8.VNNI}


def best_time(kernel, blocks, xq, xs, out, repeats: int) -> float:
    """The fastest of `repeats` timed calls, after one untimed (compilation, caches)."""
    kernel(blocks, xq, xs, out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        kernel(blocks, xq, xs, out)
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    """Print one line per (type, path, rows): row dots' and tiled GOP/s, their ratio."""
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--types", default="q4_0,q8_0")
    parser.add_argument("--paths", default="avx2,vnni")
    parser.add_argument("--rows", default="8,16,32,64,128,256,512")
    parser.add_argument("--shape", default="8192x2048", help="weight rows x columns")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    out_rows, cols = (int(v) for v in args.shape.split("x"))
    available = simd_int8.available_paths()
    features = cpu_features()
    threads = os.cpu_count()
    print(f"{features.cpu_name} ({features.best}), {threads} threads, {out_rows} x {cols}, random weights")
    rng = np.random.default_rng(0)
    weights = rng.standard_normal((out_rows, cols)).astype(np.float32)
    for kind in args.types.split(","):
        blocks = gguf_quants.quantize(weights, getattr(GGMLQuantizationType, kind.upper()))
        for name in args.paths.split(","):
            path = PATHS[name]
            if path not in available:
                print(f"{kind} {name}: not on this host")
                continue
            rows_kernel = legacy_int8.bound_kernel(kind, path, tiles=False)
            tiled = legacy_tiles_int8.tiled_kernel(kind, path)
            start = legacy_tiles_int8.min_rows(kind, path)
            start_text = "never" if start == legacy_tiles_int8.NEVER else f"from {start} rows"
            print(f"{kind} {name}: the public kernel takes the tiled one {start_text}")
            for batch in (int(v) for v in args.rows.split(",")):
                x = rng.standard_normal((batch, cols)).astype(np.float32)
                xq, xs = quantize_activations(x)
                out = np.empty((batch, out_rows), np.float32)
                ops = 2 * out_rows * cols * batch / 1e9
                row_time = best_time(rows_kernel, blocks, xq, xs, out, args.repeats)
                tiled_time = best_time(tiled, blocks, xq, xs, out, args.repeats)
                print(
                    f"{kind} {name:5} {batch:4} rows: row dots {ops / row_time:6.0f} GOP/s, "
                    f"tiled {ops / tiled_time:6.0f} GOP/s, tiled/row dots {row_time / tiled_time:5.2f}x",
                    flush=True,
                )


if __name__ == "__main__":
    main()
