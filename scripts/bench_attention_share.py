"""Attention's share of a batch-1 decode step at long contexts, on a model at a real shape (issue 28).

Usage: python scripts/bench_attention_share.py [--model PATH] [--contexts 4096,16384] [--threads 2]
           [--cpu-kernels int8] [--kv-cache-dtype f32,f16] [--tokens 32] [--repeats 20]

A decode step at context L costs what it costs at a short context plus each layer's attention growing
with L (reading L keys and values per KV head). Prefilling 16k tokens of a 1B model takes a quarter of
an hour on two cores, so instead of prefilling, this measures the two parts apart and adds them:
  1. a plain decode step at a short context: `--tokens` greedy tokens after an 8-token prompt
     (median ms/token of 3 runs, through the engine, as `infer bench` decodes);
  2. the backend's attention for one decode row of that model's heads against a KV cache of L
     positions of random keys/values (the same `attention` call and row kernel a decode step makes),
     per layer, median of `--repeats`, at L = 8 and at each `--contexts`.
share(L) = layers x attn(L) / (step + layers x (attn(L) - attn(8))). The KV cache is stored as
`--kv-cache-dtype` says (each of a comma-separated list in turn: f32, 4 bytes a value; f16, 2): at L
positions a step reads layers x 2 x kv_heads x head_dim x bytes x L of it, printed beside the share.
Default model: the Llama 3.2 1B shape in Q4_K_M from scripts/bench_sizes.py.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_sizes import SHAPES
from llamacpp_build import default_cache_dir

from infer.engine import EngineConfig, Request, SamplingParams, load_engine
from infer.engine.backends.attention import AttentionPlan


def decode_ms(engine: object, tokens: int) -> float:
    """Median ms per decode token of a greedy generation after an 8-token prompt (3 runs + warm-up)."""
    prompt = tuple((i * 37) % 20000 + 100 for i in range(8))
    params = SamplingParams(temperature=0.0)

    def once() -> float:
        done = engine.generate(Request(prompt, params, max_tokens=tokens, ignore_eos=True, seed=1)).done  # type: ignore[attr-defined]
        return 1e3 * done.timings.decode_s / (done.usage.completion_tokens - 1)

    once()
    return statistics.median(once() for _ in range(3))


def attention_ms(engine: object, context: int, repeats: int) -> float:
    """Median ms of one layer's attention for one decode row at `context` positions (the cache in the
    engine's kv_cache_dtype)."""
    model = engine.model  # type: ignore[attr-defined]
    config, backend = model.config, model.backend
    cache = backend_cache(model, context + 1, engine.config.kv_cache_dtype)  # type: ignore[attr-defined]
    rng = np.random.default_rng(0)
    for layer in range(min(2, config.num_hidden_layers)):
        cache.keys[layer][0, :, : context + 1] = rng.standard_normal(
            cache.keys[layer][0, :, : context + 1].shape
        )
        cache.values[layer][0, :, : context + 1] = rng.standard_normal(
            cache.keys[layer][0, :, : context + 1].shape
        )
    q = rng.standard_normal((1, config.num_attention_heads, config.head_dim)).astype(np.float32)
    plan = AttentionPlan.build(np.array([0]), np.array([context]), np.array([1]))
    times = []
    for index in range(repeats + 2):
        layer = index % min(2, config.num_hidden_layers)
        started = time.perf_counter()
        backend.attention(q, cache, layer, plan)
        times.append(time.perf_counter() - started)
    return 1e3 * statistics.median(times[2:])


def backend_cache(model: object, capacity: int, kv_dtype: str) -> object:
    """A one-slot cache of two layers at the model's KV shape (two: the timed calls alternate them)."""
    from infer.engine.backends.kv_cache import KVCache

    c = model.config  # type: ignore[attr-defined]
    return KVCache.allocate(model.backend, 2, 1, c.num_key_value_heads, capacity, c.head_dim, kv_dtype)  # type: ignore[attr-defined]


def main() -> None:
    """Print the decode step, attention per layer at each context, and the share."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, help="a GGUF (default: the 1B Q4_K_M random model)")
    parser.add_argument("--contexts", default="4096,16384")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--cpu-kernels", default="int8")
    parser.add_argument("--kv-cache-dtype", default="f32", help="f32, f16, or both: f32,f16")
    parser.add_argument("--tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    import numba

    numba.set_num_threads(args.threads)
    path = (
        args.model or default_cache_dir().parent / "bench-models" / f"{SHAPES['1b'].name}-Q4_K_M-random.gguf"
    )
    if not path.is_file():
        hint = "write it with scripts/bench_sizes.py --shapes 1b --mixes Q4_K_M, or give --model"
        print(f"bench_attention_share: error: no {path}; {hint}", file=sys.stderr)
        sys.exit(2)
    for kv_dtype in args.kv_cache_dtype.split(","):
        report(path, args, kv_dtype)


def report(path: Path, args: argparse.Namespace, kv_dtype: str) -> None:
    """The step, attention per layer and share at each context, with the KV cache in `kv_dtype`."""
    engine_config = EngineConfig(ctx_size=256, max_num_seqs=1, kv_cache_dtype=kv_dtype)
    engine = load_engine(path, engine_config, cpu_kernels=args.cpu_kernels, mmap=False)  # as infer runs
    config = engine.model.config
    layers = config.num_hidden_layers
    step = decode_ms(engine, args.tokens)
    short = attention_ms(engine, 8, args.repeats)
    print(
        f"{path.name}: {layers} layers, {config.num_attention_heads} heads / {config.num_key_value_heads} "
        f"KV heads of {config.head_dim}; {args.cpu_kernels} kernels, {args.threads} threads, "
        f"kv_cache_dtype {kv_dtype}, load {os.getloadavg()[0]:.2f}"
    )
    print(f"decode step at a short context: {step:.1f} ms/token; attention per layer at 8: {short:.3f} ms")
    print(f"{'context':>8} {'attn/layer ms':>14} {'step ms':>9} {'attention share':>16} {'KV read/step':>13}")
    value_bytes = engine.cache.keys.dtype.itemsize
    for context in (int(text) for text in args.contexts.split(",")):
        attn = attention_ms(engine, context, args.repeats)
        total = step + layers * (attn - short)
        kv_bytes = layers * 2 * config.num_key_value_heads * config.head_dim * value_bytes * context
        print(
            f"{context:>8} {attn:>14.3f} {total:>9.1f} {layers * attn / total:>16.1%} "
            f"{kv_bytes / 2**20:>10.0f} MiB"
        )


if __name__ == "__main__":
    main()
