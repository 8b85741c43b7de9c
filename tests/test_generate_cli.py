"""`infer generate` end to end on the tiny synthetic model.

Most runs go through the Typer app in-process (`CliRunner`: separate stdout/stderr, exit codes,
stdin), which costs milliseconds; two run the real `infer` entry point in a subprocess. Each run
happens once, in module fixtures, and the tests read the results.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from infer.cli.main import app
from infer.engine.backends.probe import probe_backend
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.text.tokenizer import Tokenizer

pytest_plugins = ["conftest_synthetic"]

PROMPT = "hello the world is"
ENTRY = "import sys; from infer.cli.main import main; sys.argv[0] = 'infer'; main()"
JSON_FIELDS = {
    "text", "prompt_ids", "token_ids", "finish_reason", "error", "seed", "prompt_tokens",
    "completion_tokens", "load_s", "prefill_s", "decode_s", "ttft_s", "prefill_tokens_per_s",
    "decode_tokens_per_s", "speculative",
}  # fmt: skip
CUDA_MISSING = probe_backend("cuda") is not None


@dataclass(frozen=True)
class Result:
    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict:
        lines = self.stdout.splitlines()
        assert len(lines) == 1, f"--json must print exactly one line, got {self.stdout!r}"
        return json.loads(lines[0])

    @property
    def stderr_lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def invoke(args: tuple[str, ...], stdin: str | None = None) -> Result:
    """Run the CLI in-process."""
    result = CliRunner().invoke(app, list(args), input=stdin, env={"INFER_PROFILE": None})
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return Result(args, result.exit_code, result.stdout, result.stderr)


def run_infer(args: tuple[str, ...], stdin: str | None = None, timeout: float = 60) -> Result:
    """Run the real entry point in a subprocess."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFER_")}
    env["PYTHONIOENCODING"] = "utf-8"
    proc = subprocess.run(
        [sys.executable, "-c", ENTRY, *args],
        input=(stdin or "").encode(),
        capture_output=True,
        timeout=timeout,
        env=env,
    )
    return Result(args, proc.returncode, proc.stdout.decode("utf-8"), proc.stderr.decode("utf-8"))


@pytest.fixture(scope="module")
def model(tiny_gguf: Path) -> tuple[str, ...]:
    return ("-m", str(tiny_gguf), "-t", "1", "-n", "8")


@pytest.fixture(scope="module")
def tokenizer(tiny_gguf: Path) -> Tokenizer:
    return load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=1)).tokenizer


@pytest.fixture(scope="module")
def runs(model: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    """Every successful run the tests look at, by name."""
    gen = ("generate", *model)
    sampled = ("--temp", "0.8")
    plan: dict[str, tuple[tuple[str, ...], str | None]] = {
        "seed7": ((*gen, "--raw", *sampled, "--seed", "7", "--json", PROMPT), None),
        "seed7_stdin": ((*gen, "--raw", *sampled, "--seed", "7", "--json", "-"), PROMPT),
        "chat_random": ((*gen, "--chat", *sampled, "--json", PROMPT), None),
        "chat_random2": ((*gen, *sampled, "--json", PROMPT), None),
        "greedy_cpu": ((*gen, "--profile", "cpu", "--raw", "--temp", "0", "--json", PROMPT), None),
        "greedy_cuda": ((*gen, "--profile", "cuda", "--raw", "--temp", "0", "--json", PROMPT), None),
        "greedy_plain": ((*gen, "--raw", "--temp", "0", PROMPT), None),
        "greedy_stream": ((*gen, "--raw", "--temp", "0", "--stream", PROMPT), None),
    }
    results = {name: invoke(args, stdin) for name, (args, stdin) in plan.items()}
    for name, result in results.items():
        assert result.returncode == 0, f"{name}: {result.args} exited {result.returncode}: {result.stderr}"
        assert "Traceback" not in result.stderr, result.stderr
    # The reported seed of the unseeded chat run reproduces it.
    seed = str(results["chat_random"].json["seed"])
    results["chat_reseeded"] = invoke((*gen, "--chat", *sampled, "--seed", seed, "--json", PROMPT))
    return results


def test_json_fields(runs: dict[str, Result], tokenizer: Tokenizer) -> None:
    out = runs["seed7"].json
    assert set(out) == JSON_FIELDS
    assert out["finish_reason"] == "length" and out["error"] is None
    assert out["speculative"] is None, "no speculation without a spec_method"
    assert out["prompt_ids"] == tokenizer.encode(PROMPT, add_bos=False)
    assert out["prompt_tokens"] == len(out["prompt_ids"])
    assert out["completion_tokens"] == len(out["token_ids"]) == 8
    assert out["text"] == tokenizer.decode(out["token_ids"], skip_special=True)
    for key in ("load_s", "prefill_s", "decode_s", "ttft_s", "prefill_tokens_per_s", "decode_tokens_per_s"):
        assert isinstance(out[key], (int, float)) and out[key] >= 0, key
    assert out["ttft_s"] >= out["prefill_s"] > 0 and out["decode_s"] > 0
    assert out["decode_tokens_per_s"] == pytest.approx(7 / out["decode_s"], rel=0.1)
    assert runs["seed7"].stderr == ""


def test_seed_is_reported_and_repeats(runs: dict[str, Result]) -> None:
    first, again = runs["seed7"].json, runs["seed7_stdin"].json
    assert first["seed"] == 7
    assert again == {**first, **{k: again[k] for k in again if k.endswith("_s") or k.endswith("_per_s")}}
    assert first["token_ids"] != runs["greedy_cpu"].json["token_ids"], "--temp 0.8 gave the greedy tokens"


def test_stdin_prompt(runs: dict[str, Result]) -> None:
    assert runs["seed7_stdin"].json["prompt_ids"] == runs["seed7"].json["prompt_ids"]
    assert runs["seed7_stdin"].json["text"] == runs["seed7"].json["text"]


def test_reported_seed_reproduces_an_unseeded_run(runs: dict[str, Result]) -> None:
    random1, random2 = runs["chat_random"].json, runs["chat_random2"].json
    assert isinstance(random1["seed"], int) and 0 <= random1["seed"] < 2**64
    assert random1["seed"] != random2["seed"], "without --seed every run needs a fresh seed"
    replay = runs["chat_reseeded"].json
    assert replay["seed"] == random1["seed"]
    assert replay["token_ids"] == random1["token_ids"] and replay["text"] == random1["text"]


def test_chat_and_raw(runs: dict[str, Result], tokenizer: Tokenizer) -> None:
    chat = runs["chat_random"].json["prompt_ids"]
    expected = f"<|im_start|>user\n{PROMPT}<|im_end|>\n<|im_start|>assistant\n"
    assert tokenizer.decode(chat, skip_special=False) == expected
    # The tiny model has a chat template, so chat is the default.
    assert runs["chat_random2"].json["prompt_ids"] == chat
    assert runs["seed7"].json["prompt_ids"] == tokenizer.encode(PROMPT, add_bos=False)


@pytest.mark.skipif(not CUDA_MISSING, reason="CUDA is available here: no fallback")
def test_cuda_profile_falls_back_with_one_notice(runs: dict[str, Result]) -> None:
    cuda, cpu = runs["greedy_cuda"], runs["greedy_cpu"]
    assert len(cuda.stderr_lines) == 1, cuda.stderr
    notice = cuda.stderr_lines[0]
    assert notice.startswith("infer:") and "'cuda'" in notice and "using cpu" in notice
    assert cpu.stderr == ""
    assert cuda.json["token_ids"] == cpu.json["token_ids"] and cuda.json["text"] == cpu.json["text"]


def test_plain_and_streamed_output(runs: dict[str, Result]) -> None:
    text = runs["greedy_cpu"].json["text"]
    assert runs["greedy_plain"].stdout == text + "\n"
    assert runs["greedy_stream"].stdout == text + "\n"


BAD_INPUTS = {
    "no prompt": ((), None),
    "missing model": (("--model", "/nonexistent/model.gguf", "hi"), None),
    "prompt longer than the context": (("-c", "8", "--raw", "hello the world is " * 4), None),
    "empty stdin prompt": (("--raw", "-"), ""),
    "top_p out of range": (("--top-p", "2", "hi"), None),
    "temperature nan": (("--temp", "nan", "hi"), None),
    "n_predict not a number": (("-n", "abc", "hi"), None),
    "missing messages file": (("--messages", "/nonexistent/messages.json"), None),
    "messages not a list": (("--messages", "{path}/object.json"), None),
    "messages not JSON": (("--messages", "{path}/broken.json"), None),
}


@pytest.fixture(scope="module")
def bad_runs(model: tuple[str, ...], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Result]:
    folder = tmp_path_factory.mktemp("messages")
    (folder / "object.json").write_text('{"role": "user", "content": "hi"}')
    (folder / "broken.json").write_text('[{"role": "user",')
    return {
        name: invoke(("generate", *model, *(a.format(path=folder) for a in args)), stdin)
        for name, (args, stdin) in BAD_INPUTS.items()
    }


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_exits_2_with_one_line(bad_runs: dict[str, Result], case: str) -> None:
    result = bad_runs[case]
    assert result.returncode == 2, (result.returncode, result.stderr)
    assert result.stdout == ""
    assert len(result.stderr_lines) == 1, result.stderr
    assert result.stderr_lines[0].startswith("infer: error: ")
    assert "Traceback" not in result.stderr


def test_entry_point_subprocess(model: tuple[str, ...], runs: dict[str, Result]) -> None:
    """The installed entry point: a real pipe on stdin, real exit codes, the same results."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        good = pool.submit(
            run_infer, ("generate", *model, "--raw", "--temp", "0.8", "--seed", "7", "--json", "-"), PROMPT
        )
        bad = pool.submit(run_infer, ("generate", *model, "-c", "8", "--raw", "hello the world is " * 4))
        good_result, bad_result = good.result(), bad.result()
    assert good_result.returncode == 0, good_result.stderr
    assert good_result.stderr == ""
    assert good_result.json["token_ids"] == runs["seed7"].json["token_ids"]
    assert good_result.json["text"] == runs["seed7"].json["text"]
    assert bad_result.returncode == 2 and bad_result.stdout == ""
    assert len(bad_result.stderr_lines) == 1 and bad_result.stderr_lines[0].startswith("infer: error: ")
    assert "Traceback" not in bad_result.stderr
