"""Hostile chat templates (issue 19, rows 5-8): each one fails with one line, within its time and memory
bound, and nothing keeps running afterwards. The CLI exits 2 with that line; the server answers 400
`invalid_chat_template` (tests/test_serve_hostile.py)."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
from cli_process import infer_cli

from infer.engine.text.chat import INVALID_CHAT_TEMPLATE, ChatTemplateError, render_chat
from infer.engine.text.sandbox import SandboxLimits, TemplateSandbox

pytest_plugins = ["conftest_synthetic"]

USER = [{"role": "user", "content": "hi"}]
LIMITS = SandboxLimits(timeout_s=1.5, memory_mb=128, max_chars=2**20)

HOSTILE: dict[str, tuple[str, str]] = {
    # name: (template, a word the one-line error must contain)
    "huge_range": ("{% for i in range(1000000000) %}{% endfor %}", "range"),
    "macro_recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recursed"),
    "nested_loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "longer than",
    ),
    "string_times_huge": ("{{ 'x' * 10000000000 }}", "memory"),
    "string_doubling": (
        "{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
        "{% endfor %}{{ ns.s | length }}",
        "memory",
    ),
    "output_flood": ("{% for i in range(100000) %}{{ 'x' * 1000 }}{% endfor %}", "exceeds"),
    "center_padding": ("{{ 'a'.center(10000000000) }}", "memory"),
    "huge_power": ("{{ 10 ** (10 ** 10) }}", ""),  # folded at compile time, in the worker
    "lipsum_flood": ("{{ lipsum(n=100000000) }}", ""),
    "attribute_walk": ("{{ ''.__class__.__mro__[1].__subclasses__() }}", "unsafe"),
    "globals_via_cycler": ("{{ cycler.__init__.__globals__.os.system('true') }}", "unsafe"),
    "globals_via_joiner": ("{{ joiner.__init__.__globals__ }}", "unsafe"),
    "globals_via_namespace": ("{{ namespace.__init__.__globals__ }}", "unsafe"),
    "format_walk": ("{{ '{0.__class__.__init__.__globals__}'.format(1) }}", "unsafe"),
    "mutate_messages": ("{{ messages.append(1) }}", "unsafe"),
    "raise_exception": ("{{ raise_exception('roles must alternate') }}", "roles must alternate"),
    "syntax_error": ("{% for %}", "does not parse"),
    "undefined_call": ("{{ nothing() }}", "undefined"),
}


@pytest.fixture(scope="module")
def sandbox():
    with TemplateSandbox(LIMITS) as box:
        yield box


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_a_hostile_template_fails_with_one_line_within_its_bounds(
    sandbox: TemplateSandbox, name: str
) -> None:
    template, needle = HOSTILE[name]
    started = time.monotonic()
    with pytest.raises(ChatTemplateError) as info:
        render_chat(template, USER, sandbox=sandbox)
    elapsed = time.monotonic() - started
    message = str(info.value)
    assert info.value.code == INVALID_CHAT_TEMPLATE
    assert "\n" not in message and len(message) <= 400, message
    assert needle.lower() in message.lower(), message
    assert elapsed < LIMITS.timeout_s + 1.5, f"{name} took {elapsed:.1f} s"
    # the sandbox still renders a good template afterwards
    assert render_chat("{{ messages[0].content }}", USER, sandbox=sandbox) == "hi"


def test_a_render_past_its_time_kills_the_worker(sandbox: TemplateSandbox) -> None:
    sandbox.start()
    pid = sandbox.worker_pid
    assert pid is not None
    with pytest.raises(ChatTemplateError, match="longer than"):
        render_chat(HOSTILE["nested_loops"][0], USER, sandbox=sandbox)
    assert sandbox.worker_pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped: nothing keeps running after the request is gone


def test_the_worker_ends_with_the_sandbox() -> None:
    box = TemplateSandbox(LIMITS)
    assert render_chat("{{ 1 + 1 }}", USER, sandbox=box) == "2"
    pid = box.worker_pid
    assert pid is not None
    box.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_the_common_case_costs_a_pipe_round_trip(sandbox: TemplateSandbox) -> None:
    template = "{% for m in messages %}<|{{ m.role }}|>{{ m.content }}\n{% endfor %}<|assistant|>"
    messages = [{"role": "user", "content": "hello " * 50}] * 8
    render_chat(template, messages, sandbox=sandbox)  # compiled and cached in the worker
    started = time.perf_counter()
    for _ in range(50):
        render_chat(template, messages, sandbox=sandbox)
    per_render = (time.perf_counter() - started) / 50
    assert per_render < 0.05, f"{per_render * 1e3:.1f} ms per render"


def _hostile_hf_folder(tiny_hf_dir: Path, tmp_path: Path, template: str) -> Path:
    folder = tmp_path / "hostile"
    shutil.copytree(tiny_hf_dir, folder)
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = template
    config_path.write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("name", ["huge_range", "macro_recursion", "string_times_huge"])
def test_cli_answers_a_hostile_template_with_one_line_and_exit_2(
    tiny_hf_dir: Path, tmp_path: Path, name: str
) -> None:
    folder = _hostile_hf_folder(tiny_hf_dir, tmp_path, HOSTILE[name][0])
    result = infer_cli("generate", "--model", str(folder), "--chat", "-n", "2", "hello", timeout=120)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "chat template" in lines[0], result.stderr
