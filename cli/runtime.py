"""From resolved settings to a running Engine, with progress and notices on stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    MofNCompleteColumn,
    Progress,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TransferSpeedColumn,
)
from threadpoolctl import threadpool_limits

from infer.cli.model_store import KNOWN_MODELS, ModelSpec, ModelStoreError, infer_home, pull, resolve_spec
from infer.cli.options import fail
from infer.engine.loader import ModelLoadError
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import FaultHook
from infer.profiles.backend_choice import choose_backend, fallback_notice
from infer.profiles.settings import Settings, SettingsError, refuse_unimplemented

STDERR = Console(stderr=True)
"""Every notice, progress bar and log goes to stderr so stdout stays machine-readable."""


def _transient_bar(console: Console, *columns: ProgressColumn) -> Progress:
    """A description, a bar and `columns`, cleared when done and hidden when `console` is no terminal."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        *columns,
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def counting_progress(console: Console = STDERR) -> Progress:
    """A transient 'done/total' progress bar on stderr (hidden when stderr is not a terminal)."""
    return _transient_bar(console, MofNCompleteColumn(), TimeElapsedColumn())


def pull_with_progress(spec: ModelSpec, console: Console = STDERR) -> Path:
    """Pull a known model into the cache, showing a rich progress bar on stderr."""
    progress = _transient_bar(console, DownloadColumn(), TransferSpeedColumn())
    with progress:
        task = progress.add_task(f"pull {spec.name}", total=None)

        def report(stage: str, done: int, total: int) -> None:
            progress.update(task, description=f"{stage} {spec.name}", completed=done, total=total or None)

        return pull(spec, report)


def resolve_model_path(model: str | None) -> Path:
    """A path for the `model` setting: a file or folder, a known model name, or None for the default."""
    try:
        if model is None or model in KNOWN_MODELS:
            spec = resolve_spec(model)
            return pull_with_progress(spec)
    except ModelStoreError as exc:
        fail(str(exc))
    return Path(model).expanduser()


def engine_config(settings: Settings, *, fault_hook: FaultHook | None = None) -> EngineConfig:
    """The engine limits the settings ask for."""
    return EngineConfig(
        ctx_size=settings.ctx_size,
        max_num_seqs=settings.max_num_seqs,
        max_batched_tokens=settings.max_batched_tokens,
        batch_size=settings.batch_size,
        fault_hook=fault_hook,
    )


def use_kernel_cache() -> None:
    """Point numba's compiled-kernel cache at `$INFER_HOME/numba` when the package folder is read-only
    (a system or wheel install), so kernels compile once per machine, not once per run. Must run before
    the kernels are imported; a NUMBA_CACHE_DIR the user set wins."""
    import infer.engine.backends as backends

    package = Path(backends.__file__).parent
    if "NUMBA_CACHE_DIR" not in os.environ and not os.access(package, os.W_OK):
        os.environ["NUMBA_CACHE_DIR"] = str(infer_home() / "numba")


def open_engine(settings: Settings, *, max_num_seqs: int | None = None) -> Engine:
    """Choose the backend (one stderr notice on fallback), pin BLAS threads, load the model (and the
    draft model of speculative method draft_model).

    Any problem is one line on stderr and exit code 2.
    """
    try:
        refuse_unimplemented(settings)
    except SettingsError as exc:
        fail(str(exc))
    choice = choose_backend(settings)
    notice = fallback_notice(choice)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    if settings.cpu_kernels != "blas" and choice.selected == "cpu":
        use_kernel_cache()
        # The numba kernels run the matmuls on `threads` threads; BLAS (long prefill attention only)
        # keeps one, since two spinning thread pools on the same cores slow each other down 2x.
        threadpool_limits(limits=1, user_api="blas")
        if settings.threads:
            import numba

            numba.set_num_threads(min(settings.threads, numba.config.NUMBA_NUM_THREADS))
    elif settings.threads:
        threadpool_limits(limits=settings.threads, user_api="blas")
    path = resolve_model_path(settings.model)
    draft = resolve_model_path(settings.spec_draft_model) if settings.spec_method == "draft_model" else None
    config = engine_config(settings)
    if max_num_seqs is not None:
        config = replace(config, max_num_seqs=max_num_seqs)
    _keep_stdout_clean()
    with _compile_notice(settings.cpu_kernels != "blas" and choice.selected == "cpu"):
        try:
            engine = load_engine(
                path,
                config,
                choice.selected,
                choice.dtype,
                cpu_kernels=settings.cpu_kernels,
                draft_model=draft,
            )
        except ModelLoadError as exc:  # DraftModelError too: a draft model with another tokenizer
            fail(str(exc))
    float_copies = sorted(getattr(engine.model, "float_copies", ()))
    if float_copies:
        print(
            f"infer: no {settings.cpu_kernels} CPU kernel for {', '.join(float_copies)} matrices: "
            "they run as float32 copies through BLAS (more memory, slower)",
            file=sys.stderr,
            flush=True,
        )
    return engine


@contextmanager
def _compile_notice(kernels: bool) -> Iterator[None]:
    """When loading compiles CPU kernels (the first run on a machine, or after an upgrade), say so
    on stderr before the wait and give its length after; runs that load them from numba's cache
    say nothing."""
    if not kernels:
        yield
        return
    from infer.engine.backends.cpu_kernels.compile_watch import watch_compiles

    def starting() -> None:
        print("infer: compiling CPU kernels, once (later runs load them from a cache)...", file=sys.stderr)

    with watch_compiles(on_first=starting) as report:
        yield
    if report.kernels:
        print(f"infer: compiling CPU kernels, once: {report.seconds:.1f} s", file=sys.stderr, flush=True)


def _keep_stdout_clean() -> None:
    """numba calls colorama.init() on its first dispatch when colorama is installed, and colorama then
    writes an ANSI reset to stdout at exit whenever stdout is a terminal; stdout carries the generated
    text and nothing else. colorama registers that exit hook only while `atexit_done` is false."""
    try:
        import colorama.initialise as colorama_init
    except ImportError:
        return
    colorama_init.atexit_done = True
