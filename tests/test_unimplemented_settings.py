"""Settings this build would not honour are refused (exit 2), never accepted and then ignored.

Speculative decoding works; what is refused is a `speculative.*` key given by a flag or an env
variable that the chosen method does not read (it would be ignored), and a draft model whose
tokenizer is not the model's (its drafts would be other tokens)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from cli_process import infer_cli

from infer.profiles.settings import SettingsError, refuse_unimplemented, resolve_settings

pytest_plugins = ["conftest_synthetic"]


def test_defaults_and_the_shipped_cpu_profiles_are_accepted() -> None:
    for profile in ("cpu", "cpu-fast"):
        refuse_unimplemented(resolve_settings({"profile": profile}, env={}))
    # A profile's speculation switched off by a flag: its other keys are the profile's, not refused.
    refuse_unimplemented(resolve_settings({"profile": "cpu-fast", "spec_method": "none"}, env={}))


@pytest.mark.parametrize(
    "flags",
    [
        {"spec_method": "prompt_lookup", "spec_num_tokens": 3, "spec_ngram_max": 4, "spec_draft_min": 1},
        {"spec_method": "draft_model", "spec_draft_model": "d.gguf", "spec_p_min": 0.5, "spec_adaptive": 0},
    ],
)
def test_keys_the_method_reads_are_accepted(flags: dict[str, object]) -> None:
    refuse_unimplemented(resolve_settings(flags, env={}))


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [
        ({}, {"INFER_SPEC_NUM_TOKENS": "3"}, "env INFER_SPEC_NUM_TOKENS"),
        ({"spec_ngram_max": 4}, {}, "--spec-ngram-max"),
        ({"spec_method": "prompt_lookup", "spec_p_min": 0.5}, {}, "--spec-p-min"),
        ({"spec_method": "prompt_lookup", "spec_draft_model": "d.gguf"}, {}, "--spec-draft-model"),
        ({"spec_method": "draft_model", "spec_draft_model": "d", "spec_ngram_min": 2}, {}, "ngram-min"),
        ({"profile": "cpu-fast", "spec_p_min": 0.5}, {}, "--spec-p-min"),
    ],
)
def test_a_speculative_key_the_method_ignores_is_refused_naming_its_source(
    flags: dict[str, object], env: dict[str, str], named: str
) -> None:
    settings = resolve_settings(flags, env=env)
    with pytest.raises(SettingsError, match=r"is not used by speculative\.method") as info:
        refuse_unimplemented(settings)
    assert named in str(info.value)


def test_draft_min_above_the_maximum_is_a_settings_error() -> None:
    with pytest.raises(
        SettingsError,
        match=r"flag --spec-draft-min: spec_draft_min must be in \[0, spec_num_tokens = 5\], got 6",
    ):
        resolve_settings({"spec_method": "prompt_lookup", "spec_draft_min": 6}, env={})


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--draft-max", "4", "hi"],
        ["stream", "--spec-method", "prompt_lookup", "--draft-p-min", "0.5", "hi"],
        ["bench", "--spec-ngram-max", "4", "-p", "8", "-n", "4"],
        ["serve", "--spec-method", "prompt_lookup", "-md", "d.gguf", "--port", "0"],
    ],
)
def test_cli_refuses_an_ignored_speculative_flag_with_one_line_and_exit_2(args: list[str]) -> None:
    result = infer_cli(*args, timeout=60, env={"INFER_HOME": "/nonexistent-infer-home"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "is not used by speculative.method" in lines[0]
    assert result.stdout == ""


@pytest.mark.real_model
def test_a_draft_model_with_another_tokenizer_is_refused_at_load(
    tiny_model_factory: Callable[..., object], default_model_path: Path
) -> None:
    """The tiny synthetic model (316 tokens) cannot draft for the default model (49152)."""
    tiny = tiny_model_factory().gguf_path  # type: ignore[attr-defined]
    result = infer_cli("generate", "--spec-method", "draft_model", "-md", str(tiny), "-n", "4", "hi")
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "tokenizer differs from the target model's" in lines[0] and "316 tokens" in lines[0]
    assert result.stdout == ""
