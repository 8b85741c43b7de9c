"""The engine's warm-up and the loading block around it: what runs before the first request, and that
the cpu backend's deferred weight copies (`mmap: false`, the default) give the mapped model's tokens."""

from __future__ import annotations

from typing import Any

import numpy as np

from infer.engine.batch import ForwardBatch
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.executor import Executor
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]


class _RecordingModel:
    """Records each forward's segments and logit rows."""

    def __init__(self) -> None:
        self.batches: list[tuple[list[tuple[int, int, int]], list[int], list[int]]] = []

    def forward(self, batch: ForwardBatch, cache: Any) -> np.ndarray:
        segments = [(s.slot, s.start, s.length) for s in batch.segments]
        self.batches.append((segments, batch.token_ids.tolist(), batch.logit_rows.tolist()))
        return np.zeros((len(batch.logit_rows), 8), dtype=np.float32)


def test_warm_up_runs_a_decode_row_and_a_two_row_prefill_in_the_slot() -> None:
    """A decode row loads the decode path's kernels and a two-row prefill the row ops a short prompt
    and a batch of decode rows call, so neither happens inside the first request."""
    model = _RecordingModel()
    Executor(model, cache=None).warm_up(3)  # type: ignore[arg-type]
    assert model.batches == [([(3, 0, 1)], [0], [0]), ([(3, 0, 2)], [0, 0], [1])]


def test_copied_weights_give_the_mapped_models_tokens(tiny_model_factory) -> None:
    """load_engine builds and warms up on the copies' placeholders and fills them as loading ends:
    seeded sampled tokens equal the memory-mapped engine's, for a model whose stacks join parts."""
    model = tiny_model_factory(quant="Q8_0", tied=True, kv_heads=2)
    request = Request(
        tuple(range(3, 12)), SamplingParams(temperature=0.8, seed=5), max_tokens=12, ignore_eos=True
    )
    tokens = {}
    for mmap in (True, False):
        engine = load_engine(model.gguf_path, EngineConfig(), cpu_kernels="int8", mmap=mmap)
        try:
            tokens[mmap] = engine.generate(request).token_ids
        finally:
            engine.shutdown()
    assert tokens[False] == tokens[True] and len(tokens[True]) == 12
