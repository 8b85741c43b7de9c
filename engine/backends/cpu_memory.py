"""Memory helpers of the cpu backend: giving pages of read-only file maps back to the OS, and
viewing matrices stored back to back in one buffer as one matrix (for stacked weights)."""

from __future__ import annotations

import contextlib
import ctypes
import math
import mmap
import os
import re
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

PAGE = mmap.PAGESIZE
"""The OS page: the unit `madvise` gives back."""


def _madvise_dontneed() -> Callable[[int, int], None]:
    """madvise(addr, length, MADV_DONTNEED) through libc, or a no-op where there is none."""
    advice = getattr(mmap, "MADV_DONTNEED", None)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.madvise
    except (OSError, AttributeError):
        call = None
    if call is None or advice is None:
        return lambda address, length: None
    call.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    return lambda address, length: call(address, length, advice)


madvise = _madvise_dontneed()
"""madvise(address, length) with MADV_DONTNEED."""


def trim_heap() -> None:
    """Give the free pages inside malloc's heap back to the OS (glibc's malloc_trim; nothing where
    the C library has none)."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return
    trim.argtypes = (ctypes.c_size_t,)
    trim(0)


def anonymous_array(shape: tuple[int, ...], dtype: np.typing.DTypeLike, *, huge_pages: bool) -> np.ndarray:
    """Zeros of `shape` in fresh anonymous pages of their own, committed only as they are written (an
    untouched page reads as zeros and costs no RSS), freed with the last array over them; transparent
    huge pages asked for or declined (`huge_pages`; where the OS offers the choice)."""
    element = np.dtype(dtype)
    count = math.prod(shape)
    region = mmap.mmap(-1, max(count * element.itemsize, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE" if huge_pages else "MADV_NOHUGEPAGE", None)
    if advice is not None:
        with contextlib.suppress(OSError):  # a kernel without transparent huge pages
            region.madvise(advice)
    return np.frombuffer(region, dtype=element, count=count).reshape(shape)


def read_only(blocks: np.ndarray) -> np.ndarray:
    """`blocks` as a read-only view. numba compiles a kernel once per argument type and types a read-only
    array apart from a writable one, so weights memory-mapped from a GGUF (read-only) and weights built in
    memory (an expert stack copied together, a tensor quantized at load) would compile every kernel twice."""
    if not blocks.flags.writeable:
        return blocks
    view = blocks.view()
    view.flags.writeable = False
    return view


_SMAPS_HEADER = re.compile(r"^([0-9a-f]+)-([0-9a-f]+) (\S{4}) \S+ \S+ \S+\s*(.*)$")


def clean_library_mappings(smaps: str, library: str) -> list[tuple[int, int]]:
    """(start, end) of the mappings in `smaps` (the text of /proc/self/smaps) of a file whose name is
    `library` that are not writable and hold no page the process wrote (Private_Dirty and Anonymous
    0): code and read-only data as the file has them, which a later use maps from the page cache again.
    A library's relocated read-only data (RELRO) holds written pages and is left out."""
    found: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    dirty = 0
    for line in [*smaps.splitlines(), ""]:
        header = _SMAPS_HEADER.match(line)
        if header is not None or not line:
            if current is not None and dirty == 0:
                found.append(current)
            current, dirty = None, 0
            if header is not None:
                start, end, perms, path = header.groups()
                if Path(path).name == library and "w" not in perms:
                    current = (int(start, 16), int(end, 16))
            continue
        if current is not None and line.startswith(("Private_Dirty:", "Anonymous:")):
            dirty += int(line.split()[1])
    return found


def release_clean_library_pages(library: str) -> int:
    """Give the resident pages of `library`'s clean mappings (`clean_library_mappings`) back to the OS;
    the bytes of address space advised. 0 where there is no /proc/self/smaps."""
    try:
        smaps = Path("/proc/self/smaps").read_text()
    except OSError:
        return 0
    advised = 0
    for start, end in clean_library_mappings(smaps, library):
        madvise(start, end - start)
        advised += end - start
    return advised


def give_back_pages(array: np.ndarray) -> None:
    """madvise(MADV_DONTNEED) over the whole pages under `array`, one contiguous run of it at a time
    (partial pages at a run's ends stay): anonymous pages read as zeros afterwards, a file map's as
    the file again, and neither costs RSS until touched."""
    for start, nbytes in contiguous_runs(array):
        first = -(-start // PAGE) * PAGE
        last = (start + nbytes) // PAGE * PAGE
        if last > first:
            madvise(first, last - first)


def available_memory() -> int:
    """Bytes of memory the OS says it can give without swapping (MemAvailable), else physical memory."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


def contiguous_runs(array: np.ndarray) -> list[tuple[int, int]]:
    """(address, bytes) of each contiguous run of `array`'s memory: the array itself when it is
    contiguous, else one run per index of its leading axes (down to the contiguous trailing part)."""
    if array.size == 0:
        return []
    if array.flags.c_contiguous:
        return [(array.ctypes.data, array.nbytes)]
    return [run for sub in array for run in contiguous_runs(sub)]


def buffer_owner(array: np.ndarray) -> object:
    """The object at the end of `array`'s chain of bases: the buffer (an mmap, bytes) or the array
    that owns its memory."""
    owner: object = array
    while isinstance(owner, np.ndarray) and owner.base is not None:
        owner = owner.base
    return owner


def read_only_file_map(array: np.ndarray) -> bool:
    """`array` views a file mapped read-only (np.memmap mode "r" among its bases): giving its pages
    back (`CpuBackend.discard`) loses nothing, a later read maps them from the file again."""
    base: object = array
    while isinstance(base, np.ndarray):
        if isinstance(base, np.memmap) and base.mode == "r":
            return True
        base = base.base
    return False


def adjacent_rows(arrays: Sequence[np.ndarray]) -> np.ndarray | None:
    """One view of 2-D C-ordered arrays with rows of the same width stored back to back in the same
    buffer (each starts where the previous one ends), or None when they are not."""
    first = arrays[0]
    owner = buffer_owner(first)
    address = first.ctypes.data
    for array in arrays:
        if (
            array.ndim != 2
            or not array.flags.c_contiguous
            or array.dtype != first.dtype
            or array.shape[1] != first.shape[1]
            or array.ctypes.data != address
            or buffer_owner(array) is not owner
        ):
            return None
        address += array.nbytes
    rows = sum(array.shape[0] for array in arrays)
    return np.lib.stride_tricks.as_strided(first, (rows, first.shape[1]), first.strides, writeable=False)


def l2_cache_bytes(cpu_dir: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """The size of the first core's level-2 cache (data or unified) from sysfs, or None where it is not
    reported."""
    try:
        entries = sorted(os.listdir(cpu_dir))
    except OSError:
        return None
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    for entry in entries:
        if not entry.startswith("index"):
            continue
        try:
            level, kind, size = (
                Path(cpu_dir, entry, name).read_text().strip() for name in ("level", "type", "size")
            )
        except OSError:
            continue
        if level != "2" or kind not in ("Data", "Unified"):
            continue
        try:
            if size[-1:] in units:
                return int(size[:-1]) * units[size[-1]]
            return int(size)
        except ValueError:
            return None
    return None
