"""Watching numba compile the CPU kernels, so the CLI can say when the first run compiles them.

numba fires a `numba:compile` event only when it really compiles a kernel (a cache miss), never when
it loads one from its on-disk cache, so a run that finds the cache warm sees no event at all.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from infer.engine.backends.base import CompileReport


@contextmanager
def watch_compiles(on_first: Callable[[], None] | None = None) -> Iterator[CompileReport]:
    """Count and time numba compilations inside the block; `on_first` runs when the first one starts
    (a notice, before the wait). Only the calling thread's compilations are seen reliably, which is
    where a warm-up runs."""
    from numba.core import event

    report = CompileReport()

    class _Listener(event.Listener):
        depth = 0
        started = 0.0

        def on_start(self, ev: event.Event) -> None:
            if self.depth == 0:
                if report.kernels == 0 and on_first is not None:
                    on_first()
                self.started = time.perf_counter()
            self.depth += 1

        def on_end(self, ev: event.Event) -> None:
            self.depth -= 1
            if self.depth == 0:
                report.kernels += 1
                report.seconds += time.perf_counter() - self.started

    with event.install_listener("numba:compile", _Listener()):
        yield report
