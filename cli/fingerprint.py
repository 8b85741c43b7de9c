"""The environment fingerprint: what a gate or bench result was produced on.

Two runs whose token hashes or speeds differ are only comparable when we know what differed between
them: the infer version and commit, Python, numpy and the BLAS it calls (vendor, threads, kernel arch),
the backend and device, the CPU model and its SIMD flags, and the profile (name and content hash).

`environment_fingerprint()` returns a flat-ish JSON-ready dict; `fingerprint_diff(a, b)` lists the
dotted keys whose values differ, for a mismatch report. Nothing here prints.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata
from pathlib import Path
from typing import Any

SIMD_FLAG_PREFIXES: tuple[str, ...] = (
    "sse",
    "ssse3",
    "avx",
    "fma",
    "f16c",
    "amx",
    "vnni",
    "bf16",
    "asimd",
    "neon",
    "sve",
    "fp16",
    "dotprod",
    "i8mm",
)
"""CPU flags that change which BLAS kernels run (and so float summation order); the fingerprint lists
these by name and reduces the full flag list to a hash."""

_REPO_ROOT = Path(__file__).resolve().parents[1]


def _infer_version() -> str:
    try:
        return metadata.version("infer")
    except metadata.PackageNotFoundError:  # running from a bare checkout
        return "unknown"


@lru_cache(maxsize=1)
def git_commit(root: Path = _REPO_ROOT) -> str | None:
    """The checkout's commit (with `+dirty` when tracked files changed), or None outside a git checkout."""
    if not (root / ".git").exists():
        return None
    try:
        head = subprocess.run(
            ["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return f"{head}+dirty" if dirty else head or None


BLAS_FIELDS: tuple[str, ...] = ("vendor", "version", "architecture", "threading_layer", "threads")
"""What the fingerprint records of each BLAS library, in the order its entries are sorted by."""


def _blas_key(entry: Mapping[str, Any]) -> tuple[str, ...]:
    return tuple("" if entry.get(field) is None else str(entry.get(field)) for field in BLAS_FIELDS)


def canonical_blas(entries: Any) -> Any:
    """BLAS entries in the fingerprint's canonical order (sorted by `BLAS_FIELDS`), so the same
    libraries list the same way in every process; anything but a list of mappings as it is.

    threadpoolctl lists the loaded libraries in no fixed order (on Linux it reads /proc/self/maps
    into a set of paths, whose order follows the per-process string hash seed), and a process of the
    cpu kernels has two (numpy's OpenBLAS and scipy's, which numba loads), so the order alone made two
    runs on one machine differ."""
    if not isinstance(entries, list) or not all(isinstance(entry, Mapping) for entry in entries):
        return entries
    return sorted(entries, key=_blas_key)


def blas_info() -> list[dict[str, Any]]:
    """The loaded BLAS libraries as threadpoolctl sees them (numpy's, and scipy's once numba is
    imported): vendor, version, threads, kernel arch, threading layer; in `canonical_blas` order."""
    import numpy  # noqa: F401  (threadpoolctl only sees libraries that are loaded)
    from threadpoolctl import threadpool_info

    entries = [
        {
            "vendor": info.get("internal_api"),
            "version": info.get("version"),
            "threads": info.get("num_threads"),
            "architecture": info.get("architecture"),
            "threading_layer": info.get("threading_layer"),
        }
        for info in threadpool_info()
        if info.get("user_api") == "blas"
    ]
    return canonical_blas(entries)


@lru_cache(maxsize=1)
def cpu_info() -> dict[str, Any]:
    """CPU model, logical cores and flags from /proc/cpuinfo (platform fallbacks elsewhere)."""
    model = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        text = ""
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "cpu model", "hardware") and value.strip():
            model = value.strip()
        elif key in ("flags", "features") and not flags:
            flags = sorted(set(value.split()))
    simd = [flag for flag in flags if flag.startswith(SIMD_FLAG_PREFIXES)]
    return {
        "model": model,
        "machine": platform.machine(),
        "cores": os.cpu_count(),
        "simd_flags": simd,
        "flags_sha256": hashlib.sha256(" ".join(flags).encode()).hexdigest()[:16] if flags else None,
    }


def profile_hash(path: Path | str | None) -> str | None:
    """sha256 (first 16 hex digits) of a profile file's bytes, or None when it cannot be read."""
    if path is None:
        return None
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
    except OSError:
        return None


def environment_fingerprint(
    *,
    backend: str | None = None,
    device: str | None = None,
    profile_name: str | None = None,
    profile_path: Path | str | None = None,
    model: str | None = None,
    cpu_kernels: str | None = None,
    kv_cache_dtype: str | None = None,
    server: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything about this machine and build that can change generated tokens or their speed.

    `backend`/`device` are the backend that really runs (after any fallback) and its device name;
    `profile_name`/`profile_path` the resolved profile; `model` the model file name; `cpu_kernels` the
    cpu backend's matmul mode (exact, int8, blas) when it runs; `kv_cache_dtype` how the KV cache
    stores keys and values (f32, f16: f16 changes the logits); `server` the identity of a remote
    OpenAI-compatible server that generated instead (its `/v1/models` ids and version headers), added
    under `server` only when given.
    """
    import numpy

    extra = {"server": dict(server)} if server is not None else {}
    return {
        "infer": {"version": _infer_version(), "commit": git_commit()},
        "python": platform.python_version(),
        "implementation": sys.implementation.name,
        "os": f"{platform.system()} {platform.release()}",
        "numpy": numpy.__version__,
        "blas": blas_info(),
        "backend": backend,
        "device": device or ("cpu" if backend == "cpu" else None),
        "cpu_kernels": cpu_kernels if backend == "cpu" else None,
        "kv_cache_dtype": kv_cache_dtype,
        "cpu": cpu_info(),
        "profile": {"name": profile_name, "sha256": profile_hash(profile_path)},
        "model": model,
        **extra,
    }


def _flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    if isinstance(value, list) and value and all(isinstance(item, Mapping) for item in value):
        out = {}
        for index, item in enumerate(value):
            out.update(_flatten(item, f"{prefix}[{index}]"))
        return out
    return {prefix: value}


def _canonical(fingerprint: Mapping[str, Any]) -> Mapping[str, Any]:
    """`fingerprint` with its BLAS list in `canonical_blas` order (fingerprints recorded before that
    order was fixed list the same libraries in either order)."""
    if "blas" not in fingerprint:
        return fingerprint
    return {**fingerprint, "blas": canonical_blas(fingerprint["blas"])}


def fingerprint_leaves(fingerprint: Mapping[str, Any]) -> dict[str, Any]:
    """Every leaf of a fingerprint by the dotted key `fingerprint_diff` names it with
    (`cpu.model`, `blas[0].threads`; BLAS entries in `canonical_blas` order)."""
    return _flatten(_canonical(fingerprint))


def fingerprint_diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(dotted key, stored value, current value) for every leaf that differs, sorted by key.

    Lists of scalars (CPU flags) compare as wholes; lists of mappings (BLAS libraries) by index, both
    sides in `canonical_blas` order, so the same libraries listed in another order are no difference.
    """
    a, b = fingerprint_leaves(stored), fingerprint_leaves(current)
    return [(key, a.get(key), b.get(key)) for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]


__all__ = [
    "BLAS_FIELDS",
    "SIMD_FLAG_PREFIXES",
    "blas_info",
    "canonical_blas",
    "cpu_info",
    "environment_fingerprint",
    "fingerprint_diff",
    "fingerprint_leaves",
    "git_commit",
    "profile_hash",
]
