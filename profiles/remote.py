"""Which settings a remote engine (`backend: remote`) can take: the request's own (model name, token
limit, sampler, stop strings, output constraint), never the local engine's (threads, context size,
batch limits, KV cache, kernels, speculation), which the server decides for itself.

A local-engine setting given with a remote backend (by a flag, a variable, or a profile value other
than the built-in default) is refused, naming it, instead of being accepted and ignored.
"""

from __future__ import annotations

from infer.profiles.settings import SETTINGS, Settings, SettingsError

REMOTE_SETTINGS: frozenset[str] = frozenset(
    {
        "profile",
        "backend",
        "server_url",
        "api_key_env",
        "model",
        "n_predict",
        "json_schema",
        "json_object",
        "regex",
        "grammar",
        "choice",
    }
)
"""Engine and invocation settings that mean something for a remote engine; the sampler section is
mapped per engine (`infer.cli.remote.engines`), the speculative section is the server's."""


def local_only_given(settings: Settings) -> list[str]:
    """The local-engine settings these settings set to something other than the built-in default."""
    given = []
    for spec in SETTINGS.values():
        if spec.section == "sampler" or spec.name in REMOTE_SETTINGS:
            continue
        source = settings.source(spec.name)
        value = settings.value(spec.name)
        if source.kind != "default" and value != spec.default:
            given.append(f"{spec.key or spec.name} = {value!r} ({source})")
    return given


def refuse_local_settings(settings: Settings) -> None:
    """Raise `SettingsError` naming every local-engine setting given with backend remote."""
    given = local_only_given(settings)
    if given:
        raise SettingsError(
            f"{', '.join(given)}: not used by backend remote (the server at {settings.server_url} "
            "chooses its own engine limits, kernels and speculation); remove it, or run locally"
        )


__all__ = ["REMOTE_SETTINGS", "local_only_given", "refuse_local_settings"]
