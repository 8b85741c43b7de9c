"""The cpu backend's copies of a GGUF file map's blocks in anonymous memory (`mmap: false`), made at
once or deferred until the model is built and warm.

Why defer: a loading process's peak RSS is the weights plus everything else resident at the moment
the last of them arrive. Building a model and its first kernel calls map ~70 MiB of LLVM's code
(numba loads each compiled kernel through it) that no later step needs; copying the weights only
after that code is given back (`cpu_memory.release_clean_library_pages`) keeps it out of the peak.
Until then each matrix is a placeholder: fresh anonymous pages of its size, which cost no RSS while
untouched and read as zeros, so the warm-up runs every kernel on the real shapes and types."""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from infer.engine.backends.cpu_memory import anonymous_array, read_only, read_only_file_map

COPY_CHUNK = 4 << 20
"""Bytes copied out of a file map before its pages are given back: RSS peaks one chunk of file pages
above the model's, not one whole matrix."""


@dataclass(frozen=True)
class _Pending:
    """A copy still to make: `source` ([rows, row bytes] blocks) into rows `row` onward of the
    placeholder of `shape` whose memory is `region` (held weakly: a placeholder no weight uses any more,
    such as a part that a stack copied together again, is skipped)."""

    region: weakref.ref[mmap.mmap]
    shape: tuple[int, int]
    row: int
    source: np.ndarray


class WeightCopies:
    """Copies of read-only file-mapped blocks in anonymous memory, within a byte budget (past it the
    blocks stay mapped, so a model larger than memory still loads), each source copied once."""

    def __init__(self, budget: int, discard: Callable[[np.ndarray], None]) -> None:
        """`budget`: bytes that may be copied; `discard`: gives a file map's pages back once copied."""
        self._budget = budget
        self._discard = discard
        self._copies: weakref.WeakValueDictionary[tuple[int, int], np.ndarray] = weakref.WeakValueDictionary()
        """The copies in use, by the (address, bytes) of the mapped blocks (a tied table asked for twice
        is copied once; a part that a stack copied together again is dropped with its last user)."""
        self._segments: weakref.WeakKeyDictionary[mmap.mmap, list[tuple[int, np.ndarray]]] = (
            weakref.WeakKeyDictionary()
        )
        """Each deferred placeholder's memory -> what fills it (for `joined`)."""
        self._pending: list[_Pending] | None = None
        """The copies `deferred` has put off, in order; None when copies are made at once."""
        self.mapped_bytes = 0
        """Block bytes left memory-mapped because the budget ran out."""

    def resident(self, blocks: np.ndarray) -> np.ndarray:
        """A read-only copy of `blocks` (read-only file-mapped), or `blocks` itself past the budget."""
        key = (blocks.ctypes.data, blocks.nbytes)
        copied = self._copies.get(key)
        if copied is not None:
            return copied
        if blocks.nbytes > self._budget:
            self.mapped_bytes += blocks.nbytes
            return blocks
        self._budget -= blocks.nbytes
        if self._pending is None:
            target = np.empty(blocks.shape, dtype=blocks.dtype)
            _copy_rows(target, blocks, self._discard)
            copied = read_only(target)
        else:
            copied = self._placeholder((blocks.shape[0], blocks.shape[1]), [(0, blocks)])
        self._copies[key] = copied
        return copied

    def joined(self, parts: Sequence[np.ndarray]) -> np.ndarray | None:
        """Inside `deferred`, one placeholder for `parts` (2-D blocks of one row width) stacked
        row-wise, filled when the copies are made: from the sources of the parts that are
        placeholders, from the others as they are. None outside `deferred` (the caller concatenates)."""
        if self._pending is None:
            return None
        segments: list[tuple[int, np.ndarray]] = []
        row = 0
        for part in parts:
            region = _region(part)
            inner = self._segments.get(region) if region is not None else None
            segments += [(row + r, source) for r, source in inner] if inner is not None else [(row, part)]
            row += part.shape[0]
        return self._placeholder((row, parts[0].shape[1]), segments)

    def _placeholder(self, shape: tuple[int, int], segments: list[tuple[int, np.ndarray]]) -> np.ndarray:
        """Untouched anonymous pages of `shape` (uint8) that the end of `deferred` fills from `segments`
        (each a first row and the blocks that go there)."""
        assert self._pending is not None
        target = anonymous_array(shape, np.uint8, huge_pages=True)
        region = _region(target)
        assert region is not None
        self._pending += [_Pending(weakref.ref(region), shape, row, source) for row, source in segments]
        self._segments[region] = segments
        return read_only(target)

    @contextmanager
    def deferred(self, before_copying: Callable[[], None] = lambda: None) -> Iterator[None]:
        """Copies asked for inside are placeholders, made when the block ends without an exception:
        `before_copying` first, then each placeholder still in use is filled, in order."""
        if self._pending is not None:  # nested: the outer block copies
            yield
            return
        self._pending = []
        try:
            yield
            pending = self._pending
        finally:
            self._pending = None
            self._segments = weakref.WeakKeyDictionary()
        before_copying()
        for job in pending:
            region = job.region()
            if region is None:
                continue
            target = np.frombuffer(region, dtype=np.uint8).reshape(job.shape)
            _copy_rows(target[job.row : job.row + len(job.source)], job.source, self._discard)
            del target, region


def _region(array: np.ndarray) -> mmap.mmap | None:
    """The anonymous map under a placeholder (the base at the end of its chain), else None."""
    owner: object = array
    while isinstance(owner, np.ndarray):
        owner = owner.base
    if isinstance(owner, memoryview):  # np.frombuffer's base: a view of the buffer's exporter
        owner = owner.obj
    return owner if isinstance(owner, mmap.mmap) else None


def _copy_rows(target: np.ndarray, source: np.ndarray, discard: Callable[[np.ndarray], None]) -> None:
    """target[:] = source in chunks of COPY_CHUNK bytes, each chunk's pages given back at once when
    `source` is a read-only file map (a later read maps them from the file again)."""
    file_map = read_only_file_map(source)
    step = max(1, COPY_CHUNK // max(1, source.strides[0]))  # leading-axis entries per chunk
    for start in range(0, len(source), step):
        part = source[start : start + step]
        target[start : start + step] = part
        if file_map:
            discard(part)
