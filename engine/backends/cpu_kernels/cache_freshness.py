"""Keep numba's cached kernels in step with the kernel sources they were compiled from.

numba checks a cached function against its own source file only (numba 0.68: a sha256 of that file),
while a kernel's machine code also holds what it called and inlined from the other kernel modules (the
LLVM-IR builders of simd*.py, the tiled kernels...). A change to one of those alone (a `git pull`, an
upgrade that keeps the driver file as it was) would leave the old code in every caller's cache entry
and run it. So every cache entry here belongs to one version of the whole package: `sources_key` is a
hash of every module in it, the in-tree cache folder (`__pycache__`, where numba writes beside a
writable package) is emptied of numba's files when the key it was written under differs, and a cache
folder infer chooses (cpu_setup.use_kernel_cache) is named after the key.

Imports no numba (the package's import runs this).
"""

from __future__ import annotations

import hashlib
import os
from contextlib import suppress
from pathlib import Path

KERNELS_FOLDER = Path(__file__).parent
"""The kernel package: every module numba compiles lives here."""

MARKER = "infer-kernel-sources"
"""The file in a cache folder that names the sources key its entries were compiled from."""

NUMBA_CACHE_FILES = ("*.nbi", "*.nbc")
"""numba's cache files: an index per function, the compiled data per signature (index first, so
that no index outlives its data)."""


def sources_key(folder: Path = KERNELS_FOLDER) -> str:
    """A hash (16 hex digits) of every module's name and bytes in `folder`: it changes with any edit
    of any kernel source (~0.3 ms for the package's ~300 KB)."""
    digest = hashlib.sha256()
    for path in sorted(folder.glob("*.py")):
        digest.update(path.name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:16]


def drop_stale_entries(cache: Path, key: str) -> bool:
    """Delete numba's cache files in `cache` unless its marker names `key`, then write the marker.
    True when files were dropped (or the folder was new); nothing when `cache` cannot be written.

    Two processes that both see a stale marker both delete: the later one may remove entries the
    earlier just saved, which costs a compilation, never a wrong kernel (each entry comes from the
    sources the marker names once written)."""
    marker = cache / MARKER
    with suppress(OSError):
        if marker.read_text() == key:
            return False
    try:
        cache.mkdir(parents=True, exist_ok=True)
    except OSError:
        return False
    if not os.access(cache, os.W_OK):
        return False
    for pattern in NUMBA_CACHE_FILES:
        for entry in cache.glob(pattern):
            with suppress(OSError):
                entry.unlink()
    partial = cache / f"{MARKER}.{os.getpid()}"
    with suppress(OSError):
        partial.write_text(key)
        os.replace(partial, marker)
    return True


def drop_stale_in_tree_cache(folder: Path = KERNELS_FOLDER) -> None:
    """The package's own `__pycache__`, where numba caches when the package folder is writable (a
    clone, an editable install): emptied of numba's files compiled from other sources."""
    if os.access(folder, os.W_OK):
        drop_stale_entries(folder / "__pycache__", sources_key(folder))
