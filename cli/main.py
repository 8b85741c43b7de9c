"""The `infer` command-line entry point."""

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Run LLMs on your own hardware.")


def main() -> None:
    """Console-script entry point."""
    app()
