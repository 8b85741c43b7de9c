"""The worker-process mechanism behind chat templates and grammar compiles (issue 29): a job that
crashes in native code, spins, allocates past its memory or outlives its time ends the worker and
comes back as a `WorkerFailure`, never as a crash of the caller, and the next job gets a fresh one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from infer.engine.workers import WorkerFailure, WorkerLimits, WorkerProcess

HANDLER = Path(__file__).with_name("worker_handlers.py")


@pytest.fixture
def worker() -> WorkerProcess:
    with WorkerProcess(
        HANDLER, WorkerLimits(timeout_s=3.0, memory_mb=64, cpu_s=1.0), name="test worker"
    ) as box:
        yield box


def test_a_job_round_trips_and_the_worker_is_kept(worker: WorkerProcess) -> None:
    assert worker.call({"do": "echo", "value": [1, "x"]}) == {"echo": [1, "x"]}
    pid = worker.pid
    assert worker.call({"do": "echo", "value": 2}) == {"echo": 2}
    assert worker.pid == pid


def test_an_exception_is_a_one_line_error_reply(worker: WorkerProcess) -> None:
    assert worker.call({"do": "raise"}) == {"error": "ValueError: asked to fail"}


def test_a_native_crash_is_a_failure_and_the_next_job_gets_a_new_worker(worker: WorkerProcess) -> None:
    first = worker.call({"do": "echo"}) and worker.pid
    with pytest.raises(WorkerFailure) as info:
        worker.call({"do": "segfault"})
    assert info.value.exit_code == -signal.SIGSEGV and not info.value.timed_out
    assert worker.pid is None
    assert worker.call({"do": "echo", "value": 3}) == {"echo": 3}
    assert worker.pid not in (None, first)


def test_cpu_time_past_the_limit_ends_the_worker() -> None:
    # the wall-clock limit is far away: the kernel's CPU limit (whole seconds) ends the spin first
    with WorkerProcess(HANDLER, WorkerLimits(timeout_s=60.0, memory_mb=64, cpu_s=1.0)) as box:
        box.start()
        started = time.process_time()
        with pytest.raises(WorkerFailure) as info:
            box.call({"do": "spin"})
        assert info.value.exit_code == -signal.SIGXCPU, info.value
        assert not info.value.timed_out
        assert time.process_time() - started < 1.0  # the caller only waited


def test_wall_time_past_the_limit_kills_the_worker() -> None:
    limits = WorkerLimits(timeout_s=0.5, memory_mb=64)
    with WorkerProcess(HANDLER, limits) as box:
        box.start()
        pid = box.pid
        with pytest.raises(WorkerFailure) as info:
            box.call({"do": "sleep", "seconds": 30})
        assert info.value.timed_out
        assert box.pid is None
        assert pid is not None
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)  # killed and reaped


def test_memory_past_the_limit_is_refused(worker: WorkerProcess) -> None:
    assert worker.call({"do": "allocate", "mb": 8}) == {"size": 8 * 2**20}
    assert worker.call({"do": "allocate", "mb": 512}) == {"error": "needed more than 64 MiB"}


def test_jobs_run_on_the_stack_asked_for() -> None:
    with WorkerProcess(HANDLER, WorkerLimits(timeout_s=5.0, memory_mb=64, stack_mb=3)) as box:
        assert box.call({"do": "stack"}) == {"stack": 3 * 2**20}


def test_a_request_that_is_not_json_data_is_a_type_error(worker: WorkerProcess) -> None:
    with pytest.raises(TypeError):
        worker.call({"do": "echo", "value": object()})
