"""Shared pieces of the benchmark scripts: loading, the pure-matmul ceiling, timing helpers."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable

import numpy as np

from infer.cli.model_store import ensure_default_model
from infer.engine.backends.kv_cache import KVCache
from infer.engine.models.llama import LlamaModel
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine


def load_default(config: EngineConfig) -> Engine:
    """The default model in an engine with `config`."""
    return load_engine(ensure_default_model(), config)


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far, in MB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def median_seconds(fn: Callable[[], object], repeats: int) -> float:
    """Median wall time of `repeats` calls after one warm-up call."""
    fn()
    return statistics.median(timed(fn) for _ in range(repeats))


def matmul_step(model: LlamaModel, rows: int) -> Callable[[], None]:
    """One step's matmuls alone (every weight of every layer plus the vocabulary projection, `rows`
    rows, through the backend's own linear/logits): what numpy cannot beat, the yardstick for
    framework overhead."""
    weights_step = _matmuls(model, rows, None)
    return lambda: weights_step(0)


def attention_matmul_step(model: LlamaModel, cache: KVCache, rows: int) -> Callable[[int], None]:
    """:func:`matmul_step` plus each layer's two decode-attention matmuls (scores = q @ keys.T and
    probabilities @ values over `width` cached positions of slots 0..rows-1 of `cache`, in the
    layer order a real step reads them): every matmul of a decode step, on the cache's own memory."""
    return _matmuls(model, rows, cache)


def _matmuls(model: LlamaModel, rows: int, cache: KVCache | None) -> Callable[[int], None]:
    config = model.config
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, config.hidden_size)).astype(np.float32)
    h = rng.standard_normal((rows, config.intermediate_size)).astype(np.float32)
    a = rng.standard_normal((rows, config.num_attention_heads * config.head_dim)).astype(np.float32)
    kv_heads = config.num_key_value_heads
    group = config.num_attention_heads // kv_heads
    q = rng.standard_normal((rows, kv_heads, group, config.head_dim)).astype(np.float32)
    capacity = cache.capacity if cache is not None else 0
    probabilities = rng.random((rows, kv_heads, group, capacity)).astype(np.float32)
    linear = model.backend.linear

    def step(width: int) -> None:
        for index, layer in enumerate(model.layers):
            linear(x, layer.qkv)
            if cache is not None and width:
                q @ cache.keys[index, :rows, :, :width].transpose(0, 1, 3, 2)
                probabilities[..., :width] @ cache.values[index, :rows, :, :width]
            linear(a, layer.out)
            linear(x, layer.gate_up)
            linear(h, layer.down)
        model.backend.logits(x, model.lm_head)

    return step


def matmul_ceiling(model: LlamaModel, rows: int, repeats: int = 5) -> float:
    """Median seconds of :func:`matmul_step` with `rows` rows."""
    return median_seconds(matmul_step(model, rows), repeats)


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
