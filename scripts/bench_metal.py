"""The metal backend (MLX) beside the numpy backend on the default model: prefill and decode tok/s.

Usage: python scripts/bench_metal.py [--prompt-tokens 128] [--decode-tokens 32] [--streams 4] [--repeats 3]
On a Mac this measures Metal; on Linux with `mlx[cpu]` it measures MLX's CPU build. The engines run
interleaved (one measurement of each per repeat) so a busy machine slows them alike; the best of the
repeats is printed with its ratio to numpy (the cpu backend with its `exact` kernels).
"""

from __future__ import annotations

import argparse
import time

from infer.cli.model_store import ensure_default_model
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def measure(engine: Engine, prompt: tuple[int, ...], decode_tokens: int, streams: int) -> tuple[float, ...]:
    """(prefill tok/s, 1-stream decode tok/s, `streams`-stream aggregate decode tok/s)."""
    done = engine.generate(Request(prompt, GREEDY, max_tokens=1, ignore_eos=True)).done
    prefill = len(prompt) / done.timings.prefill_s
    done = engine.generate(Request(prompt[:8], GREEDY, max_tokens=decode_tokens, ignore_eos=True)).done
    single = done.timings.decode_tokens_per_s(done.usage.completion_tokens)
    started = time.perf_counter()
    requests = [
        Request(prompt[i : i + 8], GREEDY, max_tokens=decode_tokens, ignore_eos=True) for i in range(streams)
    ]
    results = [s.result() for s in [engine.submit(r) for r in requests]]
    aggregate = sum(r.done.usage.completion_tokens for r in results) / (time.perf_counter() - started)
    return prefill, single, aggregate


def main() -> None:
    """Print one line per engine: the best figures of the repeats and their ratio to numpy."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--decode-tokens", type=int, default=32)
    parser.add_argument("--streams", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    import mlx.core as mx

    path = ensure_default_model()
    config = EngineConfig(ctx_size=512, max_num_seqs=max(4, args.streams), batch_size=512)
    engines = {
        "numpy (cpu, exact kernels)": load_engine(path, config, "cpu", cpu_kernels="exact"),
        "mlx float32 (Q4_1 quantized)": load_engine(path, config, "metal", "float32"),
        "mlx float16": load_engine(path, config, "metal", "float16"),
    }
    print(f"mlx {mx.__version__} on {mx.default_device()}; default model; {args.repeats} interleaved repeats")
    prompt = tuple((i * 37) % 20000 + 100 for i in range(args.prompt_tokens))
    best: dict[str, list[float]] = {name: [0.0, 0.0, 0.0] for name in engines}
    for _ in range(args.repeats):
        for name, engine in engines.items():
            figures = measure(engine, prompt, args.decode_tokens, args.streams)
            best[name] = [max(a, b) for a, b in zip(best[name], figures, strict=True)]
    base = best[next(iter(engines))]
    header = f"{'engine':30} {'prefill tok/s':>14} {'decode tok/s':>13} {f'{args.streams}-stream tok/s':>15}"
    print(header)
    for name, (prefill, single, aggregate) in best.items():
        print(
            f"{name:30} {prefill:8.1f} ({prefill / base[0]:4.2f}x) {single:7.1f} ({single / base[1]:4.2f}x)"
            f" {aggregate:8.1f} ({aggregate / base[2]:4.2f}x)"
        )


if __name__ == "__main__":
    main()
