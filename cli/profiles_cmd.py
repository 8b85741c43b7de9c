"""`infer profiles list` and `infer profiles show [NAME|PATH]`."""

from __future__ import annotations

import json
from typing import Any, Optional

import typer
from rich.console import Console
from rich.table import Table
from rich.text import Text

from infer.cli.help import PanelCommand
from infer.cli.options import fail, resolve_or_fail, settings_errors, shared_flags
from infer.engine import BackendOptions, dtype_note, threads_note
from infer.profiles.backend_choice import choose_backend, fallback_notice
from infer.profiles.loader import ProfileError, display_path, load_profile, shipped_profiles
from infer.profiles.schema import ProfileFile
from infer.profiles.settings import Settings, is_remote

profiles_app = typer.Typer(
    help="List the hardware profiles and show resolved settings with where each value came from.",
    no_args_is_help=True,
    add_completion=False,
    rich_markup_mode=None,
)


def _format_value(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, (list, tuple)):
        return json.dumps(list(value))
    return str(value)


@profiles_app.command("list", cls=PanelCommand)
def list_profiles(
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """List the shipped profiles: name, backend, file and description."""
    default_backend = ProfileFile.model_fields["backend"].default
    rows: list[dict[str, Any]] = []
    for path in shipped_profiles():
        try:
            profile = load_profile(path)
        except ProfileError as exc:
            fail(str(exc))
        backend = profile.values["backend"].value if "backend" in profile.values else default_backend
        rows.append(
            {
                "name": profile.name,
                "backend": backend,
                "path": str(profile.path),
                "description": profile.description or "",
            }
        )
    if as_json:
        typer.echo(json.dumps(rows, indent=2))
        return
    table = Table("name", "backend", "path", "description", title="infer profiles")
    for row in rows:
        table.add_row(row["name"], row["backend"], display_path(row["path"]), Text(row["description"]))
    Console().print(table)


@profiles_app.command("show", cls=PanelCommand)
@shared_flags
def show_profile(
    name: Optional[str] = typer.Argument(
        None, metavar="[NAME|PATH]", help="Profile to show (default: --profile, INFER_PROFILE, or cpu)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    *,
    flags: dict[str, Any],
) -> None:
    """Show every resolved setting of a profile and where its value came from (flag, env, file:line,
    default). The shared flags and INFER_* variables apply, so you can see what a command would use."""
    if name is not None:
        if "profile" in flags and flags["profile"] != name:
            fail(f"profile given twice: argument {name!r} and --profile {flags['profile']!r}; give one")
        flags = {**flags, "profile": name}
    settings = resolve_or_fail(flags)
    if is_remote(settings):
        _show_remote(settings, as_json)
        return
    with settings_errors():
        choice = choose_backend(settings)
    sampled_where = sampling_place(choice.selected, settings)
    if as_json:
        document = settings.to_json()
        document["backend_choice"] = {
            "requested": choice.requested,
            "selected": choice.selected,
            "reason": choice.reason,
            "dtype": choice.dtype,
        }
        document["sampling_place"] = sampled_where
        typer.echo(json.dumps(document, indent=2))
        return
    Console().print(_settings_table(settings))
    if fallback_notice(choice) is None:
        backend_line = f"backend: {choice.selected} ({choice.dtype})"
    else:
        backend_line = (
            f"backend: {choice.requested} requested, unavailable ({choice.reason}); "
            f"{choice.selected} would be used{dtype_note(choice)}"
        )
    Console().print(Text(backend_line))
    Console().print(Text(f"sampling: {sampled_where}"))
    threads = threads_note(
        BackendOptions(choice.selected, choice.dtype, settings.cpu_kernels, settings.threads)
    )
    if threads is not None:
        Console().print(Text(threads))


def remote_summary(settings: Settings) -> dict[str, Any]:
    """Who answers at a remote profile's server (engine, model) and what its requests would carry:
    the sampler fields sent, the built-in defaults left to the server; or why it cannot be used."""
    from infer.cli.remote.client import open_remote
    from infer.cli.remote.engines import map_sampler
    from infer.cli.server_client import RemoteError
    from infer.profiles.settings import SettingsError

    summary: dict[str, Any] = {"url": settings.server_url, "api_key_env": settings.api_key_env}
    try:
        engine = open_remote(settings)
    except (RemoteError, SettingsError) as exc:
        summary["error"] = str(exc)
        return summary
    try:
        mapping = map_sampler(engine.kind, settings.sampling, settings)
    finally:
        engine.shutdown()
    summary.update(
        engine=engine.kind.name,
        engine_label=engine.kind.label,
        model=engine.identity.model,
        models=engine.identity.models,
        sampler_fields=mapping.fields,
        left_to_server=mapping.left_to_server,
    )
    return summary


def _show_remote(settings: Settings, as_json: bool) -> None:
    summary = remote_summary(settings)
    if as_json:
        document = settings.to_json()
        document["remote"] = summary
        typer.echo(json.dumps(document, indent=2))
        return
    Console().print(_settings_table(settings))
    if "error" in summary:
        Console().print(Text(f"backend: remote at {summary['url']}: cannot be used now ({summary['error']})"))
        return
    Console().print(
        Text(f"backend: remote, {summary['engine_label']} at {summary['url']}, model {summary['model']}")
    )
    Console().print(Text(f"sampler sent as: {json.dumps(summary['sampler_fields'])}"))
    if summary["left_to_server"]:
        Console().print(
            Text(f"left to the server (no such field there): {', '.join(summary['left_to_server'])}")
        )


def sampling_place(backend: str, settings: Settings) -> str:
    """Where this profile's requests are sampled: the host for the cpu backend; on a device backend,
    the device when the sampler settings are inside its envelope (a model's vocabulary larger than
    the device's candidate pool assumed), else the host."""
    from infer.engine import BACKEND_CLASSES, DEVICE_POOL_LIMIT, in_device_envelope

    if not BACKEND_CLASSES[backend].capabilities.sampling.on_device:
        return "host (the logits are on the host already)"
    if in_device_envelope(settings.sampling, 2 * DEVICE_POOL_LIMIT + 1):
        return "device (the sampler settings are inside the envelope; greedy or constrained requests: host)"
    return "host (the sampler settings are outside the device envelope: greedy, penalties, logprobs, ...)"


def _settings_table(settings: Settings) -> Table:
    table = Table(
        "section",
        "setting",
        "value",
        "source",
        title=f"profile {settings.profile_name} ({display_path(settings.profile_path)})",
    )
    for section, name, value, source in settings.rows():
        style = {"flag": "bold", "env": "cyan", "profile": "green", "default": "dim"}[source.kind]
        table.add_row(section, name, Text(_format_value(value)), Text(str(source), style=style))
    return table
