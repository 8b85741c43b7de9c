"""Build llama.cpp's `llama-bench` and `llama-batched-bench` (and, on request, `llama-server`) from the
`llama-cpp-python` sdist.

The sdist on PyPI vendors llama.cpp's sources (`vendor/llama.cpp`), so the peer benchmark needs no git
clone and no network beyond the package index. The build lives in a cache folder outside the repository
(`$INFER_HOME/llamacpp-build`, else `~/.cache/infer/llamacpp-build`) and is skipped when binaries for the
same sdist version and CMake flags already exist.

Flags: `GGML_NATIVE=OFF` with the x86 extensions this CPU reports in /proc/cpuinfo switched on one by one,
AMX always off (a `-march=native` build segfaults on VMs whose kernel does not grant AMX tile state, seen
on this workplace's Xeon machines), BLAS off (ggml's own kernels are what `infer`'s kernels compete with).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

TARGETS = ("llama-bench", "llama-batched-bench")
"""The only targets built: the full tree takes far longer on 2 cores."""
COMPLETE = "complete.json"
"""Stamp written in a build folder once both binaries are built: (sdist version, options)."""
SERVER_TARGET = "llama-server"
"""Built on request (`ensure_server_built`, or `python scripts/llamacpp_build.py --server`) in the same
folder, so the ggml and llama libraries already compiled for the bench tools are reused."""
SERVER_COMPLETE = "server-complete.json"
"""Stamp written once llama-server is built in a build folder."""

# cpuinfo flag(s) required -> the ggml CMake option they enable. GGML_AVX512 compiles with
# -mavx512f -mavx512cd -mavx512vl -mavx512dq -mavx512bw, so all five must be present.
_FLAG_OPTIONS: tuple[tuple[tuple[str, ...], str], ...] = (
    (("sse4_2",), "GGML_SSE42"),
    (("avx",), "GGML_AVX"),
    (("avx2",), "GGML_AVX2"),
    (("bmi2",), "GGML_BMI2"),
    (("fma",), "GGML_FMA"),
    (("f16c",), "GGML_F16C"),
    (("avx_vnni",), "GGML_AVX_VNNI"),
    (("avx512f", "avx512cd", "avx512vl", "avx512dq", "avx512bw"), "GGML_AVX512"),
    (("avx512vbmi",), "GGML_AVX512_VBMI"),
    (("avx512_vnni",), "GGML_AVX512_VNNI"),
    (("avx512_bf16",), "GGML_AVX512_BF16"),
)
_AVX512_EXTENSIONS = ("GGML_AVX512_VBMI", "GGML_AVX512_VNNI", "GGML_AVX512_BF16")

_FIXED_OPTIONS: dict[str, str] = {
    "CMAKE_BUILD_TYPE": "Release",
    "GGML_NATIVE": "OFF",
    "GGML_AMX_TILE": "OFF",
    "GGML_AMX_INT8": "OFF",
    "GGML_AMX_BF16": "OFF",
    "GGML_BLAS": "OFF",
    "BUILD_SHARED_LIBS": "OFF",
    "LLAMA_BUILD_TESTS": "OFF",
    "LLAMA_BUILD_EXAMPLES": "OFF",
    "LLAMA_BUILD_SERVER": "OFF",
    "LLAMA_OPENSSL": "OFF",
    "LLAMA_CURL": "OFF",
}


LogFn = Callable[[str], None]
"""Progress callback: takes one line."""


class BuildError(RuntimeError):
    """The llama.cpp build could not be made; the message is one line for the user."""


def cpuinfo_flags(text: str) -> set[str]:
    """The feature flags of the first `flags` line of /proc/cpuinfo text (empty when there is none)."""
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            return set(value.split())
    return set()


AVX512_AND_VNNI_FLAGS = frozenset(
    flag
    for required, option in _FLAG_OPTIONS
    if option == "GGML_AVX_VNNI" or option.startswith("GGML_AVX512")
    for flag in required
)
"""The /proc/cpuinfo flags of AVX-VNNI and AVX-512 (with its extensions): what an AVX2-only build drops."""


def avx2_only(flags: set[str]) -> set[str]:
    """`flags` as an AVX2 machine without VNNI or AVX-512 has them (Haswell to Zen 3): the build of
    llama.cpp to set beside `infer` compiled for such a machine on a newer host (`--avx2-only`)."""
    return set(flags) - AVX512_AND_VNNI_FLAGS


def cmake_options(flags: set[str]) -> dict[str, str]:
    """The CMake cache options for a CPU with these /proc/cpuinfo flags: fixed options plus one ON/OFF
    per x86 extension. The AVX-512 extensions need AVX-512 itself, so they are OFF without it."""
    options = dict(_FIXED_OPTIONS)
    for required, option in _FLAG_OPTIONS:
        options[option] = "ON" if all(f in flags for f in required) else "OFF"
    if options["GGML_AVX512"] == "OFF":
        for option in _AVX512_EXTENSIONS:
            options[option] = "OFF"
    return options


def options_key(version: str, options: dict[str, str]) -> str:
    """A short stable name for (sdist version, options): the build folder's name."""
    blob = json.dumps([version, sorted(options.items())]).encode()
    return f"{version}-{hashlib.sha256(blob).hexdigest()[:12]}"


def default_cache_dir() -> Path:
    """`$INFER_HOME/llamacpp-build`, else `~/.cache/infer/llamacpp-build`."""
    home = os.environ.get("INFER_HOME")
    base = Path(home) if home else Path.home() / ".cache" / "infer"
    return base / "llamacpp-build"


_SDIST_RE = re.compile(r"^llama_cpp_python-(?P<version>[0-9][0-9A-Za-z.+-]*)\.tar\.gz$")


def sdist_version(path: Path) -> str:
    """The version in an sdist file name `llama_cpp_python-X.Y.Z.tar.gz`."""
    match = _SDIST_RE.match(path.name)
    if match is None:
        raise BuildError(f"not a llama-cpp-python sdist name: {path.name}")
    return match.group("version")


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version))


@dataclass(frozen=True)
class Binaries:
    """The built tools and how they were obtained."""

    bench: Path
    batched_bench: Path
    version: str
    options: dict[str, str]
    build_seconds: float
    """Wall time of this call's configure + build; 0.0 when the cached build was reused."""


def find_sdist(cache: Path, version: str | None) -> Path | None:
    """The sdist already in `cache/sdist`: `version` when given, else the newest there; None if none."""
    found = sorted(
        (p for p in (cache / "sdist").glob("llama_cpp_python-*.tar.gz") if _SDIST_RE.match(p.name)),
        key=lambda p: _version_key(sdist_version(p)),
    )
    if version is not None:
        found = [p for p in found if sdist_version(p) == version]
    return found[-1] if found else None


def download_sdist(cache: Path, version: str | None, log: LogFn) -> Path:
    """Fetch the sdist into `cache/sdist` with `pip download --no-deps --no-binary :all:`."""
    sdist_dir = cache / "sdist"
    sdist_dir.mkdir(parents=True, exist_ok=True)
    spec = "llama-cpp-python" if version is None else f"llama-cpp-python=={version}"
    log(f"downloading the {spec} sdist ...")
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:"]
    proc = subprocess.run([*cmd, "-d", str(sdist_dir), spec], capture_output=True, text=True)
    got = find_sdist(cache, version)
    if proc.returncode != 0 or got is None:
        last = (proc.stderr.strip().splitlines() or ["no sdist downloaded"])[-1]
        raise BuildError(f"pip download {spec} failed: {last}")
    return got


def _extract_sources(sdist: Path, cache: Path, version: str) -> Path:
    """`vendor/llama.cpp` of the sdist, extracted once under `cache/src`."""
    root = cache / "src" / f"llama_cpp_python-{version}"
    sources = root / "vendor" / "llama.cpp"
    if (sources / "CMakeLists.txt").is_file():
        return sources
    (cache / "src").mkdir(parents=True, exist_ok=True)
    with tarfile.open(sdist) as tar:
        tar.extractall(cache / "src", filter="data")
    if not (sources / "CMakeLists.txt").is_file():
        raise BuildError(f"{sdist.name} has no vendor/llama.cpp/CMakeLists.txt")
    return sources


def _binaries(cache: Path, version: str, options: dict[str, str]) -> Binaries | None:
    """The finished build for (version, options) in `cache`, or None."""
    build_dir = cache / f"build-{options_key(version, options)}"
    if not (build_dir / COMPLETE).is_file():
        return None
    bench, batched = build_dir / "bin" / TARGETS[0], build_dir / "bin" / TARGETS[1]
    if not (bench.is_file() and batched.is_file()):
        return None
    return Binaries(bench, batched, version, options, 0.0)


def ensure_built(
    cache: Path,
    flags: set[str],
    version: str | None = None,
    jobs: int = 2,
    log: LogFn | None = None,
) -> Binaries:
    """The two binaries for this CPU's flags, built when no build of the same sdist version and options
    exists. Raises BuildError (one line) when cmake is missing or the build fails; the full build log
    stays in the build folder."""
    say = log or (lambda line: print(line, file=sys.stderr))
    options = cmake_options(flags)
    sdist = find_sdist(cache, version)
    if sdist is not None:
        cached = _binaries(cache, sdist_version(sdist), options)
        if cached is not None:
            return cached
    # Only a build needs cmake: a cached build runs on a machine without it.
    if shutil.which("cmake") is None:
        raise BuildError("cmake not found on PATH (install cmake and a C++ compiler)")
    if sdist is None:
        sdist = download_sdist(cache, version, say)
    found_version = sdist_version(sdist)
    cached = _binaries(cache, found_version, options)
    if cached is not None:
        return cached
    build_dir = cache / f"build-{options_key(found_version, options)}"
    bench, batched = build_dir / "bin" / TARGETS[0], build_dir / "bin" / TARGETS[1]
    sources = _extract_sources(sdist, cache, found_version)
    build_dir.mkdir(parents=True, exist_ok=True)
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    configure = ["cmake", "-S", str(sources), "-B", str(build_dir), *generator]
    configure += [f"-D{k}={v}" for k, v in sorted(options.items())]
    build = ["cmake", "--build", str(build_dir), "--target", *TARGETS, "-j", str(jobs)]
    on = sorted(k for k, v in options.items() if v == "ON" and k.startswith("GGML_"))
    say(f"building llama.cpp {found_version} ({', '.join(on) or 'no SIMD'}) in {build_dir} ...")
    start = time.perf_counter()
    log_path = build_dir / "build.log"
    with log_path.open("w") as out:
        for step, cmd in (("configure", configure), ("build", build)):
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise BuildError(f"llama.cpp {step} failed (exit {proc.returncode}); log: {log_path}")
    if not (bench.is_file() and batched.is_file()):
        raise BuildError(f"llama.cpp build produced no {bench.name}/{batched.name}; log: {log_path}")
    # Written last, so an interrupted build is never taken for a finished one.
    (build_dir / COMPLETE).write_text(json.dumps({"version": found_version, **options}, indent=1))
    return Binaries(bench, batched, found_version, options, time.perf_counter() - start)


def ensure_server_built(
    cache: Path,
    flags: set[str],
    version: str | None = None,
    jobs: int = 2,
    log: LogFn | None = None,
) -> Path:
    """`llama-server` for this CPU's flags: the bench tools' build folder (made first when missing)
    configured again with `LLAMA_BUILD_SERVER=ON` (every other option unchanged, so nothing already
    compiled is rebuilt) and its server target built. Raises BuildError (one line)."""
    say = log or (lambda line: print(line, file=sys.stderr))
    binaries = ensure_built(cache, flags, version, jobs, log)
    build_dir = binaries.bench.parent.parent
    server = build_dir / "bin" / SERVER_TARGET
    if (build_dir / SERVER_COMPLETE).is_file() and server.is_file():
        return server
    if shutil.which("cmake") is None:
        raise BuildError("cmake not found on PATH (install cmake and a C++ compiler)")
    sdist = find_sdist(cache, binaries.version)
    if sdist is None:
        raise BuildError(f"the llama-cpp-python {binaries.version} sdist is gone from {cache / 'sdist'}")
    sources = _extract_sources(sdist, cache, binaries.version)
    configure = ["cmake", "-S", str(sources), "-B", str(build_dir), "-DLLAMA_BUILD_SERVER=ON"]
    build = ["cmake", "--build", str(build_dir), "--target", SERVER_TARGET, "-j", str(jobs)]
    say(f"building {SERVER_TARGET} in {build_dir} (several minutes on 2 cores) ...")
    log_path = build_dir / "server-build.log"
    with log_path.open("w") as out:
        for step, cmd in (("configure", configure), ("build", build)):
            out.write("$ " + " ".join(cmd) + "\n")
            out.flush()
            proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT)
            if proc.returncode != 0:
                raise BuildError(f"{SERVER_TARGET} {step} failed (exit {proc.returncode}); log: {log_path}")
    if not server.is_file():
        raise BuildError(f"the build produced no {SERVER_TARGET}; log: {log_path}")
    (build_dir / SERVER_COMPLETE).write_text(
        json.dumps({"version": binaries.version, "target": SERVER_TARGET})
    )
    return server


def main(argv: list[str] | None = None) -> int:
    """`python scripts/llamacpp_build.py [--server]`: build (or find) the tools and print their paths."""
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", action="store_true", help="also build llama-server")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--avx2-only", action="store_true", help="build without AVX-VNNI and AVX-512")
    args = parser.parse_args(argv)
    flags = cpuinfo_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    if args.avx2_only:
        flags = avx2_only(flags)
    try:
        binaries = ensure_built(default_cache_dir(), flags, jobs=args.jobs)
        print(binaries.bench)
        print(binaries.batched_bench)
        if args.server:
            print(ensure_server_built(default_cache_dir(), flags, jobs=args.jobs))
    except BuildError as exc:
        print(f"llamacpp_build: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
