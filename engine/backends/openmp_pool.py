"""Freeing the OpenMP thread pool a thread holds, when numba's kernels run on OpenMP.

libgomp keeps one pool of worker threads per thread that starts parallel regions, and it counts every
pool's threads together: once they outnumber the cores it replaces the spin at each region's barrier
(GOMP_SPINCOUNT, `cpu_setup.idle_threads_sleep`) by a 1,000-iteration "throttled" one, so the workers
go to sleep between two kernels and each of a step's hundreds of parallel regions waits for a futex
wake. That is what happened when the engine's steps moved to its background thread: the thread that
loaded the model (warm-up, prompt tests) kept its pool, and the step thread's pool came on top. On
the 2-core Intel VM `infer generate` decoded the default model at 149 tok/s against 179 for the same
steps in the loading thread, and a 16-stream step of the 1B shape took 184 ms against 166. Pausing
the loading thread's pool (OpenMP 5.0's omp_pause_resource_all, soft) before the step thread starts
gives the step thread the whole count back: the step thread's figures match the loading thread's.
A later parallel region in the paused thread builds a new pool (some microseconds).
"""

from __future__ import annotations

import ctypes
import os

OMP_PAUSE_SOFT = 1
"""omp_pause_resource_kind: free the threads, keep what a later region needs to build them again."""

_RUNTIMES = ("libgomp.so.1", "libiomp5.so", "libomp.so")
"""The OpenMP runtimes numba's `omp` threading layer may be linked against (GNU, Intel, LLVM)."""


def _loaded_runtime() -> ctypes.CDLL | None:
    """The OpenMP runtime already in this process (RTLD_NOLOAD: never load one), or None."""
    mode = getattr(os, "RTLD_NOLOAD", 0) | getattr(os, "RTLD_LAZY", 1)
    for name in _RUNTIMES:
        try:
            runtime = ctypes.CDLL(name, mode=mode)
        except OSError:
            continue
        if hasattr(runtime, "omp_pause_resource_all"):
            return runtime
    return None


def numba_uses_openmp() -> bool:
    """Whether numba's parallel kernels have started on its OpenMP threading layer in this process."""
    import numba

    try:
        return numba.threading_layer() == "omp"
    except ValueError:  # no parallel kernel has run yet: no pool anywhere
        return False


def release_calling_thread_pool() -> bool:
    """Free the OpenMP pool of the calling thread (its worker threads end), when numba runs on OpenMP;
    True when the runtime was asked to. Call it outside any parallel region, in a thread that will
    start no kernel for a while: the next one rebuilds the pool."""
    if not numba_uses_openmp():
        return False
    runtime = _loaded_runtime()
    if runtime is None:
        return False
    runtime.omp_pause_resource_all.argtypes = [ctypes.c_int]
    runtime.omp_pause_resource_all.restype = ctypes.c_int
    return runtime.omp_pause_resource_all(OMP_PAUSE_SOFT) == 0
