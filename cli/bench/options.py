"""`infer bench`'s own options (the shared settings flags come on top: `-n` is the shared
`-n/--n-predict`, read by bench as the list of decode lengths; `--server URL` is the shared `server_url`
setting, also from `INFER_SERVER_URL` or a profile with `backend: remote`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from infer.cli.options import option
from infer.cli.server_client import API_KEY_ENV


@dataclass(frozen=True)
class BenchOptions:
    """What to measure and how to report it; each field is the command-line option of its metadata."""

    n_prompt: Optional[list[str]] = option(
        None, "-p", "--n-prompt", help="Prefill test sizes (comma list). Default 512 unless -pg/-n alone."
    )
    prompt_gen: Optional[list[str]] = option(
        None, "-pg", "--prompt-gen", help="Prompt+generation tests as P,N (repeatable)."
    )
    repetitions: int = option(3, "-r", "--repetitions", min=1, help="Repetitions per test.")
    depth: Optional[list[str]] = option(
        None, "-d", "--depth", help="Fill the KV cache with this many tokens before pp/tg tests (comma list)."
    )
    concurrency: Optional[str] = option(
        None, "--concurrency", help="Concurrent decode sweep, e.g. 1,4,16 (aggregate t/s and latencies)."
    )
    concurrency_prompt: int = option(
        32, "--concurrency-prompt", min=1, help="Prompt tokens of each request in the concurrency sweep."
    )
    warmup: bool = option(True, "--warmup/--no-warmup", help="One uncounted warm-up run per test.")
    json_output: bool = option(False, "--json", help="JSON on stdout (all else on stderr).")
    jsonl_output: bool = option(False, "--jsonl", help="One JSON object per test on stdout.")
    csv_output: bool = option(False, "--csv", help="CSV on stdout.")
    baseline: Optional[Path] = option(
        None, "--baseline", help="A previous --json output: exit 1 when a figure regresses."
    )
    plot: Optional[Path] = option(
        None,
        "--plot",
        metavar="FILE.png|svg",
        help="Draw the run (tok/s and TTFT/ITL percentiles against concurrency, tok/s against prompt "
        "length) into this picture; needs matplotlib (pip install 'infer[plot]'). Several runs: "
        "infer bench compare A.json B.json --plot FILE.",
    )
    tolerance: float = option(0.1, "--tolerance", help="Allowed regression vs --baseline (0.1 = 10%).")
    api: str = option(
        "chat",
        "--api",
        help="With --server or --dataset: chat (/v1/chat/completions; the chat template) or "
        "completions (raw prompts).",
    )
    server_model: Optional[str] = option(
        None,
        "--server-model",
        help="With --server: the model name to send (default: the first of /v1/models).",
    )
    api_key: Optional[str] = option(
        None, "--api-key", help=f"With --server: the API key (env {API_KEY_ENV}).", show_default=False
    )
    dataset: Optional[Path] = option(
        None,
        "--dataset",
        help="A serving run over this JSONL file of prompts or chats, tools allowed "
        "(scripts/bench_prompts.jsonl), on --server or the local engine; -n is each request's length, "
        "--concurrency the limits swept.",
    )
    num_prompts: Optional[int] = option(
        None, "--num-prompts", min=1, help="With --dataset: send this many requests (cycling the file)."
    )
    request_rate: float = option(
        float("inf"),
        "--request-rate",
        help="With --dataset: requests/s, Poisson arrivals (inf = all at once).",
    )
    burstiness: float = option(
        1.0,
        "--burstiness",
        help="With --dataset: gamma shape of the arrival gaps (1 = Poisson, <1 burstier).",
    )
    max_concurrency: Optional[int] = option(
        None, "--max-concurrency", min=1, help="With --dataset: at most this many requests in flight."
    )
    slo: Optional[str] = option(
        None, "--slo", help="With --dataset: goodput counts requests within ttft=MS,tpot=MS(,e2e=MS)."
    )
