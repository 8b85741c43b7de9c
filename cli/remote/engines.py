"""Which serving engine answers at a URL, and what each one can be asked: the sampler settings under
the names it honours, the output constraints it takes, the reproducibility switches it has.

The engine is told apart by what it answers: `/v1/models`' `owned_by` (`infer`, `llamacpp`, `vllm`,
`sglang`), the `server` header, llama-server's `/props`, vLLM's `/version`. What it cannot honour is
refused before anything is sent, as a local engine refuses a bad setting: a sampler stage that is on
(its value is not the stage's "off" value) and has no field on that engine is an error naming the
setting and the engine. The one exception is a stage left at infer's built-in default (`top_k: 40`,
`min_p: 0.05` on a plain OpenAI server, which has neither field): it is left to the server and listed
by `infer profiles show`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx

from infer.engine import GrammarSpec, SamplingParams
from infer.profiles.settings import SETTINGS, Settings, SettingsError

INFER = "infer"
LLAMA_SERVER = "llama-server"
VLLM = "vllm"
SGLANG = "sglang"
OPENAI = "openai"
"""Any other OpenAI-compatible server: only OpenAI's own sampler fields."""

_OWNERS = {
    "infer": INFER,
    "llamacpp": LLAMA_SERVER,
    "llama.cpp": LLAMA_SERVER,
    "vllm": VLLM,
    "sglang": SGLANG,
}
"""`/v1/models` `owned_by` values each engine writes."""

_OFF: dict[str, Any] = {
    "temperature": None,  # every engine takes it
    "top_k": 0,
    "top_p": 1.0,
    "min_p": 0.0,
    "typical_p": 1.0,
    "top_n_sigma": -1.0,
    "repeat_penalty": 1.0,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "xtc_probability": 0.0,
    "dry_multiplier": 0.0,
    "mirostat": 0,
    "dynatemp_range": 0.0,
    "min_keep": 0,
}
"""Each sampler stage's switch and its "off" value (SamplingParams' docstrings). The other sampler
fields (`repeat_last_n`, `xtc_threshold`, `dry_base`, `mirostat_tau`, ...) only tune a stage and
matter only when it is on; `samplers` is the stage order; the seed is the request's (sent by the
client wherever the engine takes one); `n_probs` only reports."""

_TUNES: dict[str, tuple[str, ...]] = {
    "repeat_penalty": ("repeat_last_n",),
    "presence_penalty": ("repeat_last_n",),
    "frequency_penalty": ("repeat_last_n",),
    "xtc_probability": ("xtc_threshold",),
    "dry_multiplier": ("dry_base", "dry_allowed_length", "dry_penalty_last_n", "dry_sequence_breakers"),
    "mirostat": ("mirostat_tau", "mirostat_eta"),
    "dynatemp_range": ("dynatemp_exponent",),
}
"""The fields that tune a stage, sent with it."""

_LLAMA_NAMES = (
    "temperature",
    "top_k",
    "top_p",
    "min_p",
    "typical_p",
    "top_n_sigma",
    "repeat_penalty",
    "repeat_last_n",
    "presence_penalty",
    "frequency_penalty",
    "xtc_probability",
    "xtc_threshold",
    "dry_multiplier",
    "dry_base",
    "dry_allowed_length",
    "dry_penalty_last_n",
    "dry_sequence_breakers",
    "mirostat",
    "mirostat_tau",
    "mirostat_eta",
    "dynatemp_range",
    "dynatemp_exponent",
    "min_keep",
    "seed",
    "samplers",
)
"""llama.cpp's names, which infer's sampler fields follow (llama-server takes every one of them)."""

_VLLM_NAMES = {
    "temperature": "temperature",
    "top_k": "top_k",
    "top_p": "top_p",
    "min_p": "min_p",
    "repeat_penalty": "repetition_penalty",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
}
"""vLLM's (and SGLang's) sampling fields: OpenAI's plus `top_k`, `min_p`, `repetition_penalty`."""

_OPENAI_NAMES = {
    "temperature": "temperature",
    "top_p": "top_p",
    "presence_penalty": "presence_penalty",
    "frequency_penalty": "frequency_penalty",
    "seed": "seed",
}


@dataclass(frozen=True)
class RemoteKind:
    """What one serving engine takes."""

    name: str
    label: str
    """How `infer profiles show` names it."""
    sampler_names: Mapping[str, str]
    """infer sampler field -> the body field this engine honours under it."""
    whole_history_penalties: bool = False
    """The penalties count every prompt and output token (vLLM, SGLang): honoured only with
    `repeat_last_n: -1`."""
    top_k_off: int = 0
    """The value this engine reads as "no top-k"."""
    constraints: frozenset[str] = frozenset()
    """Output-constraint settings it takes (json_schema, json_object, regex, grammar, choice)."""
    ignore_eos: bool = True
    reproducible: Mapping[str, Any] = field(default_factory=dict)
    """Body fields that make a request's tokens independent of what ran before it (a gate's
    requests): llama-server's `cache_prompt: false` (its slot's reused prompt changes the batch
    shape of the next evaluation)."""


KINDS: dict[str, RemoteKind] = {
    INFER: RemoteKind(
        INFER,
        "infer serve",
        {name: name for name in _LLAMA_NAMES},
        constraints=frozenset({"json_schema", "json_object", "grammar"}),
    ),
    LLAMA_SERVER: RemoteKind(
        LLAMA_SERVER,
        "llama.cpp llama-server",
        {name: name for name in _LLAMA_NAMES},
        constraints=frozenset({"json_schema", "json_object", "grammar"}),
        reproducible={"cache_prompt": False},
    ),
    VLLM: RemoteKind(
        VLLM,
        "vLLM",
        _VLLM_NAMES,
        whole_history_penalties=True,
        top_k_off=-1,
        constraints=frozenset({"json_schema", "json_object", "regex", "grammar", "choice"}),
    ),
    SGLANG: RemoteKind(
        SGLANG,
        "SGLang",
        _VLLM_NAMES,
        whole_history_penalties=True,
        top_k_off=-1,
        constraints=frozenset({"json_schema", "json_object", "regex", "grammar"}),
    ),
    OPENAI: RemoteKind(
        OPENAI,
        "an OpenAI-compatible server (unrecognised engine)",
        _OPENAI_NAMES,
        whole_history_penalties=True,
        constraints=frozenset({"json_schema", "json_object"}),
        ignore_eos=False,
    ),
}


def _get_json(client: httpx.Client, url: str) -> Any:
    try:
        response = client.get(url)
        if response.status_code == 200 and "json" in response.headers.get("content-type", ""):
            return response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return None


def detect_kind(client: httpx.Client, base: str) -> RemoteKind:
    """The engine at `base` (`.../v1`): `/v1/models` owners first, then the `server` header,
    llama-server's `/props`, vLLM's `/version`; a plain OpenAI server otherwise."""
    root = base.removesuffix("/v1")
    try:
        response = client.get(f"{base}/models")
        models = response.json() if response.status_code == 200 else None
        server_header = response.headers.get("server", "").lower()
    except (httpx.HTTPError, ValueError):
        models, server_header = None, ""
    owners = [
        str(m.get("owned_by", "")).lower()
        for m in (models.get("data") or [] if isinstance(models, dict) else [])
        if isinstance(m, dict)
    ]
    for owner in owners:
        if owner in _OWNERS:
            return KINDS[_OWNERS[owner]]
    if "llama" in server_header:
        return KINDS[LLAMA_SERVER]
    props = _get_json(client, f"{root}/props")
    if isinstance(props, dict) and ("default_generation_settings" in props or "build_info" in props):
        return KINDS[LLAMA_SERVER]
    if isinstance(_get_json(client, f"{root}/get_server_info"), dict):
        return KINDS[SGLANG]
    version = _get_json(client, f"{root}/version")
    if isinstance(version, dict) and "version" in version:
        return KINDS[VLLM]
    return KINDS[OPENAI]


@dataclass(frozen=True)
class SamplerMapping:
    """The sampler settings as one engine's body fields, and the defaults it was left to choose."""

    fields: dict[str, Any]
    left_to_server: list[str]
    """Stages on by infer's built-in default that this engine has no field for (nobody chose them)."""


def _on(name: str, value: Any) -> bool:
    off = _OFF[name]
    if name == "temperature":
        return True
    if name == "top_k":
        return int(value) > 0
    return value != off


def map_sampler(kind: RemoteKind, params: SamplingParams, settings: Settings) -> SamplerMapping:
    """`params` as `kind`'s body fields; raises `SettingsError` for a stage that is on and that the
    engine cannot honour, naming the setting, where it came from and the engine."""
    fields: dict[str, Any] = {}
    left: list[str] = []
    defaults = SamplingParams()
    if tuple(params.samplers) != tuple(defaults.samplers) and "samplers" not in kind.sampler_names:
        _refuse(settings, "samplers", list(params.samplers), kind, "it applies its own fixed stage order")
    for name in _OFF:
        value = getattr(params, name)
        if not _on(name, value):
            if name == "top_k" and name in kind.sampler_names:
                fields[kind.sampler_names[name]] = kind.top_k_off
            elif name in kind.sampler_names and _OFF[name] is not None:
                fields[kind.sampler_names[name]] = _OFF[name]  # the server's own default may be on
            continue
        if name not in kind.sampler_names:
            if value == SETTINGS[name].default:  # infer's built-in default (also cpu.yaml's), not a choice
                left.append(f"{name} {value}")
                continue
            _refuse(settings, name, value, kind, "it has no such field")
        penalty = name in _TUNES and _TUNES[name] == ("repeat_last_n",)
        if kind.whole_history_penalties and penalty and params.repeat_last_n != -1:
            _refuse(
                settings,
                name,
                value,
                kind,
                f"its penalties count the whole prompt and output, not the last {params.repeat_last_n} "
                "tokens; set --repeat-last-n -1 to ask for that",
            )
        fields[kind.sampler_names[name]] = value
        for tune in _TUNES.get(name, ()):
            if tune in kind.sampler_names:
                tuned = getattr(params, tune)
                fields[kind.sampler_names[tune]] = list(tuned) if isinstance(tuned, tuple) else tuned
    if "samplers" in kind.sampler_names:
        fields[kind.sampler_names["samplers"]] = list(params.samplers)
    return SamplerMapping(fields, left)


def _refuse(settings: Settings, name: str, value: Any, kind: RemoteKind, why: str) -> None:
    spec = SETTINGS[name]
    raise SettingsError(
        f"{settings.source(name)}: {spec.key} = {value!r} cannot be honoured by {kind.label} ({why}); "
        "remove it, or use a server that takes it"
    )


def _grammar_text(value: str) -> str:
    """The grammar as the user wrote it (a file's text, or the grammar given inline), for the engines
    that take GBNF/EBNF rather than the Lark form the local check produced."""
    from pathlib import Path

    path = Path(value).expanduser()
    inline = "\n" in value or len(value) > 255 or not path.is_file()
    return value if inline else path.read_text(encoding="utf-8")


def constraint_fields(kind: RemoteKind, settings: Settings, spec: GrammarSpec | None) -> dict[str, Any]:
    """The settings' output constraint (`spec`, checked locally by `grammar_from_settings`: one at
    most, valid) as `kind`'s body fields; `SettingsError` when the engine takes no such constraint."""
    if spec is None:
        return {}
    name = str(spec.parameter)
    if name not in kind.constraints:
        _refuse(settings, name, settings.value(name), kind, "it takes no such constraint")
    if spec.kind == "json_schema":
        schema = json.loads(spec.source)
        if kind.name in (INFER, LLAMA_SERVER):
            return {"json_schema": schema}
        return {
            "response_format": {"type": "json_schema", "json_schema": {"name": "output", "schema": schema}}
        }
    if spec.kind == "json_object":
        return {"response_format": {"type": "json_object"}}
    if spec.kind == "lark":
        if kind.name == INFER:
            return {"grammar": spec.source}
        text = _grammar_text(settings.grammar)
        if kind.name == LLAMA_SERVER and "::=" not in text:
            _refuse(settings, name, settings.grammar, kind, "it takes GBNF grammars, not Lark")
        if kind.name == SGLANG:
            return {"ebnf": text}
        if kind.name == VLLM:
            return {"structured_outputs": {"grammar": text}}
        return {"grammar": text}
    if spec.kind == "regex":
        return (
            {"regex": spec.source} if kind.name == SGLANG else {"structured_outputs": {"regex": spec.source}}
        )
    return {"structured_outputs": {"choice": list(spec.choices)}}


__all__ = [
    "INFER",
    "KINDS",
    "LLAMA_SERVER",
    "OPENAI",
    "SGLANG",
    "VLLM",
    "RemoteKind",
    "SamplerMapping",
    "constraint_fields",
    "detect_kind",
    "map_sampler",
]
