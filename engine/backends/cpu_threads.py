"""How many threads the cpu backend's numba kernels run on, step by step, when the user fixed none.

Why: a decode step makes ~300 parallel kernel calls, and each call waits at its end for the slowest of
its threads. When another process keeps a core busy, the thread that shares that core runs only when
the scheduler gives it a slice, so every call waits for it: on the 2-core reference machine decode fell
from ~200 tok/s quiet to 3-50 tok/s at 2 threads with one competing process, while 1 thread kept
~110-130 tok/s (scripts/bench_contention.py; prefill of 400 tokens: 9.7 s at 2 threads vs 3.9 s at 1).

How: from /proc/stat (every core's busy time) minus this process's own CPU time, the controller
estimates how many cores *other* processes keep busy, over windows of `interval_s` of wall time, and
runs the kernels on the cores left for it. Measuring the load, not the step times, needs no probing:
trying the larger count under contention costs a 100-300 ms step per try, the price of dozens of
decode steps. Niced processes do not count (the scheduler lets ours preempt them at once), unless
this process is niced too. Thresholds differ for dropping and raising a thread so that noise near a
threshold does not flip the count on every window.

The kernels split work over output rows and heads only, never over a reduction, so the count changes
no bit of any result (tests/test_cpu_threads.py checks a forward at 1 and at every count).
"""

from __future__ import annotations

import functools
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

_CLOCK_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True)
class CpuSample:
    """Cumulative times at one instant, in seconds: the wall clock, this process's CPU time, and the
    busy time of all cores together (what other processes may have used is the difference)."""

    wall: float
    own: float
    busy: float


def parse_proc_stat(text: str, cpus: frozenset[int] | None = None, *, count_nice: bool = False) -> float:
    """Seconds the cores `cpus` (every core, from the total line, when None) were busy, from /proc/stat:
    user, system, irq, softirq and steal time (a hypervisor taking the core is contention too), plus
    nice time only when `count_nice`. Only the cores this process may run on matter: in a container
    limited to some of the host's cores the total line counts every host process."""
    ticks = 0
    for line in text.splitlines():
        if not line.startswith("cpu"):
            break  # the per-core lines come first
        name, *values = line.split()
        if (name != "cpu") if cpus is None else (name == "cpu" or int(name[3:]) not in cpus):
            continue
        user, nice, system, _idle, _iowait, irq, softirq, steal = ([int(v) for v in values[:8]] + [0] * 8)[:8]
        ticks += user + system + irq + softirq + steal + (nice if count_nice else 0)
    return ticks / _CLOCK_TICKS


def read_cpu_sample(cpus: frozenset[int] | None = None) -> CpuSample | None:
    """A CpuSample now (busy time of the cores `cpus`, all when None), or None where there is no
    /proc/stat (not Linux)."""
    try:
        with open("/proc/stat", encoding="ascii") as stat:
            text = stat.read()
    except OSError:
        return None
    niced = hasattr(os, "getpriority") and os.getpriority(os.PRIO_PROCESS, 0) > 0
    busy = parse_proc_stat(text, cpus, count_nice=niced)
    return CpuSample(time.perf_counter(), time.process_time(), busy)


def others_between(start: CpuSample, end: CpuSample) -> float:
    """Cores other processes kept busy between two samples (end after start): the cores' busy time
    less this process's CPU time, per second of wall clock."""
    return max(0.0, ((end.busy - start.busy) - (end.own - start.own)) / (end.wall - start.wall))


def usable_cpus() -> frozenset[int] | None:
    """The cores this process may run on (None where the OS does not say)."""
    if not hasattr(os, "sched_getaffinity"):
        return None
    return frozenset(os.sched_getaffinity(0))


@dataclass(frozen=True)
class LoadPolicy:
    """When to change the thread count (in cores kept busy by other processes)."""

    interval_s: float = 0.25
    """Shortest window between two estimates: /proc/stat counts in 10 ms ticks per core, so a
    quarter of a second measures the load to about 0.1 core."""
    drop_above: float = 0.4
    """Run one thread fewer once other processes use this much more than the cores we leave them.
    A competitor sharing a core with a kernel thread gets at least ~0.5 of it, so it shows above this."""
    raise_below: float = 0.25
    """Take a core back only when other processes use less than this of it (measured while we leave
    it to them, so what they ask for shows in full)."""


def threads_for(others: float, cores: int, slack: float) -> int:
    """The most threads, 1..cores, that leave `others` cores (minus `slack`) to other processes."""
    return max(1, min(cores, cores - math.ceil(others - slack)))


@dataclass
class AdaptiveThreads:
    """The controller: the thread count for the next step, from CPU samples (no clock, no I/O here,
    so its decisions are tested on synthetic samples). Starts at every core."""

    cores: int
    policy: LoadPolicy = LoadPolicy()
    current: int = 0
    """The count chosen (0 until constructed: then `cores`)."""
    others: float | None = None
    """Cores other processes kept busy in the last window (None before the first)."""
    fewest: int = 0
    """The lowest count chosen so far (0 until constructed: then `current`)."""
    _start: CpuSample | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.cores = max(1, self.cores)
        if not 1 <= self.current <= self.cores:
            self.current = self.cores
        self.fewest = self.current

    def due(self, now: float) -> bool:
        """Whether a window has passed since the last estimate (or none was started)."""
        return self._start is None or now - self._start.wall >= self.policy.interval_s

    def observe(self, sample: CpuSample) -> int:
        """Close the window ending at `sample` (the first sample only opens one) and return the count."""
        start, self._start = self._start, sample
        if start is None or sample.wall <= start.wall:
            return self.current
        others = others_between(start, sample)
        self.others = others
        lower = threads_for(others, self.cores, self.policy.drop_above)
        higher = threads_for(others, self.cores, self.policy.raise_below)
        if lower < self.current:
            self.current = lower
        elif higher > self.current:
            self.current = higher
        self.fewest = min(self.fewest, self.current)
        return self.current

    def reason(self) -> str:
        """Why the count is what it is, in one line (`infer bench` shows it beside the count)."""
        if self.others is None:
            return f"adaptive: {self.current} of {self.cores} cores (no load measured yet)"
        line = (
            f"adaptive: {self.current} of {self.cores} cores, other processes kept {self.others:.1f} "
            f"busy in the last {self.policy.interval_s:g} s window"
        )
        if self.fewest < self.current:
            line += f" (as few as {self.fewest} earlier)"
        return line + ("; -t N fixes the count" if self.current < self.cores else "")


def others_busy(window_s: float = 0.25, cpus: frozenset[int] | None = None) -> float | None:
    """Cores other processes keep busy now, measured over `window_s` (None without /proc/stat)."""
    start = read_cpu_sample(cpus)
    if start is None:
        return None
    time.sleep(window_s)
    end = read_cpu_sample(cpus)
    if end is None or end.wall <= start.wall:
        return None
    return others_between(start, end)


def _set_numba_threads(count: int) -> None:
    import numba

    numba.set_num_threads(min(count, numba.config.NUMBA_NUM_THREADS))


@dataclass
class KernelThreads:
    """Applies an AdaptiveThreads' count to the numba kernels before each engine step, in the thread
    that runs the step (numba keeps the count per calling thread)."""

    controller: AdaptiveThreads
    read: Callable[[], CpuSample | None] = read_cpu_sample
    clock: Callable[[], float] = time.perf_counter
    apply: Callable[[int], None] = _set_numba_threads
    _measurable: bool = field(default=True, repr=False)

    @classmethod
    def for_this_machine(cls, policy: LoadPolicy | None = None) -> KernelThreads:
        """A controller over numba's thread pool, at most one thread per core this process may run on,
        measuring the load on those cores; its first window opens now."""
        import numba

        cpus = usable_cpus()
        cores = (
            numba.config.NUMBA_NUM_THREADS if cpus is None else min(numba.config.NUMBA_NUM_THREADS, len(cpus))
        )
        threads = cls(
            AdaptiveThreads(cores, policy or LoadPolicy()), read=functools.partial(read_cpu_sample, cpus)
        )
        threads.before_step()
        return threads

    def before_step(self) -> int:
        """Estimate the load when a window has passed, set the kernels' count; returns it."""
        if self._measurable and self.controller.due(self.clock()):
            sample = self.read()
            if sample is None:  # no /proc/stat: every core, as with no controller
                self._measurable = False
            else:
                self.controller.observe(sample)
        self.apply(self.controller.current)
        return self.controller.current
