"""Pytest plugin with the tiny synthetic model fixtures: `pytest_plugins = ["conftest_synthetic"]`.

The models are built by tests/synthetic.py (see its docstring); every fixture here is session-scoped
and each distinct set of `write_tiny_model` arguments is written once per session. Treat the files as
read-only: copy them before corrupting anything.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from synthetic import TinyModel, write_tiny_model
from threadpoolctl import threadpool_limits

from infer.cli.serve.launch import ServerProcess, start_server
from infer.engine import EngineConfig, load_engine
from infer.profiles.schema import ProfileFile


@pytest.fixture(scope="session")
def tiny_model_factory(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., TinyModel]:
    """`make(**kwargs) -> TinyModel`: write_tiny_model's keyword arguments, each set written once per session.

    Treat the files as read-only (other tests share them); copy them before corrupting anything.
    """
    cache: dict[str, TinyModel] = {}

    def make(**kwargs: Any) -> TinyModel:
        key = json.dumps(kwargs, sort_keys=True, default=str)
        if key not in cache:
            cache[key] = write_tiny_model(tmp_path_factory.mktemp("tiny"), **kwargs)
        return cache[key]

    return make


@pytest.fixture(scope="session")
def tiny_model(tiny_model_factory: Callable[..., TinyModel]) -> TinyModel:
    """The default tiny model: F32 llama, vocab 316, hidden 64, 4 heads, 2 layers, tied embeddings."""
    return tiny_model_factory()


@pytest.fixture(scope="session")
def tiny_gguf(tiny_model: TinyModel) -> Path:
    """Path of the default tiny model's GGUF file (read-only)."""
    return tiny_model.gguf_path


@pytest.fixture(scope="session")
def tiny_hf_dir(tiny_model: TinyModel) -> Path:
    """Path of the default tiny model's safetensors folder (read-only). Loaded once here in the default
    kernel mode, so the CPU kernels its load and warm-up use are in numba's cache before a CLI test runs
    `infer` on it: those assert the CLI's exact stderr, which a first compile adds its notice to (in a
    fresh clone, whether another test compiled them first is down to the order tests run in)."""
    default_kernels = ProfileFile.model_fields["cpu_kernels"].default
    load_engine(tiny_model.hf_dir, EngineConfig(), cpu_kernels=default_kernels).shutdown()
    return tiny_model.hf_dir


@pytest.fixture(scope="module")
def single_blas_thread() -> Iterator[None]:
    """One BLAS thread for the module (`pytestmark = pytest.mark.usefixtures("single_blas_thread")`).

    Tiny matmuls gain nothing from threads, and on a busy 2-core machine OpenBLAS's spinning threads
    make them up to 100x slower.
    """
    with threadpool_limits(limits=1, user_api="blas"):
        yield


@pytest.fixture(scope="module")
def tiny_server(tiny_gguf: Path) -> Iterator[ServerProcess]:
    """`infer serve` on the tiny model (a 128-token context, 8 sequences, seed 3) for one module; it
    must exit 0 with no traceback in its log."""
    process = start_server(["-m", str(tiny_gguf), "-c", "128", "--max-num-seqs", "8", "--seed", "3"])
    yield process
    assert process.stop() == 0, process.stderr
    assert "Traceback" not in process.stderr, process.stderr


@pytest.fixture(scope="module")
def tiny_http(tiny_server: ServerProcess) -> Iterator[httpx.Client]:
    """An HTTP client for `tiny_server`."""
    with httpx.Client(base_url=tiny_server.url, timeout=120) as client:
        yield client
