"""pyproject.toml names every package folder: its package list is written out by hand, and a folder it
leaves out is missing from the wheel while every editable-install test still passes (two were, once:
`infer serve` could not start from `pip install .`). The wheel itself is checked in tests/test_wheel.py
(slow: it builds one)."""

from __future__ import annotations

import tomllib
from cli_process import ROOT

SOURCE_ROOTS = {"cli": "infer.cli", "engine": "infer.engine", "profiles": "infer.profiles"}
"""pyproject.toml's package-dir mapping: source folder -> package name."""


def _package_folders() -> set[str]:
    """Every folder under the source roots that holds Python modules, as its package name."""
    names = set()
    for folder, package in SOURCE_ROOTS.items():
        for path in (ROOT / folder).rglob("*.py"):
            if "__pycache__" in path.parts:
                continue
            parts = path.parent.relative_to(ROOT / folder).parts
            names.add(".".join((package, *parts)))
    return names


def test_pyproject_lists_every_package_folder() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert config["package-dir"] == {package: folder for folder, package in SOURCE_ROOTS.items()}
    listed = set(config["packages"])
    folders = _package_folders()
    assert folders - listed == set(), "missing from pyproject.toml's packages"
    assert listed - folders - {"infer.profiles"} == set(), "listed but not a folder of modules"
