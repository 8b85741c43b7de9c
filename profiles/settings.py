"""Resolved settings, each value remembering where it came from.

Order, highest first: command-line flag > environment variable `INFER_<NAME>` > profile YAML (and what it
`extends:`) > built-in default. Every setting has one name, used as the flag (`--top-k`), the env twin
(`INFER_TOP_K`), the profile key (`top_k`, or `sampler.top_k` in the file) and the API field (`top_k`).
Speculative settings are the profile's `speculative.<key>` with the flat name `spec_<key>`
(`--spec-method`, `INFER_SPEC_METHOD`).

Types, defaults and descriptions come from `infer.profiles.schema`, flag spellings from
`infer.profiles.flags`. This layer finds each value and its source and parses nothing it does not
own: a sampler setting's text goes as it is to `SamplingParams.parse`, which parses, normalises and
range-checks it once (eagerly, when the settings are resolved); the engine, invocation and
speculative settings are parsed by their profile schema field (`coerce_value`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import TypeAdapter, ValidationError
from pydantic.fields import FieldInfo

from infer.engine.runtime.config import EngineConfig, EngineConfigError
from infer.engine.sampling import SamplingParams, SamplingParamsError
from infer.engine.speculative.config import SpecConfigError, check_spec_limits
from infer.profiles.flags import FLAGS
from infer.profiles.loader import (
    DEFAULT_PROFILE,
    LoadedProfile,
    ProfileError,
    describe_validation_error,
    load_profile,
)
from infer.profiles.schema import REMOTE_BACKEND, ProfileFile, SamplerSection, SpeculativeSection

ENV_PREFIX = "INFER_"

Section = Literal["invocation", "engine", "sampler", "speculative"]


class SettingsError(ProfileError):
    """A setting cannot be resolved. The message is one line naming where the bad value came from (file:line,
    env var or flag), the key path and what is allowed."""


@dataclass(frozen=True)
class Provenance:
    """Where a resolved value came from.

    `detail` is `--top-k` for a flag, `env INFER_TOP_K` for an environment variable, `profiles/cpu.yaml:12`
    for a profile key, `default` for a built-in default. `str()` gives a label for tables:
    `flag --top-k`, `env INFER_TOP_K`, `profiles/cpu.yaml:12`, `default`.
    """

    kind: Literal["flag", "env", "profile", "default"]
    detail: str

    def __str__(self) -> str:
        return f"flag {self.detail}" if self.kind == "flag" else self.detail


@dataclass(frozen=True)
class SettingSpec:
    """One setting: its names in every layer, its type, default and description."""

    name: str
    """Flat name: flag `--<name with dashes>`, env `INFER_<NAME>`, API field."""
    section: Section
    key: str | None
    """Key path in a profile file (`sampler.top_k`); None for per-invocation settings."""
    annotation: Any
    default: Any
    description: str
    flags: tuple[str, ...]
    """Command-line spellings; the first is the canonical one shown in provenance."""
    constraints: tuple[Any, ...] = ()

    @property
    def env(self) -> str:
        """The environment variable: `INFER_TOP_K`."""
        return ENV_PREFIX + self.name.upper()

    @property
    def flag(self) -> str:
        """The canonical flag: `--top-k`."""
        return self.flags[0]

    @property
    def is_list(self) -> bool:
        """Whether the value is a list of strings."""
        return get_origin(self.annotation) is list

    @property
    def optional(self) -> bool:
        """Whether None is an allowed value (it is then the documented "off" value)."""
        return type(None) in get_args(self.annotation)


def _flags_for(name: str) -> tuple[str, ...]:
    """The setting's spellings from the literal table (a setting without a line is a programming error)."""
    try:
        return FLAGS[name]
    except KeyError:
        raise RuntimeError(f"setting {name} has no line in infer.profiles.flags.FLAGS") from None


def _spec_from_field(name: str, section: Section, key: str, info: FieldInfo) -> SettingSpec:
    default = info.get_default(call_default_factory=True)
    return SettingSpec(
        name=name,
        section=section,
        key=key,
        annotation=info.annotation,
        default=default,
        description=info.description or "",
        flags=_flags_for(name),
        constraints=tuple(info.metadata),
    )


def _build_specs() -> dict[str, SettingSpec]:
    specs: list[SettingSpec] = [
        SettingSpec(
            name="profile",
            section="invocation",
            key=None,
            annotation=str,
            default=DEFAULT_PROFILE,
            description="Hardware profile: a shipped name (cpu, cuda, metal, ...) or a path to a YAML file.",
            flags=_flags_for("profile"),
        ),
        SettingSpec(
            name="strict_backend",
            section="invocation",
            key=None,
            annotation=bool,
            default=False,
            description="Fail (exit 2) instead of falling back to cpu when the backend is unavailable.",
            flags=_flags_for("strict_backend"),
        ),
    ]
    for name, info in ProfileFile.model_fields.items():
        if name in ("extends", "description", "sampler", "speculative"):
            continue
        specs.append(_spec_from_field(name, "engine", name, info))
    for name, info in SamplerSection.model_fields.items():
        specs.append(_spec_from_field(name, "sampler", f"sampler.{name}", info))
    for name, info in SpeculativeSection.model_fields.items():
        specs.append(_spec_from_field(f"spec_{name}", "speculative", f"speculative.{name}", info))
    stray = sorted(set(FLAGS) - {spec.name for spec in specs})
    if stray:
        raise RuntimeError(f"infer.profiles.flags.FLAGS names no setting: {', '.join(stray)}")
    return {spec.name: spec for spec in specs}


SETTINGS: Mapping[str, SettingSpec] = MappingProxyType(_build_specs())
"""Every setting by flat name, in display order (invocation, engine, sampler, speculative)."""

_BY_KEY: Mapping[str, str] = MappingProxyType({s.key: s.name for s in SETTINGS.values() if s.key})

_FALSE_WORDS = {"0", "false", "no", "off"}
_TRUE_WORDS = {"1", "true", "yes", "on"}


def _canonical_name(name: str) -> str:
    if name in SETTINGS:
        return name
    if name in _BY_KEY:
        return _BY_KEY[name]
    raise KeyError(f"unknown setting {name!r}")


@dataclass(frozen=True)
class _Entry:
    value: Any
    source: Provenance

    def __post_init__(self) -> None:
        if isinstance(self.value, list):  # list settings are stored as tuples: Settings is immutable
            object.__setattr__(self, "value", tuple(self.value))


@dataclass(frozen=True)
class Settings:
    """Every setting's resolved value and where it came from.

    `settings.top_k`, `settings.value("top_k")` and `settings.value("sampler.top_k")` are the same.
    """

    profile_name: str
    profile_path: Path
    _entries: Mapping[str, _Entry] = field(repr=False)
    sampling: SamplingParams = field(repr=False)
    """The sampler settings as `SamplingParams`, built once when the settings were resolved."""

    def value(self, name: str) -> Any:
        """The resolved value of a setting, by flat name (`spec_method`) or key (`speculative.method`):
        a sampler setting's is `sampling`'s (parsed and normalised there: `seed: -1` -> None, ...)."""
        return self._resolved(_canonical_name(name))

    def _resolved(self, name: str) -> Any:
        if name in _SAMPLER_NAMES:
            return getattr(self.sampling, name)
        return self._entries[name].value

    def source(self, name: str) -> Provenance:
        """Where a setting's value came from."""
        return self._entries[_canonical_name(name)].source

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in SETTINGS:
            raise AttributeError(name)
        return self._resolved(name)

    def section(self, section: Section) -> dict[str, Any]:
        """The values of one section by their profile keys (`speculative` -> {"method": ..., ...})."""
        return {
            (spec.key or spec.name).split(".")[-1]: _plain(self._resolved(spec.name))
            for spec in SETTINGS.values()
            if spec.section == section
        }

    def sampling_params(self, **overrides: Any) -> SamplingParams:
        """`SamplingParams` from the sampler settings, with per-request overrides (e.g. `logit_bias`).

        Without overrides this is `sampling`, built at resolution; with them, one new `SamplingParams`
        from the values the settings found with the overrides on top. Raises `SamplingParamsError`
        (with `.parameter` and `.value`) for an out-of-range override.
        """
        if not overrides:
            return self.sampling
        return SamplingParams.parse({**_sampler_values(self._entries), **overrides})

    def rows(self) -> list[tuple[str, str, Any, Provenance]]:
        """(section, name, value, provenance) for every setting, in display order."""
        return [
            (spec.section, spec.name, self._resolved(spec.name), self._entries[spec.name].source)
            for spec in SETTINGS.values()
        ]

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict: the profile and every setting with its value and source."""
        return {
            "profile_name": self.profile_name,
            "profile_path": str(self.profile_path),
            "settings": {
                name: {
                    "section": section,
                    "value": _plain(value),
                    "source": {"kind": source.kind, "detail": source.detail},
                }
                for section, name, value, source in self.rows()
            },
        }


def _plain(value: Any) -> Any:
    """Tuples (how Settings stores lists) back to lists, for callers and JSON."""
    return list(value) if isinstance(value, tuple) else value


def _split_list(text: str) -> list[str]:
    """A list from text: a JSON array, or items separated by ';' (llama.cpp's --samplers form)."""
    if text.lstrip().startswith("["):
        parsed = json.loads(text)
        if not isinstance(parsed, list):
            raise ValueError("expected a JSON array")
        return parsed
    return [item.strip() for item in text.split(";") if item.strip()]


def coerce_value(spec: SettingSpec, raw: Any, origin: str) -> Any:
    """Parse (if text) and type-check one value for `spec`; `origin` names where it came from
    (`env INFER_TOP_K`, `--top-k`) for the error message. Raises `SettingsError`."""
    value = raw
    if isinstance(raw, str) and not _accepts_text_as_is(spec):
        text = raw.strip()
        if spec.optional and text.lower() in ("none", "null"):
            value = None
        elif spec.is_list:
            try:
                value = _split_list(text)
            except ValueError as exc:
                raise SettingsError(
                    f"{origin}: {spec.key or spec.name} must be a JSON array of strings or "
                    f"';'-separated items ({exc}) (got {raw!r})"
                ) from None
        elif spec.annotation is bool and text.lower() in _FALSE_WORDS | _TRUE_WORDS:
            value = text.lower() in _TRUE_WORDS
        else:
            value = text
    adapter = _adapter(spec)
    try:
        return adapter.validate_python(value)
    except ValidationError as exc:
        error = dict(exc.errors()[0])
        error["loc"] = (spec.key or spec.name,)
        error["input"] = raw
        raise SettingsError(f"{origin}: {describe_validation_error(error)}") from None


def _as_found(spec: SettingSpec, raw: Any, origin: str) -> Any:
    """A value handed on unparsed (its owner parses it)."""
    return raw


def _accepts_text_as_is(spec: SettingSpec) -> bool:
    return spec.annotation is str


def _adapter(spec: SettingSpec) -> TypeAdapter[Any]:
    annotation = Annotated[(spec.annotation, *spec.constraints)] if spec.constraints else spec.annotation
    return TypeAdapter(annotation)


def _check_cross_field(entries: Mapping[str, _Entry]) -> None:
    """Rules that span several settings (a single file cannot check them: its parent may set the rest)."""
    method, draft = entries["spec_method"], entries["spec_draft_model"]
    if method.value == "draft_model" and draft.value is None:
        raise SettingsError(
            f"{method.source}: speculative.method draft_model needs speculative.draft_model "
            f"(a model path; flag --spec-draft-model, env INFER_SPEC_DRAFT_MODEL)"
        )


_RANK = {"default": 0, "profile": 1, "env": 2, "flag": 3}
"""Provenance kinds by precedence (a flag outranks everything)."""


def _settle_remote(entries: dict[str, _Entry]) -> None:
    """`server_url` and `backend` decide together whether a server runs the requests: a server URL
    selects backend remote (`--server URL` alone is enough), unless a higher-ranked source asks for a
    local backend, which contradicts it and is refused; backend remote without a URL is refused too."""
    backend, url = entries["backend"], entries["server_url"]
    if url.value is not None:
        if not str(url.value).startswith(("http://", "https://")):
            raise SettingsError(f"{url.source}: server_url {url.value!r}: give an http:// or https:// URL")
        if backend.value != REMOTE_BACKEND:
            if _RANK[backend.source.kind] > _RANK[url.source.kind]:
                raise SettingsError(
                    f"{backend.source}: backend {backend.value} runs locally, but {url.source} names a "
                    f"server ({url.value}); drop one of them"
                )
            entries["backend"] = _Entry(REMOTE_BACKEND, url.source)
    elif backend.value == REMOTE_BACKEND:
        raise SettingsError(
            f"{backend.source}: backend remote needs server_url (profile key server_url, flag --server, "
            "env INFER_SERVER_URL)"
        )


def is_remote(settings: Settings) -> bool:
    """Whether a server runs these settings' requests (backend remote at `server_url`)."""
    return bool(settings.backend == REMOTE_BACKEND)


_SPEC_LIMITS: tuple[str, ...] = ("num_tokens", "draft_min", "p_min", "ngram_min", "ngram_max")
"""The `speculative.*` keys `check_spec_limits` checks, in its argument order."""


def _check_speculative(entries: Mapping[str, _Entry]) -> None:
    """Check the speculative limits with the engine's own check (`SpecConfig`'s), once, naming the
    source of the value it blames and of the one it was compared with."""
    try:
        check_spec_limits(*(entries[f"spec_{key}"].value for key in _SPEC_LIMITS))
    except SpecConfigError as exc:
        message = f"{entries[exc.parameter].source}: {exc}"
        if exc.compared_with is not None:
            message += f" ({exc.compared_with} from {entries[exc.compared_with].source})"
        raise SettingsError(message) from None


_ENGINE_LIMITS: tuple[str, ...] = (
    "ctx_size",
    "max_num_seqs",
    "max_batched_tokens",
    "batch_size",
    "max_queue",
    "kv_cache_dtype",
)
"""The settings that are `EngineConfig` fields of the same name (`kv_cache_memory` becomes bytes later)."""


def _check_engine_limits(entries: Mapping[str, _Entry]) -> None:
    """Check the engine limits with the engine's own check (`EngineConfig`'s), once, naming the source
    of the value it refuses."""
    try:
        EngineConfig(**{name: entries[name].value for name in _ENGINE_LIMITS})
    except EngineConfigError as exc:
        raise SettingsError(f"{entries[exc.parameter].source}: {exc}") from None


SPEC_KEYS_BY_METHOD: Mapping[str, frozenset[str]] = MappingProxyType(
    {
        "none": frozenset(),
        "prompt_lookup": frozenset({"num_tokens", "draft_min", "adaptive", "ngram_min", "ngram_max"}),
        "draft_model": frozenset({"num_tokens", "draft_min", "adaptive", "draft_model", "p_min"}),
    }
)
"""The `speculative.*` keys each method reads (`method` aside); the others would be ignored."""


def unused_spec_keys(method: str, given: Iterable[str]) -> list[str]:
    """The speculative keys among `given` that `method` would ignore."""
    return [key for key in given if key != "method" and key not in SPEC_KEYS_BY_METHOD[method]]


def refuse_unimplemented(settings: Settings) -> None:
    """Raise `SettingsError` for a setting this build would accept and then ignore.

    A `speculative.*` key given by a flag or an env variable that the chosen method does not read
    (`--draft-p-min` with prompt_lookup, `--draft-max` with method none, ...) is refused, naming it,
    instead of running without it. A profile may carry keys of a method it does not use (so
    `--spec-method none` switches a profile's speculation off). Every command that runs the engine
    calls this first.
    """
    method = settings.spec_method
    given = [
        spec
        for spec in SETTINGS.values()
        if spec.section == "speculative" and settings.source(spec.name).kind in ("flag", "env")
    ]
    for spec in given:
        key = (spec.key or spec.name).split(".")[-1]
        if unused_spec_keys(method, [key]):
            source, value = settings.source(spec.name), settings.value(spec.name)
            raise SettingsError(
                f"{source}: {spec.key} = {_plain(value)!r} is not used by speculative.method {method} "
                f"(from {settings.source('spec_method')}); remove it or choose a method that uses it"
            )


_SAMPLER_NAMES: tuple[str, ...] = tuple(spec.name for spec in SETTINGS.values() if spec.section == "sampler")


def _sampler_values(entries: Mapping[str, _Entry]) -> dict[str, Any]:
    """The sampler settings' values by name, as found (text from a flag or env var, lists as tuples)."""
    return {name: entries[name].value for name in _SAMPLER_NAMES}


def _check_sampler(entries: Mapping[str, _Entry]) -> SamplingParams:
    """Build `SamplingParams` once from the values found, so a bad sampler value fails now (naming its
    source); it is the settings' sampler, used by every request that has no per-request fields, and
    the resolved value of every sampler setting."""
    try:
        return SamplingParams.parse(_sampler_values(entries))
    except SamplingParamsError as exc:
        parameter = exc.parameter
        origin = str(entries[parameter].source) if parameter in entries else "sampler"
        raise SettingsError(f"{origin}: sampler.{parameter}: {exc}") from None


def _env_value(env: Mapping[str, str], spec: SettingSpec) -> str | None:
    """The env twin's text, or None when unset or empty (an empty variable counts as unset)."""
    text = env.get(spec.env)
    return text if text not in (None, "") else None


def resolve_settings(flags: Mapping[str, Any], *, env: Mapping[str, str] | None = None) -> Settings:
    """Resolve every setting: flag > `INFER_*` env > profile (and its `extends:` chain) > default.

    `flags` maps flat setting names to the values the user actually gave (a missing or None value means
    not given); text values are parsed like env values. `env` defaults to `os.environ`.
    Raises `SettingsError` (one line naming the source, key and what is allowed).
    """
    env = os.environ if env is None else env
    unknown = [name for name in flags if name not in SETTINGS]
    if unknown:
        raise TypeError(f"resolve_settings: unknown setting(s) {', '.join(sorted(unknown))}")
    given = {name: value for name, value in flags.items() if value is not None}

    entries: dict[str, _Entry] = {}

    def from_flag_or_env(spec: SettingSpec) -> _Entry | None:
        # a sampler value goes as found to SamplingParams.parse (_check_sampler); the rest is parsed here
        parse = _as_found if spec.section == "sampler" else coerce_value
        if spec.name in given:
            return _Entry(parse(spec, given[spec.name], spec.flag), Provenance("flag", spec.flag))
        text = _env_value(env, spec)
        if text is not None:
            origin = f"env {spec.env}"
            return _Entry(parse(spec, text, origin), Provenance("env", origin))
        return None

    profile_spec = SETTINGS["profile"]
    default_profile = _Entry(DEFAULT_PROFILE, Provenance("default", "default"))
    entries["profile"] = from_flag_or_env(profile_spec) or default_profile
    profile_ref = entries["profile"].value
    try:
        profile: LoadedProfile = load_profile(profile_ref)
    except SettingsError:
        raise
    except ProfileError as exc:
        via = "" if entries["profile"].source.kind == "default" else f" (from {entries['profile'].source})"
        raise SettingsError(f"{exc}{via}") from None

    for spec in SETTINGS.values():
        if spec.name == "profile":
            continue
        entry = from_flag_or_env(spec)
        if entry is None and spec.key is not None and spec.key in profile.values:
            set_by = profile.values[spec.key]
            entry = _Entry(set_by.value, Provenance("profile", set_by.location))
        if entry is None:
            entry = _Entry(spec.default, Provenance("default", "default"))
        entries[spec.name] = entry

    _check_cross_field(entries)
    _settle_remote(entries)
    _check_speculative(entries)
    _check_engine_limits(entries)
    sampling = _check_sampler(entries)
    return Settings(
        profile_name=profile.name,
        profile_path=profile.path,
        _entries=MappingProxyType(entries),
        sampling=sampling,
    )


__all__ = [
    "SETTINGS",
    "Provenance",
    "SettingSpec",
    "Settings",
    "SettingsError",
    "coerce_value",
    "is_remote",
    "resolve_settings",
]
