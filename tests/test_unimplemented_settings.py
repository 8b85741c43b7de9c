"""Settings this build cannot honour yet are refused (exit 2), never accepted and then ignored."""

from __future__ import annotations

import pytest
from cli_process import infer_cli

from infer.profiles.settings import SettingsError, refuse_unimplemented, resolve_settings


def test_defaults_and_the_shipped_cpu_profiles_are_accepted() -> None:
    for profile in ("cpu", "cpu-fast"):
        refuse_unimplemented(resolve_settings({"profile": profile}, env={}))


@pytest.mark.parametrize(
    ("flags", "env", "named"),
    [
        ({"spec_method": "prompt_lookup"}, {}, "--spec-method"),
        ({"spec_method": "draft_model", "spec_draft_model": "d.gguf"}, {}, "--spec-method"),
        ({}, {"INFER_SPEC_NUM_TOKENS": "3"}, "env INFER_SPEC_NUM_TOKENS"),
        ({"spec_ngram_max": 4}, {}, "--spec-ngram-max"),
    ],
)
def test_speculative_settings_are_refused_naming_their_source(
    flags: dict[str, object], env: dict[str, str], named: str
) -> None:
    settings = resolve_settings(flags, env=env)
    with pytest.raises(SettingsError, match="speculative decoding is not implemented yet") as info:
        refuse_unimplemented(settings)
    assert named in str(info.value)


@pytest.mark.parametrize(
    "args",
    [
        ["generate", "--spec-method", "prompt_lookup", "hi"],
        ["generate", "--spec-method", "draft_model", "--spec-draft-model", "nope.gguf", "hi"],
        ["stream", "--spec-num-tokens", "4", "hi"],
        ["bench", "--spec-method", "prompt_lookup", "-p", "8", "-n", "4"],
        ["serve", "--spec-method", "prompt_lookup", "--port", "0"],
    ],
)
def test_cli_refuses_speculation_with_one_line_and_exit_2(args: list[str]) -> None:
    result = infer_cli(*args, timeout=60, env={"INFER_HOME": "/nonexistent-infer-home"})
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "speculative decoding is not implemented yet" in lines[0]
    assert result.stdout == ""
