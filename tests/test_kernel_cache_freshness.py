"""numba's kernel cache kept in step with the kernel sources (cpu_kernels/cache_freshness.py): a change
to a module a cached kernel only calls must not leave the old machine code in the cache."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from infer.engine.backends import cpu_setup
from infer.engine.backends.cpu_kernels import cache_freshness
from infer.engine.backends.cpu_kernels.cache_freshness import (
    MARKER,
    drop_stale_entries,
    sources_key,
)

CALLER = """\
from numba import njit
from kernels_under_test.callee import value

@njit(cache=True)
def total():
    return value() + 1
"""

RUN = """\
import sys
sys.path.insert(0, sys.argv[1])
if sys.argv[2] == "fresh":
    from pathlib import Path
    from infer.engine.backends.cpu_kernels.cache_freshness import drop_stale_entries, sources_key
    folder = Path(sys.argv[1]) / "kernels_under_test"
    drop_stale_entries(folder / "__pycache__", sources_key(folder))
from kernels_under_test.caller import total
print(total())
"""


def _write_package(root: Path, callee_value: int) -> None:
    package = root / "kernels_under_test"
    package.mkdir(parents=True, exist_ok=True)
    (package / "__init__.py").write_text("")
    (package / "caller.py").write_text(CALLER)
    (package / "callee.py").write_text(
        f"from numba import njit\n\n@njit\ndef value():\n    return {callee_value}\n"
    )


def _total(root: Path, mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    done = subprocess.run(
        [sys.executable, "-c", RUN, str(root), mode], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return int(done.stdout)


def test_an_edited_callee_reaches_a_cached_caller_only_through_the_freshness_check(tmp_path: Path) -> None:
    """numba alone keeps the caller's old machine code when only the callee's file changes (the
    reason for the check); with the check, the edit takes effect."""
    stale, fresh = tmp_path / "stale", tmp_path / "fresh"
    for root in (stale, fresh):
        _write_package(root, callee_value=1)
    assert _total(stale, "plain") == 2 and _total(fresh, "fresh") == 2
    for root in (stale, fresh):
        _write_package(root, callee_value=41)  # the caller's file is unchanged
    assert _total(stale, "plain") == 2  # numba's own check: the stale entry is loaded
    assert _total(fresh, "fresh") == 42
    assert _total(fresh, "fresh") == 42  # and cached again under the new key


def test_the_key_follows_content_not_timestamps(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "b.py").write_text("y = 2\n")
    key = sources_key(tmp_path)
    os.utime(tmp_path / "a.py", (1, 1))
    assert sources_key(tmp_path) == key
    (tmp_path / "b.py").write_text("y = 3\n")
    assert sources_key(tmp_path) != key
    (tmp_path / "b.py").write_text("y = 2\n")
    assert sources_key(tmp_path) == key
    (tmp_path / "c.py").write_text("")
    assert sources_key(tmp_path) != key


def test_stale_entries_go_and_the_rest_of_the_folder_stays(tmp_path: Path) -> None:
    cache = tmp_path / "__pycache__"
    cache.mkdir()
    for name in ("k.f-10.py311.nbi", "k.f-10.py311.1.nbc", "k.cpython-311.pyc"):
        (cache / name).write_bytes(b"x")
    assert drop_stale_entries(cache, "new") is True
    assert sorted(p.name for p in cache.iterdir()) == [MARKER, "k.cpython-311.pyc"]
    assert (cache / MARKER).read_text() == "new"
    (cache / "k.f-10.py311.nbi").write_bytes(b"x")  # compiled under the current key: kept
    assert drop_stale_entries(cache, "new") is False
    assert (cache / "k.f-10.py311.nbi").exists()
    assert drop_stale_entries(cache, "newer") is True
    assert not (cache / "k.f-10.py311.nbi").exists()


def test_the_package_in_tree_cache_carries_the_current_key() -> None:
    """Importing the kernels package (done above) checked its own __pycache__."""
    folder = cache_freshness.KERNELS_FOLDER
    if not os.access(folder, os.W_OK):
        pytest.skip("a read-only package caches in INFER_HOME/numba/KEY instead")
    assert (folder / "__pycache__" / MARKER).read_text() == sources_key()


def test_a_read_only_install_caches_under_the_key_and_drops_other_versions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setattr(cpu_setup.os, "access", lambda path, mode: False)
    older = tmp_path / "numba" / "0123456789abcdef"
    older.mkdir(parents=True)
    (older / "entry.nbi").write_bytes(b"x")
    cpu_setup.use_kernel_cache(tmp_path)
    current = tmp_path / "numba" / sources_key()
    assert os.environ["NUMBA_CACHE_DIR"] == str(current)
    assert not older.exists()
    current.mkdir()  # numba made it and cached there; a second run keeps it
    monkeypatch.delenv("NUMBA_CACHE_DIR")
    cpu_setup.use_kernel_cache(tmp_path)
    assert current.is_dir() and os.environ["NUMBA_CACHE_DIR"] == str(current)


def test_a_cache_folder_the_user_set_wins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.setattr(cpu_setup.os, "access", lambda path, mode: False)
    cpu_setup.use_kernel_cache(tmp_path / "home")
    assert os.environ["NUMBA_CACHE_DIR"] == str(tmp_path / "mine")
    assert not (tmp_path / "home").exists()
