"""The `infer` command-line entry point."""

import typer

from infer.cli.bench.command import bench
from infer.cli.gate.command import gate
from infer.cli.generate import generate
from infer.cli.models_cmd import models_app
from infer.cli.profiles_cmd import profiles_app
from infer.cli.serve.command import serve
from infer.cli.stream import stream

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Run LLMs on your own hardware.")
app.command("generate")(generate)
app.command("stream")(stream)
app.command("serve")(serve)
app.command("bench")(bench)
app.command("gate")(gate)
app.add_typer(models_app, name="models")
app.add_typer(profiles_app, name="profiles")


def main() -> None:
    """Console-script entry point."""
    app()
