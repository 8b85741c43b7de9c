"""Watching numba compile the CPU kernels, so the CLI can say when the first run compiles them.

numba fires a `numba:compile` event only when it really compiles a kernel (a cache miss), never when
it loads one from its on-disk cache, so a run that finds the cache warm sees no event at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field


@dataclass
class CompileReport:
    """What numba compiled while a `watch_compiles` block ran."""

    kernels: int = 0
    """Top-level compilations (functions a kernel calls compile inside its own event)."""
    seconds: float = 0.0
    """Wall time spent compiling."""
    _depth: int = field(default=0, repr=False)
    _started: float = field(default=0.0, repr=False)


@contextmanager
def watch_compiles(on_first: Callable[[], None] | None = None) -> Iterator[CompileReport]:
    """Count and time numba compilations inside the block; `on_first` runs when the first one starts
    (a notice, before the wait). Only the calling thread's compilations are seen reliably, which is
    where a warm-up runs."""
    from numba.core import event

    report = CompileReport()

    class _Listener(event.Listener):
        def on_start(self, ev: event.Event) -> None:
            if report._depth == 0:
                if report.kernels == 0 and on_first is not None:
                    on_first()
                report._started = time.perf_counter()
            report._depth += 1

        def on_end(self, ev: event.Event) -> None:
            report._depth -= 1
            if report._depth == 0:
                report.kernels += 1
                report.seconds += time.perf_counter() - report._started

    with event.install_listener("numba:compile", _Listener()):
        yield report
