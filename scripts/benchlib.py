"""Shared pieces of the benchmark scripts: loading, the pure-matmul ceiling, timing helpers."""

from __future__ import annotations

import resource
import statistics
import time
from collections.abc import Callable

import numpy as np

from infer.engine.engine import Engine, EngineConfig, load_engine
from infer.engine.model_store import ensure_default_model
from infer.engine.models.llama import LlamaModel


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
    hidden = model.config.hidden_size
    x = np.random.default_rng(0).standard_normal((rows, hidden)).astype(np.float32)
    inter = model.config.intermediate_size
    q_width = model.config.num_attention_heads * model.config.head_dim
    h = np.random.default_rng(1).standard_normal((rows, inter)).astype(np.float32)
    a = np.random.default_rng(2).standard_normal((rows, q_width)).astype(np.float32)
    linear = model.backend.linear

    def step() -> None:
        for layer in model.layers:
            linear(x, layer.qkv)
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
