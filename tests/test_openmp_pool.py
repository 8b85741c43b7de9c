"""The thread that starts the engine's background step thread frees its OpenMP pool first
(engine/backends/openmp_pool.py): with two pools alive libgomp throttles every worker's spin, and a
step thread's kernels waited on futex wakes (`infer generate` 0.90x the same steps in the loading
thread). Here: the release ends the pool's worker threads, kernels in that thread still run (on a new
pool) with the same result, and Engine.start releases the calling thread before the loop starts,
only where the matmuls run on numba's kernels."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import numba
import numpy as np
import pytest
from numba import njit, prange

from infer.engine.backends import cpu_setup, openmp_pool
from infer.engine.backends.cpu import CpuBackend
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.runtime.engine import Engine, EngineConfig
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]


@njit(parallel=True)
def _squares(values: np.ndarray) -> np.ndarray:
    out = np.empty_like(values)
    for i in prange(values.shape[0]):
        out[i] = values[i] * values[i]
    return out


def _threads_now() -> int:
    return len(os.listdir("/proc/self/task"))


def _needs_openmp_pool() -> None:
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: a pool has no workers")
    if not Path("/proc/self/task").is_dir():
        pytest.skip("no /proc/self/task to count threads")
    _squares(np.arange(8.0))
    if not openmp_pool.numba_uses_openmp():
        pytest.skip("numba runs on another threading layer here")


def test_releasing_a_threads_pool_ends_its_workers_and_kernels_still_run() -> None:
    _needs_openmp_pool()
    seen: dict[str, object] = {}
    values = np.arange(64.0)

    def in_a_fresh_thread() -> None:  # a pool of its own, whatever the main thread holds
        numba.set_num_threads(2)
        _squares(values)
        with_pool = _threads_now()
        seen["released"] = openmp_pool.release_calling_thread_pool()
        deadline = time.monotonic() + 5
        while _threads_now() >= with_pool and time.monotonic() < deadline:
            time.sleep(0.01)
        seen["dropped"] = with_pool - _threads_now()
        seen["again"] = _squares(values)  # a new pool
        seen["rebuilt"] = _threads_now() - (with_pool - int(seen["dropped"]))

    worker = threading.Thread(target=in_a_fresh_thread)
    worker.start()
    worker.join()
    assert seen["released"] is True
    assert seen["dropped"] == 1  # the pool's one worker (the calling thread is the other member)
    assert np.array_equal(seen["again"], values * values)
    assert seen["rebuilt"] == 1


def test_without_a_parallel_kernel_there_is_nothing_to_release(monkeypatch: pytest.MonkeyPatch) -> None:
    def uninitialised() -> str:
        raise ValueError("Threading layer is not initialized.")

    monkeypatch.setattr(numba, "threading_layer", uninitialised)
    assert openmp_pool.numba_uses_openmp() is False
    assert openmp_pool.release_calling_thread_pool() is False


def _engine(path: Path, mode: str) -> Engine:
    checkpoint = load_checkpoint(path)
    model = build_model(checkpoint, CpuBackend(kernels=mode, threads=2))
    return Engine(model, checkpoint.tokenizer, EngineConfig(ctx_size=64, max_num_seqs=2))


@pytest.mark.parametrize(("mode", "releases"), [("int8", True), ("blas", False)])
def test_start_releases_the_calling_threads_pool_before_the_loop_runs(
    tiny_gguf: Path, monkeypatch: pytest.MonkeyPatch, mode: str, releases: bool
) -> None:
    engine = _engine(tiny_gguf, mode)
    request = Request((5, 6, 7, 8), SamplingParams(temperature=0.7, seed=3), max_tokens=6, ignore_eos=True)
    in_this_thread = engine.generate(request).done.token_ids  # steps in this thread
    calls: list[tuple[threading.Thread, int]] = []

    def spy() -> bool:
        loops = [t for t in threading.enumerate() if t.name == "infer-engine"]
        calls.append((threading.current_thread(), len(loops)))
        return True

    monkeypatch.setattr(cpu_setup, "release_calling_thread_pool", spy)
    engine.start()
    try:
        in_the_loop = engine.submit(request).result().token_ids
    finally:
        engine.shutdown()
    assert calls == ([(threading.current_thread(), 0)] if releases else [])
    assert in_the_loop == in_this_thread
