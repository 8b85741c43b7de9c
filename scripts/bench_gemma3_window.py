"""Measure what the sliding window saves in Gemma 3 decode: the window view (sliding layers read only
their last `sliding_window` cached positions) against the same model with every layer global, at a
few context lengths, side by side in one run.

    python scripts/bench_gemma3_window.py [--positions 256 1024 2048] [--steps 8]

The cache itself is the same size either way (a window view, not a ring): the saving is attention
compute and memory traffic, which grows with the context for global layers only.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from infer.cli.model_store import GEMMA3_270M, pull
from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model


def decode_ms(model, position: int, steps: int) -> float:
    """Median milliseconds of one decode step at `position` (the cache before it is filled with keys
    of random tokens by chunked prefill)."""
    cache = model.make_cache(1, position + steps + 1)
    ids = np.random.default_rng(0).integers(3, 1000, position)
    for start in range(0, position, 512):
        chunk = ids[start : start + 512]
        model.forward(
            ForwardBatch(chunk, (Segment(0, start, len(chunk)),), np.asarray([len(chunk) - 1])), cache
        )
    times = []
    for step in range(steps):
        batch = ForwardBatch(np.asarray([5]), (Segment(0, position + step, 1),), np.asarray([0]))
        began = time.perf_counter()
        model.forward(batch, cache)
        times.append(time.perf_counter() - began)
    return 1000 * float(np.median(times))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, nargs="+", default=[256, 1024, 2048])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    path = pull(GEMMA3_270M)
    windowed = build_model(load_checkpoint(path), CpuBackend(kernels="exact"))
    checkpoint = load_checkpoint(path)
    checkpoint.config = replace(checkpoint.config, sliding_window=1 << 30)
    unwindowed = build_model(checkpoint, CpuBackend(kernels="exact"))
    print("position  window-view ms/step  all-global ms/step  ratio")
    for position in args.positions:
        a, b = decode_ms(windowed, position, args.steps), decode_ms(unwindowed, position, args.steps)
        print(f"{position:8d}  {a:19.1f}  {b:18.1f}  {b / a:5.2f}")


if __name__ == "__main__":
    main()
