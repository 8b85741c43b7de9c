"""The BLAS part of the environment fingerprint (cli/fingerprint.py) is the same in every process on
one machine: threadpoolctl lists the loaded libraries in an order that follows the process's string
hash seed, and a cpu-kernels process has two (numpy's OpenBLAS and scipy's, loaded with numba), so
`infer bench compare` used to report a BLAS difference between two runs on the same machine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import threadpoolctl

from infer.cli import fingerprint
from infer.cli.bench.compare import Run, run_differences
from infer.cli.fingerprint import blas_info, canonical_blas, fingerprint_diff, fingerprint_leaves

DATA = Path(__file__).parent / "data" / "bench"

NUMPY_BLAS = {
    "user_api": "blas",
    "internal_api": "openblas",
    "num_threads": 1,
    "prefix": "libscipy_openblas",
    "filepath": "/site-packages/numpy.libs/libscipy_openblas64_-32a4b2a6.so",
    "version": "0.3.31.188.0",
    "threading_layer": "pthreads",
    "architecture": "SkylakeX",
}
SCIPY_BLAS = {
    **NUMPY_BLAS,
    "num_threads": 2,
    "filepath": "/site-packages/scipy.libs/libscipy_openblas-6cdc3b4a.so",
    "version": "0.3.30",
}
OPENMP = {"user_api": "openmp", "internal_api": "openmp", "num_threads": 2, "prefix": "libgomp"}


def _blas_seen_as(monkeypatch: pytest.MonkeyPatch, libraries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    monkeypatch.setattr(threadpoolctl, "threadpool_info", lambda: [dict(lib) for lib in libraries])
    return blas_info()


def test_blas_info_is_the_same_whatever_order_threadpoolctl_lists_the_libraries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    one = _blas_seen_as(monkeypatch, [NUMPY_BLAS, OPENMP, SCIPY_BLAS])
    other = _blas_seen_as(monkeypatch, [SCIPY_BLAS, NUMPY_BLAS, OPENMP])
    assert one == other
    assert [entry["version"] for entry in one] == ["0.3.30", "0.3.31.188.0"]  # openmp is not BLAS
    assert one[0] == {
        "vendor": "openblas",
        "version": "0.3.30",
        "threads": 2,
        "architecture": "SkylakeX",
        "threading_layer": "pthreads",
    }
    assert json.loads(json.dumps(one)) == one  # JSON-ready, as the bench and gate files store it


def test_the_same_libraries_in_another_order_are_no_difference_but_a_thread_count_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(
        fingerprint, "blas_info", lambda: _blas_seen_as(monkeypatch, [NUMPY_BLAS, SCIPY_BLAS])
    )
    base = fingerprint.environment_fingerprint(backend="cpu")
    # as a run recorded before the order was fixed may hold them
    swapped = {**base, "blas": list(reversed(base["blas"]))}
    assert swapped["blas"] != base["blas"] and fingerprint_diff(base, swapped) == []
    assert fingerprint_leaves(swapped) == fingerprint_leaves(base)
    fewer = {**swapped, "blas": [{**swapped["blas"][0], "threads": 4}, swapped["blas"][1]]}
    assert fingerprint_diff(base, fewer) == [("blas[1].threads", 1, 4)]  # numpy's, wherever it was
    assert canonical_blas(None) is None and canonical_blas([]) == []


def test_compare_sees_no_blas_difference_between_recorded_runs_that_list_blas_in_two_orders() -> None:
    exact, int8 = (json.loads((DATA / name).read_text()) for name in ("run_exact.json", "run_int8.json"))
    assert exact["fingerprint"]["blas"] == list(reversed(int8["fingerprint"]["blas"]))  # the recording
    differences = dict(run_differences([Run("exact", exact), Run("int8", int8)]))
    assert not [key for key in differences if key.startswith("fingerprint.blas")], differences
    assert differences["fingerprint.cpu_kernels"] == ("exact", "int8")
