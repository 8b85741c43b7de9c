"""What the cpu backend sets up around its numba kernels: the process (numba's cache folder,
OpenMP's wait policy, BLAS threads, numba's BLAS probe skipped), the kernels' thread count in each
thread that runs steps, and the watch that tells the CLI when loading compiles them.

The `blas` mode runs no numba kernel: it only pins BLAS threads when a count is fixed, and imports
no numba.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from infer.engine.backends.base import BackendOptions, CompileReport, HostSetup
from infer.engine.backends.cpu_threads import KernelThreads, LoadPolicy, others_busy, threads_for, usable_cpus
from infer.engine.backends.openmp_pool import release_calling_thread_pool


def uses_kernels(options: BackendOptions) -> bool:
    """Whether the matmuls run on the numba kernels (every mode but `blas`)."""
    return options.kernels != "blas"


def prepare_process(options: BackendOptions, cache_home: Path) -> None:
    """Before the kernels are imported: numba's cache folder and OpenMP's wait policy, and BLAS
    (long prefill attention only) on one thread, since two spinning thread pools on the same cores
    slow each other down 2x. In the `blas` mode only BLAS's count, when one is fixed."""
    if not uses_kernels(options):
        HostSetup.prepare_process(options, cache_home)
        return
    from threadpoolctl import threadpool_limits

    use_kernel_cache(cache_home)
    idle_threads_sleep()
    skip_numba_blas_probe()
    threadpool_limits(limits=1, user_api="blas")


def threads_note(options: BackendOptions) -> str:
    """How many threads the matmuls would run on: a count the user fixed, or (threads 0 with the
    kernels) every core while they are free, fewer while other processes keep some busy."""
    cores = os.cpu_count() or 1
    if options.threads:
        return f"threads: {options.threads} (fixed)"
    if not uses_kernels(options):
        return f"threads: {cores} (all cores)"
    return f"threads: up to {cores}, one fewer per core other processes keep busy (-t N fixes it)"


def threads_warning(options: BackendOptions, others: float | None = None) -> str | None:
    """A warning when a fixed thread count (`-t N`) asks for more cores than other processes leave
    free: threads then share cores with them and a step waits for the slowest (seen: 5.5 tok/s
    where the adaptive default gave 76). `others`: cores they keep busy (measured now when None).
    None when the count is not fixed or fits (one thread always fits: no sample is taken)."""
    if options.threads <= 1:
        return None
    cpus = usable_cpus()
    cores = len(cpus) if cpus else (os.cpu_count() or 1)
    if others is None:
        others = others_busy(cpus=cpus)
    if others is None:
        return None
    free = threads_for(others, cores, LoadPolicy().drop_above)
    if options.threads <= free:
        return None
    return (
        f"-t {options.threads}: other processes keep {others:.1f} of the {cores} cores busy, so "
        f"{options.threads} threads share cores with them and run far slower; the adaptive default "
        f"(-t 0) would use {free} now and follow the load"
    )


def use_kernel_cache(cache_home: Path) -> None:
    """Point numba's compiled-kernel cache at `cache_home/numba/KEY` when the package folder is
    read-only (a system or wheel install), so kernels compile once per machine, not once per run. KEY
    names the kernel sources (cpu_kernels/cache_freshness.py): an upgrade compiles into a folder of
    its own and the folders of other sources are deleted then. Must run before the kernels are
    imported; a NUMBA_CACHE_DIR the user set wins (and keeping it fresh is the user's part)."""
    package = Path(__file__).parent
    if "NUMBA_CACHE_DIR" in os.environ or os.access(package, os.W_OK):
        return  # a writable package caches beside its sources, kept fresh as the package loads
    from infer.engine.backends.cpu_kernels.cache_freshness import sources_key

    folders = cache_home / "numba"
    current = folders / sources_key()
    if not current.is_dir() and folders.is_dir():
        for other in folders.iterdir():  # compiled from other sources: never loaded again
            if other.is_dir():
                shutil.rmtree(other, ignore_errors=True)
    os.environ["NUMBA_CACHE_DIR"] = str(current)


NUMBA_BLAS_PROBE = "scipy.linalg.cython_blas"
"""The module numba imports, when SciPy is installed, to learn whether compiled code may call BLAS."""


def skip_numba_blas_probe() -> None:
    """Mark NUMBA_BLAS_PROBE absent before numba's array functions load. When SciPy is installed, numba
    imports all of scipy.linalg at that point only to find out whether compiled code may call BLAS
    (np.dot, np.linalg inside a kernel); no kernel here does, and the import cost a loading process
    ~125 ms and 15 MiB of its peak RSS (infer generate on the 1B Q4_K_M shape: 957 -> 942 MiB).
    numba then refuses BLAS calls in code it compiles (a kernel that made one would fail to compile
    with "scipy 0.16+ is required for linear algebra"). Nothing when numba's array functions or
    scipy.linalg are loaded already: a process that uses them keeps them."""
    if "numba.np.arraymath" not in sys.modules and "scipy.linalg" not in sys.modules:
        sys.modules.setdefault(NUMBA_BLAS_PROBE, None)  # type: ignore[arg-type]


def idle_threads_sleep() -> None:
    """Let the kernels' OpenMP threads spin only briefly at a barrier, then sleep, unless the user
    chose a policy (OMP_WAIT_POLICY or GOMP_SPINCOUNT).

    Endless spinning waits for a partner the OS has not scheduled: with other processes on the cores,
    decode fell to 1-3 tok/s (scripts/bench_contention.py). Sleeping at once (PASSIVE) costs a futex
    wake per parallel region: decode fell from ~185 to ~63 tok/s on an idle 2-core machine. ACTIVE
    with a bounded count (20,000 spins, some tens of microseconds: longer than the gap between two
    kernels of one step, far shorter than a time slice) keeps both. libgomp caps the spin at 1,000
    whenever its threads outnumber the cores, as the engine's step thread's pool beside the loading
    thread's did: `release_thread` frees the latter when the step thread starts (openmp_pool.py).
    Must run before the kernels' first parallel call."""
    if "OMP_WAIT_POLICY" in os.environ or "GOMP_SPINCOUNT" in os.environ:
        return
    os.environ["OMP_WAIT_POLICY"] = "ACTIVE"
    os.environ["GOMP_SPINCOUNT"] = "20000"


def set_kernel_threads(threads: int) -> None:
    """Run the numba kernels called from this thread on `threads` threads (numba's count is per
    calling thread, so the engine's step thread sets it too)."""
    import numba

    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))


def watch_compiles(
    options: BackendOptions, on_first: Callable[[], None]
) -> AbstractContextManager[CompileReport]:
    """numba's compilations inside the block, in the kernel modes (see cpu_kernels/compile_watch.py)."""
    if not uses_kernels(options):
        return HostSetup.watch_compiles(options, on_first)
    from infer.engine.backends.cpu_kernels.compile_watch import watch_compiles as watch_numba

    return watch_numba(on_first=on_first)


class StepThreads:
    """The kernels' thread count in the threads that run engine steps: a fixed count set in the
    building thread and in the step thread, or (threads 0) a count adapted to the load before each
    step (cpu_threads.py), or (threads None, or the `blas` mode) numba's own count, left alone."""

    def __init__(self, options: BackendOptions) -> None:
        self.kernels = kernels = uses_kernels(options)
        """Whether the matmuls run on the numba kernels (not the `blas` mode)."""
        self.fixed = options.threads if kernels and options.threads else None
        """The count the user fixed, or None."""
        self.adaptive: KernelThreads | None = (
            KernelThreads.for_this_machine() if kernels and options.threads == 0 else None
        )
        """The controller that follows the load (threads 0 with the kernels), or None."""
        if self.fixed is not None:
            set_kernel_threads(self.fixed)  # for steps run in this thread

    def prepare_thread(self) -> None:
        """In the step thread: the fixed count (an adapted one is set before each step anyway)."""
        if self.fixed is not None:
            set_kernel_threads(self.fixed)

    def prepare_step(self) -> None:
        """Before each step: the count for the load now, when it adapts."""
        if self.adaptive is not None:
            self.adaptive.before_step()

    def reason(self) -> str:
        """Why the kernels run on the threads they do, in one line."""
        if not self.kernels:
            return "the blas mode: the matmuls run on BLAS's own threads"
        if self.fixed is not None:
            return f"fixed by -t {self.fixed}"
        if self.adaptive is not None:
            return self.adaptive.controller.reason()
        return "numba's own count (NUMBA_NUM_THREADS)"


class CpuSetup(HostSetup):
    """The cpu backend's hooks around its ops (see base.HostSetup for what each one is for); the
    backend class inherits them and sets `step_threads` when it is built."""

    step_threads: StepThreads

    @classmethod
    def from_options(cls, options: BackendOptions) -> Any:
        """The backend in `options.kernels` mode, its kernels on `options.threads` threads."""
        return cls(options.dtype, kernels=options.kernels, threads=options.threads, mmap=options.mmap)  # type: ignore[call-arg]

    @staticmethod
    def prepare_process(options: BackendOptions, cache_home: Path) -> None:
        """numba's cache folder, OpenMP's wait policy and BLAS threads (see `prepare_process`)."""
        prepare_process(options, cache_home)

    @staticmethod
    def watch_compiles(
        options: BackendOptions, on_first: Callable[[], None]
    ) -> AbstractContextManager[CompileReport]:
        """numba's kernel compilations in the block (none in the `blas` mode)."""
        return watch_compiles(options, on_first)

    @staticmethod
    def threads_note(options: BackendOptions) -> str | None:
        """The thread count the matmuls would run on (see `threads_note`)."""
        return threads_note(options)

    @staticmethod
    def threads_warning(options: BackendOptions) -> str | None:
        """A fixed thread count larger than the cores free now (see `threads_warning`)."""
        return threads_warning(options)

    def prepare_thread(self) -> None:
        """The step thread runs the kernels on the fixed thread count, if one is."""
        self.step_threads.prepare_thread()

    def release_thread(self) -> None:
        """Free this thread's OpenMP pool before the step thread starts (openmp_pool.py: with both
        pools alive libgomp makes every worker sleep between kernels)."""
        if self.step_threads.kernels:
            release_calling_thread_pool()

    def prepare_step(self) -> None:
        """The kernels' thread count for the load now, when it adapts (threads 0)."""
        self.step_threads.prepare_step()

    def threads_reason(self) -> str | None:
        """Why the matmuls run on the threads they do (see `StepThreads.reason`)."""
        return self.step_threads.reason()

    def kernel_threads_now(self) -> int | None:
        """numba's thread count in this thread in the kernel modes; None with `blas`."""
        if not self.step_threads.kernels:
            return None
        import numba

        return int(numba.get_num_threads())
