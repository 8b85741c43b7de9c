"""The temporary folder a pull works in, inside the model cache, and the removal of those left behind.

A pull downloads and extracts into `infer-pull-<pid>-<random>/` next to the cache files (so the last
step is an atomic rename on the same file system) and removes it on the way out. A pull killed outright
(SIGKILL, power loss) cannot, so every pull first removes the folders whose owner is gone: the pid in
the name, and in an `owner` file its start time (a pid reused by another process is not the owner).
Folders of pulls still running are left alone, so two concurrent pulls never delete each other's work.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

PREFIX = "infer-pull-"
OWNER_FILE = "owner"
UNOWNED_AGE_S = 3600.0
"""A folder with no owner in its name (left by a version before the pid was recorded) is removed once
nothing has touched it for this long."""

_OWNED = re.compile(re.escape(PREFIX) + r"(\d+)-")


@contextmanager
def pull_workspace(cache: Path) -> Iterator[Path]:
    """A fresh workspace folder in `cache` owned by this process, removed on the way out (the stale
    ones of dead pulls are removed first)."""
    remove_stale_workspaces(cache)
    path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=cache))
    try:
        (path / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid()) or ''}\n")
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_stale_workspaces(cache: Path) -> list[Path]:
    """Remove every workspace in `cache` whose pull is no longer running; the folders removed."""
    removed = []
    for path in sorted(cache.glob(PREFIX + "*")):
        if path.is_symlink() or not path.is_dir() or _owner_running(path):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _owner_running(path: Path) -> bool:
    match = _OWNED.match(path.name)
    if match is None:
        try:
            return time.time() - path.stat().st_mtime < UNOWNED_AGE_S
        except OSError:
            return True  # gone already, or not ours to judge
    pid = int(match.group(1))
    if not _alive(pid):
        return False
    try:
        recorded = (path / OWNER_FILE).read_text().split()
    except OSError:
        return True  # the owner has not written it yet (it does so right after creating the folder)
    started = _start_time(pid)
    return not (len(recorded) == 2 and started is not None and recorded[1] != started)


def _alive(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie (killed, waiting for its parent to reap it)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: alive
    state = _proc_stat(pid)
    return state is None or state[0] != "Z"


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (Linux /proc), None where it is not known."""
    state = _proc_stat(pid)
    return state[19] if state is not None and len(state) > 19 else None


def _proc_stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), None without /proc."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text.rsplit(")", 1)[1].split()
