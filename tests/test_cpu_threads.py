"""The cpu kernels' thread count adapts to the load (engine/backends/cpu_threads.py): the controller's
decisions on synthetic CPU samples, a count the user fixes wins, and no count changes a result."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path

import numba
import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.backends.cpu_threads import (
    AdaptiveThreads,
    CpuSample,
    KernelThreads,
    LoadPolicy,
    parse_proc_stat,
    read_cpu_sample,
    threads_for,
    usable_cpus,
)
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.runtime.engine import Engine, EngineConfig
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

pytest_plugins = ["conftest_synthetic"]


class Machine:
    """Synthetic /proc/stat and process clocks: `run(seconds, ours, others)` advances the wall clock
    with this process using `ours` cores and other processes `others` cores."""

    def __init__(self) -> None:
        self.wall = 100.0
        self.own = 5.0
        self.busy = 50.0

    def run(self, seconds: float, ours: float, others: float) -> CpuSample:
        self.wall += seconds
        self.own += seconds * ours
        self.busy += seconds * (ours + others)
        return self.sample()

    def sample(self) -> CpuSample:
        return CpuSample(self.wall, self.own, self.busy)


def test_the_count_follows_other_processes_with_hysteresis() -> None:
    machine = Machine()
    control = AdaptiveThreads(2)
    assert control.current == 2 and control.observe(machine.sample()) == 2  # the first only opens a window
    assert control.observe(machine.run(0.25, ours=2.0, others=0.1)) == 2  # background noise: keep both
    # A competitor on one core gets at least half of it beside a kernel thread: drop that thread.
    assert control.observe(machine.run(0.25, ours=1.5, others=0.55)) == 1
    assert control.others == pytest.approx(0.55)
    assert control.observe(machine.run(0.25, ours=1.0, others=1.0)) == 1  # it now takes its whole core
    # Between the thresholds nothing changes either way (no flip-flop on noise).
    assert control.observe(machine.run(0.25, ours=1.0, others=0.3)) == 1
    assert control.observe(machine.run(0.25, ours=1.0, others=0.1)) == 2  # the core is free again
    assert control.observe(machine.run(0.25, ours=2.0, others=0.35)) == 2


def test_the_reason_names_the_load_behind_the_count() -> None:
    machine = Machine()
    control = AdaptiveThreads(2)
    assert control.reason() == "adaptive: 2 of 2 cores (no load measured yet)"
    control.observe(machine.sample())
    control.observe(machine.run(0.25, ours=1.0, others=1.0))
    assert control.reason() == (
        "adaptive: 1 of 2 cores, other processes kept 1.0 busy in the last 0.25 s window; "
        "-t N fixes the count"
    )
    control.observe(machine.run(0.25, ours=1.0, others=0.1))
    assert control.reason() == (
        "adaptive: 2 of 2 cores, other processes kept 0.1 busy in the last 0.25 s window "
        "(as few as 1 earlier)"
    )


def test_many_cores_leave_what_other_processes_use() -> None:
    machine = Machine()
    control = AdaptiveThreads(8)
    control.observe(machine.sample())
    assert control.observe(machine.run(0.5, ours=8.0, others=2.7)) == 5
    assert control.observe(machine.run(0.5, ours=5.0, others=2.9)) == 5
    assert control.observe(machine.run(0.5, ours=5.0, others=1.2)) == 7  # within one core's slack
    assert control.observe(machine.run(0.5, ours=6.0, others=20.0)) == 1  # never below one thread
    assert [threads_for(load, 4, 0.4) for load in (0.0, 0.4, 0.41, 1.4, 3.5, 9.0)] == [4, 4, 3, 3, 1, 1]


def test_a_window_closes_only_after_the_interval() -> None:
    control = AdaptiveThreads(2, LoadPolicy(interval_s=0.25))
    assert control.due(0.0)
    control.observe(CpuSample(10.0, 0.0, 0.0))
    assert not control.due(10.2) and control.due(10.25)
    # A sample at the same instant (or a clock that went back) decides nothing.
    assert control.observe(CpuSample(10.0, 0.0, 9.0)) == 2 and control.others is None


def test_busy_time_of_the_usable_cores_nice_only_for_a_niced_process() -> None:
    text = "cpu  1100 500 200 9000 40 10 20 30 0 0\ncpu0 1000 500 150 4000 0 10 20 30 0 0\n"
    text += "cpu1 100 0 50 5000 40 0 0 0 0 0\nintr 5 1 2\ncpu7 99999 0 0 0\n"
    hz = os.sysconf("SC_CLK_TCK")
    assert parse_proc_stat(text) * hz == pytest.approx(1100 + 200 + 10 + 20 + 30)
    assert parse_proc_stat(text, count_nice=True) * hz == pytest.approx(1360 + 500)
    assert parse_proc_stat(text, frozenset({1})) * hz == pytest.approx(150)
    assert parse_proc_stat(text, frozenset({0, 1}), count_nice=True) * hz == pytest.approx(1860)


def test_kernel_threads_reads_once_per_window_and_applies_every_step() -> None:
    machine = Machine()
    reads: list[CpuSample] = []
    applied: list[int] = []

    def read() -> CpuSample:
        reads.append(machine.sample())
        return reads[-1]

    threads = KernelThreads(AdaptiveThreads(2), read=read, clock=lambda: machine.wall, apply=applied.append)
    threads.before_step()  # opens the window
    machine.run(0.1, ours=2.0, others=1.0)
    threads.before_step()  # too early to decide
    machine.run(0.2, ours=1.5, others=1.0)
    threads.before_step()
    assert len(reads) == 2 and applied == [2, 2, 1]


def test_without_proc_stat_every_core_is_used_and_nothing_is_read_again() -> None:
    calls: list[None] = []

    def missing() -> None:
        calls.append(None)

    applied: list[int] = []
    threads = KernelThreads(AdaptiveThreads(4), read=missing, apply=applied.append)
    for _ in range(3):
        threads.before_step()
    assert len(calls) == 1 and applied == [4, 4, 4]


def test_this_machine_is_measurable() -> None:
    sample = read_cpu_sample()
    if sample is None:
        pytest.skip("no /proc/stat here")
    assert sample.busy > 0 and sample.own > 0
    cpus = usable_cpus()
    if cpus is not None:
        assert 0 < read_cpu_sample(cpus).busy <= read_cpu_sample().busy + 0.1


def test_a_fixed_thread_count_disables_the_adaptation(tiny_gguf: Path) -> None:
    from infer.cli.options import resolve_or_fail
    from infer.cli.runtime import open_engine

    fixed = open_engine(resolve_or_fail({"threads": "1", "model": str(tiny_gguf)}, env={}))
    assert fixed.backend.step_threads.adaptive is None and fixed.backend.step_threads.fixed == 1
    adaptive = open_engine(resolve_or_fail({"model": str(tiny_gguf)}, env={}))
    assert adaptive.backend.step_threads.adaptive is not None
    cpus = usable_cpus()
    cores = numba.config.NUMBA_NUM_THREADS if cpus is None else min(len(cpus), numba.config.NUMBA_NUM_THREADS)
    assert adaptive.backend.step_threads.adaptive.controller.cores == cores
    blas = open_engine(resolve_or_fail({"model": str(tiny_gguf), "cpu_kernels": "blas"}, env={}))
    assert blas.backend.step_threads.adaptive is None  # the count applies to the numba kernels only
    assert blas.backend.step_threads.fixed is None
    assert fixed.backend.threads_reason() == "fixed by -t 1"
    assert adaptive.backend.threads_reason().startswith(f"adaptive: {cores} of {cores} cores")
    assert blas.backend.threads_reason() == "the blas mode: the matmuls run on BLAS's own threads"


def test_a_library_built_backend_leaves_the_count_alone(tiny_gguf: Path) -> None:
    """threads None (the default outside the CLI): neither fixed nor adapted."""
    model, _ = _load(tiny_gguf, "exact", threads=None)
    assert model.backend.step_threads.adaptive is None and model.backend.step_threads.fixed is None


def test_the_step_thread_runs_on_the_count_the_controller_chose(tiny_gguf: Path) -> None:
    """numba keeps its count per thread: the background step thread gets the controller's count."""
    engine = Engine(*_load(tiny_gguf, "exact", threads=0), EngineConfig(ctx_size=64, max_num_seqs=1))
    adaptive = engine.backend.step_threads.adaptive
    assert adaptive is not None
    adaptive.controller.current = 1
    adaptive.read = lambda: None  # no load estimate may raise it back
    seen: list[int] = []
    ran = threading.Event()
    forward = engine.model.forward

    def counting_forward(*args: object) -> np.ndarray:
        seen.append(numba.get_num_threads())
        ran.set()
        return forward(*args)

    engine.model.forward = counting_forward  # type: ignore[method-assign]
    engine.start()
    try:
        stream = engine.submit(
            Request((5, 6, 7), SamplingParams(temperature=0.0), max_tokens=3, ignore_eos=True)
        )
        stream.result()
    finally:
        engine.shutdown()
    assert ran.is_set() and set(seen) == {1}


def _load(path: Path, mode: str, threads: int | None = None) -> tuple[object, object]:
    checkpoint = load_checkpoint(path)
    return build_model(checkpoint, CpuBackend(kernels=mode, threads=threads)), checkpoint.tokenizer


def _logits(model, threads: int, prompt: list[int], steps: int) -> list[np.ndarray]:
    """Prefill `prompt` then decode `steps` fixed tokens, every forward on `threads` kernel threads."""
    before = numba.get_num_threads()
    numba.set_num_threads(threads)
    try:
        cache = model.make_cache(1, 64)
        rows = [model.forward(_batch(prompt, 0), cache)]
        for index in range(steps):
            rows.append(model.forward(_batch([3 + index], len(prompt) + index), cache))
        return rows
    finally:
        numba.set_num_threads(before)


def _batch(tokens: list[int], start: int) -> ForwardBatch:
    ids = np.asarray(tokens, dtype=np.int64)
    return ForwardBatch(ids, (Segment(0, start, len(tokens)),), np.arange(len(tokens), dtype=np.int64))


@pytest.mark.parametrize(("quant", "mode"), [("Q8_0", "exact"), ("Q4_0", "int8"), ("Q4_K", "exact")])
def test_a_forward_is_bit_identical_at_every_thread_count(
    tiny_model_factory: Callable[..., object], quant: str, mode: str
) -> None:
    """Prefill (more rows than one kernel group, so BLAS attention too) and decode steps."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: nothing to compare")
    tiny = tiny_model_factory(quant=quant, kv_heads=2, layers=2, hidden=256, intermediate=512)
    model, _ = _load(tiny.gguf_path, mode)
    prompt = [int(t) for t in np.random.default_rng(3).integers(3, model.vocab_size, 40)]
    reference = _logits(model, 1, prompt, 4)
    for threads in range(2, numba.config.NUMBA_NUM_THREADS + 1):
        for one, other in zip(reference, _logits(model, threads, prompt, 4), strict=True):
            assert np.array_equal(one.view(np.uint32), other.view(np.uint32)), threads


def test_tokens_do_not_change_when_the_count_changes_every_step(tiny_gguf: Path) -> None:
    """An engine whose count flips on every step gives the tokens of one that never adapts."""
    if numba.config.NUMBA_NUM_THREADS < 2:
        pytest.skip("one core: nothing to flip")
    request = Request((5, 6, 7, 8), SamplingParams(temperature=0.9, seed=11), max_tokens=12, ignore_eos=True)
    steady = Engine(*_load(tiny_gguf, "exact"), EngineConfig(ctx_size=64, max_num_seqs=1)).generate(request)
    flipping = Engine(*_load(tiny_gguf, "exact", threads=0), EngineConfig(ctx_size=64, max_num_seqs=1))
    adaptive = flipping.backend.step_threads.adaptive
    assert adaptive is not None
    counts = iter([1, 2] * 20)
    adaptive.read = lambda: None
    adaptive.apply = lambda _count: numba.set_num_threads(next(counts))
    assert flipping.generate(request).done.token_ids == steady.done.token_ids


def test_the_backend_says_how_many_threads_its_matmuls_run_on() -> None:
    """`infer profiles show`'s threads line comes from the backend, not from the CLI."""
    from infer.engine import BackendOptions, threads_note

    cores = os.cpu_count() or 1
    assert threads_note(BackendOptions("cpu", kernels="exact", threads=3)) == "threads: 3 (fixed)"
    assert threads_note(BackendOptions("cpu", kernels="blas", threads=0)) == f"threads: {cores} (all cores)"
    assert "one fewer per core" in threads_note(BackendOptions("cpu", kernels="exact", threads=0))
    assert threads_note(BackendOptions("cuda", threads=0)) is None  # its matmuls are not on the host
