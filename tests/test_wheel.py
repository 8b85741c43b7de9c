"""The wheel holds everything `infer` runs, and an installed wheel serves the chat page from its own
files (an editable install, which every other test runs on, reads the source tree and would hide a
file that `pyproject.toml` leaves out).

The wheel is built from a copy of the package folders (a stale `build/` of the checkout cannot mend a
missing file): offline with the setuptools installed here when it can build wheels and meets
pyproject.toml's floor, otherwise as `pip install .` does (an isolated build environment, which pip
fills from its index or cache). Slow: a build and a virtual environment take some seconds.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from cli_process import ROOT

from infer.cli.serve.webui import PAGE_FILES

PACKAGE_DIRS = {"cli": "infer/cli", "engine": "infer/engine", "profiles": "infer/profiles"}
"""pyproject.toml's package-dir mapping: source folder -> its place in the wheel."""
STATIC = ROOT / "cli" / "serve" / "static"


def _shipped(folder: Path) -> list[Path]:
    """The files of `folder` that belong in the wheel: Python modules, the profiles' YAML and every
    file of the chat page (nothing from caches)."""
    return sorted(
        path
        for path in folder.rglob("*")
        if path.is_file()
        and "__pycache__" not in path.parts
        and (path.suffix in (".py", ".yaml") or STATIC in path.parents)
    )


def _in_wheel(path: Path) -> str:
    folder, rest = path.relative_to(ROOT).parts[0], path.relative_to(ROOT).parts[1:]
    return "/".join((PACKAGE_DIRS[folder], *rest))


def _builds_offline() -> bool:
    """Whether the setuptools installed here builds wheels (70.1 on, or the `wheel` package beside it)
    and is as new as pyproject.toml's build requirement (68)."""
    try:
        import setuptools
    except ImportError:
        return False
    version = tuple(int(part) for part in setuptools.__version__.split(".")[:2] if part.isdigit())
    return version >= (70, 1) or (version >= (68,) and importlib.util.find_spec("wheel") is not None)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel")
    source = work / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, source / name)
    for folder in PACKAGE_DIRS:
        shutil.copytree(ROOT / folder, source / folder, ignore=shutil.ignore_patterns("__pycache__"))
    build = ["wheel", "--no-deps", "-q", "-w", str(work / "dist")]
    offline = _builds_offline()
    if offline:
        build += ["--no-build-isolation", "--no-index"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", *build, str(source)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    if not offline and "satisfies the requirement setuptools" in done.stderr:
        pytest.skip("no setuptools>=68 that builds wheels here, and pip's index cannot be reached")
    assert done.returncode == 0, done.stdout + done.stderr
    (built,) = (work / "dist").glob("infer-*.whl")
    return built


@pytest.mark.slow
def test_the_wheel_holds_every_module_profile_and_chat_page_file(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    static = _shipped(STATIC)
    assert set(PAGE_FILES) <= {path.name for path in static}  # what the page serves is among them
    for path in static:
        assert _in_wheel(path) in names, f"{path.relative_to(ROOT)} is not in the wheel"
    expected = [_in_wheel(path) for folder in PACKAGE_DIRS for path in _shipped(ROOT / folder)]
    missing = [name for name in expected if name not in names]
    assert not missing, f"not in the wheel (pyproject.toml's packages / package-data): {missing}"
    assert not [name for name in names if name.startswith(("cli/", "engine/", "profiles/", "tests/"))]


INSTALLED_CHECK = """
import sys
from importlib import resources
from pathlib import Path

from fastapi import FastAPI
from fastapi.testclient import TestClient

import infer.cli.main  # every command's imports, as `infer` runs them
import infer.cli.serve.app  # the server's (tool calls, workers, ...)
from infer.cli.serve import webui

source, prefix = Path(sys.argv[1]), Path(sys.prefix).resolve()
assert prefix in Path(webui.__file__).resolve().parents, webui.__file__
folder = resources.files("infer.cli.serve") / "static"
assert prefix in Path(str(folder)).resolve().parents, folder
app = FastAPI()
webui.install_webui(app)
client = TestClient(app)
for name in webui.PAGE_FILES:
    on_disk = (folder / name).read_bytes()
    assert on_disk == (source / name).read_bytes(), name
    answer = client.get("/" if name == "index.html" else webui.ASSET_PREFIX + name)
    assert answer.status_code == 200 and answer.content == on_disk, name
print("served", len(webui.PAGE_FILES), "files from", folder)
"""


@pytest.mark.slow
def test_an_installed_wheel_serves_the_chat_page_from_its_own_files(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    install = ["--python", str(python), "install", "--no-deps", "--no-index", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "pip", *install, str(wheel)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    # The libraries infer needs come from this interpreter's site folders, named in a .pth file (after
    # the install, so pip sees no other `infer`): their own .pth files (an editable install of a
    # checkout among them) are not read from there, so nothing but the wheel can provide `infer`.
    host = [p for p in sys.path if p.endswith("site-packages") and Path(p).is_dir()]
    (Path(purelib) / "host-libraries.pth").write_text("\n".join(host) + "\n")
    checked = subprocess.run(
        [python, "-I", "-c", INSTALLED_CHECK, str(STATIC)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"served {len(PAGE_FILES)} files" in checked.stdout, checked.stdout
