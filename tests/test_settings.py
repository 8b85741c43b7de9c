"""Settings resolution: precedence with provenance in every combination, env parsing, backend probing."""

from __future__ import annotations

import dataclasses
import importlib.util
import itertools
import json
import sys
import textwrap
from pathlib import Path

import pytest

from infer.profiles.backend_choice import (
    BackendChoice,
    choose_backend,
    fallback_notice,
    probe_backend,
    select_backend,
)
from infer.profiles.schema import ProfileFile, SamplerSection, SpeculativeSection
from infer.profiles.settings import SETTINGS, Provenance, SettingsError, resolve_settings

# (setting, profile key path, built-in default, parent value, child value, env text, flag value, env value)
LAYERED = [
    ("top_k", "sampler.top_k", 40, 11, 12, "13", 14),
    ("temperature", "sampler.temperature", 0.8, 0.1, 0.2, "0.3", 0.4),
    ("batch_size", "batch_size", 512, 21, 22, "23", 24),
    ("dtype", "dtype", "float32", "float16", "bfloat16", "float16", "bfloat16"),
    ("spec_num_tokens", "speculative.num_tokens", 5, 2, 3, "4", 6),
    ("seed", "sampler.seed", None, 1, 2, "3", 4),
]


def _yaml_for(key_path: str, value: object, *, extends: str | None) -> str:
    lines = [f"extends: {extends}"] if extends else []
    lines.append("# a comment so the key is not on line 1")
    if "." in key_path:
        section, key = key_path.split(".")
        lines += [f"{section}:", f"  {key}: {json.dumps(value)}"]
    else:
        lines.append(f"{key_path}: {json.dumps(value)}")
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("layered", LAYERED, ids=[row[0] for row in LAYERED])
@pytest.mark.parametrize(
    "parent, child, in_env, in_flag",
    list(itertools.product([False, True], repeat=4)),
    ids=lambda present: "y" if present else "n",
)
def test_precedence_every_combination(
    tmp_path: Path, layered: tuple, parent: bool, child: bool, in_env: bool, in_flag: bool
) -> None:
    name, key_path, default, parent_value, child_value, env_text, flag_value = layered
    parent_file = tmp_path / "parent.yaml"
    parent_file.write_text(_yaml_for(key_path, parent_value, extends=None) if parent else "threads: 1\n")
    child_file = tmp_path / "child.yaml"
    if child:
        child_file.write_text(_yaml_for(key_path, child_value, extends="./parent.yaml"))
    else:
        child_file.write_text("extends: ./parent.yaml\n")
    env = {"INFER_" + name.upper(): env_text} if in_env else {}
    flags = {name: flag_value if in_flag else None, "profile": str(child_file)}

    settings = resolve_settings(flags, env=env)
    value, source = settings.value(name), settings.source(name)
    # child: `extends:`, the comment, (the section line,) the key; the parent has no `extends:` line
    expected_line = 4 if "." in key_path else 3
    if in_flag:
        assert (value, source.kind) == (flag_value, "flag")
        assert source.detail.startswith("--")
    elif in_env:
        assert source == Provenance("env", f"env INFER_{name.upper()}")
        assert str(value) == env_text
    elif child:
        assert (value, source.kind) == (child_value, "profile")
        assert source.detail.endswith(f"child.yaml:{expected_line}")
    elif parent:
        assert (value, source.kind) == (parent_value, "profile")
        assert source.detail.endswith(f"parent.yaml:{expected_line - 1}")
    else:
        assert (value, source) == (default, Provenance("default", "default"))
    assert getattr(settings, name) == value
    assert settings.value(key_path) == value


@pytest.mark.parametrize(
    "flag, env, expected_name, expected_kind",
    [
        (None, None, "cpu", "default"),
        (None, "cuda", "cuda", "env"),
        ("metal", "cuda", "metal", "flag"),
        ("metal", None, "metal", "flag"),
    ],
)
def test_profile_choice_precedence(flag, env, expected_name, expected_kind) -> None:
    settings = resolve_settings({"profile": flag}, env={"INFER_PROFILE": env} if env else {})
    assert settings.profile_name == expected_name
    assert settings.source("profile").kind == expected_kind
    assert settings.profile_path.name == f"{expected_name}.yaml"


def test_shipped_profile_values_come_from_the_right_file() -> None:
    settings = resolve_settings({"profile": "cuda"}, env={})
    assert settings.backend == "cuda"
    assert settings.source("backend").detail.startswith("profiles/cuda.yaml:")
    assert settings.max_num_seqs == 256
    assert settings.source("top_k").detail.startswith("profiles/cpu.yaml:")  # inherited via extends
    assert str(settings.source("top_k")) == settings.source("top_k").detail


# --- env and flag parsing ---------------------------------------------------------------------


@pytest.mark.parametrize(
    "variable, text, expected",
    [
        ("INFER_TOP_K", "abc", ["INFER_TOP_K", "sampler.top_k", "must be an integer", "'abc'"]),
        ("INFER_TOP_K", "4.5", ["INFER_TOP_K", "sampler.top_k"]),
        ("INFER_TEMPERATURE", "hot", ["INFER_TEMPERATURE", "sampler.temperature", "number"]),
        ("INFER_THREADS", "-1", ["INFER_THREADS", "threads", "greater than or equal to 0"]),
        ("INFER_BACKEND", "gpu", ["INFER_BACKEND", "backend", "'cpu', 'cuda', 'metal' or 'remote'"]),
        ("INFER_STRICT_BACKEND", "maybe", ["INFER_STRICT_BACKEND", "strict_backend", "boolean"]),
        ("INFER_PROFILE", "nope", ["INFER_PROFILE", "'nope'", "not found"]),
        ("INFER_DRY_SEQUENCE_BREAKERS", "[1, 2", ["INFER_DRY_SEQUENCE_BREAKERS", "JSON array"]),
        ("INFER_DRY_SEQUENCE_BREAKERS", "[1, 2]", ["INFER_DRY_SEQUENCE_BREAKERS", "non-empty strings"]),
        ("INFER_SAMPLERS", "top_k;bogus", ["INFER_SAMPLERS", "sampler.samplers", "unknown stage 'bogus'"]),
        ("INFER_SEED", "-5", ["INFER_SEED", "sampler.seed", "2**64"]),
        ("INFER_TOP_P", "1.5", ["INFER_TOP_P", "sampler.top_p", "(0, 1]"]),
    ],
)
def test_env_value_that_does_not_parse_names_the_variable(variable, text, expected) -> None:
    with pytest.raises(SettingsError) as info:
        resolve_settings({}, env={variable: text})
    message = str(info.value)
    assert "\n" not in message
    for part in expected:
        assert part in message, (part, message)


def test_flag_text_that_does_not_parse_names_the_flag() -> None:
    # sampler values are parsed by SamplingParams, once; the others by their profile schema field
    with pytest.raises(SettingsError, match=r"^flag --top-k: sampler\.top_k: top_k must be an integer"):
        resolve_settings({"top_k": "many"}, env={})
    with pytest.raises(
        SettingsError, match=r"^flag --temp: sampler\.temperature: temperature must be a number"
    ):
        resolve_settings({"temperature": "warm"}, env={})
    with pytest.raises(SettingsError, match=r"^--threads: threads "):
        resolve_settings({"threads": "many"}, env={})


def test_env_and_flag_text_parsing() -> None:
    env = {
        "INFER_TOP_K": " 7 ",
        "INFER_SEED": "none",
        "INFER_SAMPLERS": "top_k; temperature",
        "INFER_DRY_SEQUENCE_BREAKERS": '["\\n", ";"]',
        "INFER_STRICT_BACKEND": "yes",
        "INFER_MODEL": "",  # empty counts as unset
    }
    settings = resolve_settings({"seed": "42"}, env=env)
    assert settings.top_k == 7
    assert settings.seed == 42 and settings.source("seed").kind == "flag"
    assert settings.samplers == ("top_k", "temperature")
    assert resolve_settings({"samplers": "kpt"}, env={}).samplers == ("top_k", "top_p", "temperature")
    assert list(settings.dry_sequence_breakers) == ["\n", ";"]
    assert settings.strict_backend is True
    assert settings.model is None and settings.source("model").kind == "default"


def test_unknown_flag_name_is_a_programming_error() -> None:
    with pytest.raises(TypeError, match="top_kk"):
        resolve_settings({"top_kk": 1}, env={})


def test_speculative_limits_are_the_engine_check_naming_the_profile_line(tmp_path: Path) -> None:
    """One road: the schema only types `speculative.*`; the range check is SpecConfig's own, run as
    settings resolve (method none too), and it names the file and line of the value it blames."""
    profile = tmp_path / "p.yaml"
    profile.write_text("speculative:\n  method: none\n  num_tokens: 0\n")
    with pytest.raises(SettingsError, match=r"p\.yaml:3: spec_num_tokens must be at least 1, got 0"):
        resolve_settings({"profile": str(profile)}, env={})
    profile.write_text("speculative:\n  p_min: 1.5\n")
    with pytest.raises(SettingsError, match=r"p\.yaml:2: spec_p_min must be in \[0, 1\], got 1.5"):
        resolve_settings({"profile": str(profile)}, env={})
    with pytest.raises(SettingsError, match=r"env INFER_SPEC_NGRAM_MAX: spec_ngram_max must be at least 1"):
        resolve_settings({}, env={"INFER_SPEC_NGRAM_MAX": "0"})


def test_engine_limits_are_the_engine_check_naming_their_source(tmp_path: Path) -> None:
    """One road: `EngineConfig` checks its own fields; the settings layer only finds the value (a
    profile line, a flag, an env variable) and names it in the error."""
    profile = tmp_path / "p.yaml"
    profile.write_text("threads: 1\nbatch_size: 0\n")
    with pytest.raises(SettingsError) as info:
        resolve_settings({"profile": str(profile)}, env={})
    assert str(info.value).endswith("p.yaml:2: batch_size must be at least 1, got 0.")
    with pytest.raises(SettingsError, match=r"^flag --ctx-size: ctx_size must be at least 0, got -1\.$"):
        resolve_settings({"ctx_size": "-1"}, env={})
    with pytest.raises(SettingsError, match=r"^env INFER_MAX_NUM_SEQS: max_num_seqs must be at least 1"):
        resolve_settings({}, env={"INFER_MAX_NUM_SEQS": "0"})
    assert resolve_settings({"ctx_size": "0", "max_queue": "0"}, env={}).ctx_size == 0


def test_cross_field_rules_name_their_sources(tmp_path: Path) -> None:
    with pytest.raises(SettingsError) as info:
        resolve_settings({"spec_ngram_min": 3}, env={"INFER_SPEC_NGRAM_MAX": "2"})
    assert str(info.value) == (
        "flag --spec-ngram-min: spec_ngram_min must be in [1, spec_ngram_max = 2], got 3. "
        "(spec_ngram_max from env INFER_SPEC_NGRAM_MAX)"
    )
    with pytest.raises(SettingsError, match=r"--spec-method: .*draft_model"):
        resolve_settings({"spec_method": "draft_model"}, env={})
    ok = resolve_settings({"spec_method": "draft_model", "spec_draft_model": "d.gguf"}, env={})
    assert ok.section("speculative")["draft_model"] == "d.gguf"


# --- the Settings object ----------------------------------------------------------------------


def test_settings_api() -> None:
    settings = resolve_settings({"top_k": 3}, env={"INFER_TOP_P": "0.5"})
    rows = settings.rows()
    assert [name for _, name, _, _ in rows] == list(SETTINGS)
    assert ("sampler", "top_k", 3, Provenance("flag", "--top-k")) in rows
    assert str(Provenance("flag", "--top-k")) == "flag --top-k"
    assert str(Provenance("env", "env INFER_TOP_P")) == "env INFER_TOP_P"
    document = json.loads(json.dumps(settings.to_json()))
    assert document["settings"]["top_p"] == {
        "section": "sampler",
        "value": 0.5,
        "source": {"kind": "env", "detail": "env INFER_TOP_P"},
    }
    assert document["profile_name"] == "cpu"
    assert settings.value("speculative.method") == settings.spec_method == "none"
    assert set(settings.section("sampler")) == set(SamplerSection.model_fields)
    assert set(settings.section("speculative")) == set(SpeculativeSection.model_fields)
    with pytest.raises(AttributeError):
        _ = settings.no_such_setting
    with pytest.raises(KeyError):
        settings.value("no_such_setting")
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.profile_name = "x"  # type: ignore[misc]


def test_every_setting_has_a_description_and_one_name() -> None:
    for spec in SETTINGS.values():
        assert spec.description, spec.name
        assert spec.env == "INFER_" + spec.name.upper()
    engine_keys = set(ProfileFile.model_fields) - {"extends", "description", "sampler", "speculative"}
    assert engine_keys | set(SamplerSection.model_fields) <= set(SETTINGS)
    assert "logit_bias" not in SETTINGS  # per request, not a profile key


def test_sampler_fields_match_sampling_params() -> None:
    sampling = pytest.importorskip("infer.engine.sampling")
    params = sampling.SamplingParams()
    per_request = {"logit_bias", "logprobs"}  # set by each API request, not by a profile
    assert set(SamplerSection.model_fields) == set(sampling.SamplingParams.field_names()) - per_request
    for name, info in SamplerSection.model_fields.items():
        default = info.get_default(call_default_factory=True)
        actual = getattr(params, name)
        assert (list(actual) if isinstance(actual, tuple) else actual) == default, name


def test_sampler_section_is_derived_from_sampling_params_fields() -> None:
    from infer.engine.sampling import SamplingParams

    docs, types = SamplingParams.field_docs(), SamplingParams.field_input_types()
    names = [n for n in SamplingParams.field_names() if n not in ("logit_bias", "logprobs")]
    assert list(SamplerSection.model_fields) == names  # same order as the dataclass
    for name, info in SamplerSection.model_fields.items():
        assert info.description == docs[name], name
    assert types["samplers"] == tuple[str, ...] | str  # what SamplingParams parses, widened
    assert SamplerSection.model_fields["samplers"].annotation == list[str] | str  # lists in YAML/JSON
    assert SamplerSection.model_fields["dry_sequence_breakers"].annotation == list[str]
    assert SamplerSection.model_fields["seed"].annotation == int | None
    assert SamplerSection.model_config["extra"] == "forbid"
    first, second = SamplerSection(), SamplerSection()
    assert first.samplers == list(SamplingParams().samplers) and first.samplers is not second.samplers


def test_sampler_range_checked_by_sampling_params(tmp_path: Path) -> None:
    pytest.importorskip("infer.engine.sampling")
    bad = tmp_path / "bad.yaml"
    bad.write_text(textwrap.dedent("sampler:\n  top_p: 1.5\n"))
    with pytest.raises(SettingsError) as info:
        resolve_settings({"profile": str(bad)}, env={})
    assert "bad.yaml:2" in str(info.value)
    assert "sampler.top_p" in str(info.value)
    with pytest.raises(SettingsError, match="env INFER_TOP_P"):
        resolve_settings({}, env={"INFER_TOP_P": "1.5"})


def test_sampling_params_from_settings() -> None:
    pytest.importorskip("infer.engine.sampling")
    settings = resolve_settings({"top_k": 3, "seed": 9}, env={})
    params = settings.sampling_params()
    assert params.top_k == 3 and params.seed == 9
    assert settings.sampling_params(top_k=5).top_k == 5


# --- backend probing --------------------------------------------------------------------------


def test_probe_cpu_is_usable() -> None:
    assert probe_backend("cpu") is None
    assert select_backend("cpu", strict=True) == BackendChoice("cpu", "cpu", None)
    assert fallback_notice(select_backend("cpu", strict=False)) is None


@pytest.mark.parametrize("backend, module, reason", [("cuda", "cupy", "cupy"), ("metal", "mlx", "mlx")])
def test_probe_reports_missing_library(monkeypatch, backend, module, reason) -> None:
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    monkeypatch.setitem(sys.modules, f"{module}.core", None)
    found = probe_backend(backend)
    assert found is not None and reason in found and "not installed" in found
    choice = select_backend(backend, strict=False, requested_by="profile x")
    assert (choice.requested, choice.selected, choice.reason) == (backend, "cpu", found)
    notice = fallback_notice(choice)
    assert notice == f"infer: backend '{backend}' requested by profile x is unavailable ({found}); using cpu"
    with pytest.raises(SettingsError, match=f"backend '{backend}'.*unavailable.*--strict-backend"):
        select_backend(backend, strict=True)


@pytest.mark.skipif(importlib.util.find_spec("cupy") is not None, reason="cupy is installed here")
def test_cuda_unavailable_on_this_machine() -> None:
    assert probe_backend("cuda") is not None
    choice = select_backend("cuda", strict=False)
    assert choice.selected == "cpu" and choice.reason
    with pytest.raises(SettingsError):
        select_backend("cuda", strict=True)


@pytest.mark.skipif(importlib.util.find_spec("mlx") is not None, reason="mlx is installed here")
def test_metal_unavailable_on_this_machine() -> None:
    assert "mlx" in (probe_backend("metal") or "")
    choice = select_backend("metal", strict=False)
    assert choice.selected == "cpu" and choice.reason
    with pytest.raises(SettingsError):
        select_backend("metal", strict=True)


def test_probe_reports_failing_tiny_op(monkeypatch) -> None:
    import types

    fake = types.ModuleType("cupy")
    fake.cuda = types.SimpleNamespace(runtime=types.SimpleNamespace(getDeviceCount=lambda: 1))

    def broken_arange(*args, **kwargs):
        raise RuntimeError("kernel launch failed")

    fake.arange = broken_arange
    fake.float32 = "float32"
    monkeypatch.setitem(sys.modules, "cupy", fake)
    assert probe_backend("cuda") == "tiny op failed: RuntimeError: kernel launch failed"
    fake.cuda.runtime.getDeviceCount = lambda: 0
    assert probe_backend("cuda") == "no CUDA device"


def test_dtype_is_honoured_or_refused_never_ignored() -> None:
    choice = choose_backend(resolve_settings({}, env={}))
    assert (choice.selected, choice.dtype, choice.requested_dtype) == ("cpu", "float32", None)
    # Asked of a backend that runs as asked, an unsupported dtype is an error naming its source.
    with pytest.raises(
        SettingsError, match=r"^flag --dtype: dtype 'float16': backend 'cpu' computes in float32"
    ):
        choose_backend(resolve_settings({"dtype": "float16"}, env={}))
    with pytest.raises(SettingsError, match=r"^env INFER_DTYPE: dtype 'bfloat16'"):
        choose_backend(resolve_settings({}, env={"INFER_DTYPE": "bfloat16"}))


def test_choose_backend_from_settings(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupy", None)
    settings = resolve_settings({"profile": "cuda"}, env={})
    choice = choose_backend(settings)
    assert choice.selected == "cpu"
    notice = fallback_notice(choice)
    assert notice is not None
    assert notice.startswith("infer: backend 'cuda' requested by profile cuda (profiles/cuda.yaml:")
    # The cuda profile asks for bfloat16; the cpu fallback computes in float32 and the notice says so.
    assert notice.endswith("; using cpu in float32 (not bfloat16)")
    assert (choice.dtype, choice.requested_dtype) == ("float32", "bfloat16")
    strict = resolve_settings({"profile": "cuda", "strict_backend": True}, env={})
    with pytest.raises(SettingsError, match="strict-backend"):
        choose_backend(strict)


# --- one road for a setting ------------------------------------------------------------------


def test_every_flag_is_one_literal_line_of_the_flag_table() -> None:
    """`grep -- --temp profiles/flags.py` finds the flag: each setting's spellings are one literal line."""
    from infer.profiles.flags import FLAGS

    assert list(FLAGS) == list(SETTINGS)
    spellings = [flag for flags in FLAGS.values() for flag in flags]
    assert len(spellings) == len(set(spellings)), "a spelling names two settings"
    table = (Path(__file__).resolve().parents[1] / "profiles" / "flags.py").read_text()
    for name, flags in FLAGS.items():
        assert SETTINGS[name].flags == flags
        line = f'"{name}": ({", ".join(repr(f).replace(chr(39), chr(34)) for f in flags)}'
        assert line in table, line


def test_a_sampler_flag_is_parsed_once_by_sampling_params(monkeypatch: pytest.MonkeyPatch) -> None:
    """`--temp 0.25` goes as text to SamplingParams.parse (not through the schema's coercion), and the
    resolved value is the normalised one SamplingParams holds."""
    import infer.profiles.settings as settings_module
    from infer.engine.sampling import SamplingParams

    coerced: list[str] = []
    real = settings_module.coerce_value
    monkeypatch.setattr(
        settings_module,
        "coerce_value",
        lambda spec, raw, origin: coerced.append(spec.name) or real(spec, raw, origin),
    )
    parsed: list[dict] = []
    real_parse = SamplingParams.parse.__func__

    def parse(cls, values):  # type: ignore[no-untyped-def]
        parsed.append(dict(values))
        return real_parse(cls, values)

    monkeypatch.setattr(SamplingParams, "parse", classmethod(parse))
    settings = resolve_settings({"temperature": "0.25", "seed": "-1", "threads": "2"}, env={})
    assert "temperature" not in coerced and "seed" not in coerced and "threads" in coerced
    assert len(parsed) == 1 and parsed[0]["temperature"] == "0.25"
    assert settings.temperature == 0.25 and settings.sampling.temperature == 0.25
    assert settings.seed is None, "seed -1 normalises to None, read from SamplingParams"
    assert settings.source("temperature") == Provenance("flag", "--temp")


def test_kv_cache_dtype_reaches_the_engine_config_from_each_source(tmp_path: Path) -> None:
    """One road: the profile schema types `kv_cache_dtype` (f32 or f16), EngineConfig carries it."""
    from infer.cli.runtime import engine_config

    default = resolve_settings({}, env={})
    assert default.kv_cache_dtype == "f32" and engine_config(default).kv_cache_dtype == "f32"
    flag = resolve_settings({"kv_cache_dtype": "f16"}, env={})
    assert str(flag.source("kv_cache_dtype")) == "flag --kv-cache-dtype"
    assert engine_config(flag).kv_cache_dtype == "f16"
    env = resolve_settings({}, env={"INFER_KV_CACHE_DTYPE": "f16"})
    assert env.kv_cache_dtype == "f16" and env.source("kv_cache_dtype").kind == "env"
    profile = tmp_path / "p.yaml"
    profile.write_text("cpu_kernels: int8\nkv_cache_dtype: f16\n")
    assert engine_config(resolve_settings({"profile": str(profile)}, env={})).kv_cache_dtype == "f16"
    with pytest.raises(
        SettingsError, match=r"^env INFER_KV_CACHE_DTYPE: kv_cache_dtype must be 'f32' or 'f16'"
    ):
        resolve_settings({}, env={"INFER_KV_CACHE_DTYPE": "q8_0"})
