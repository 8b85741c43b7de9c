#!/usr/bin/env python
"""Seven stock OpenAI clients against `infer serve` on the default model (issue 34, acceptance 1).

    python scripts/clients_check.py [--runs 20] [--venv DIR] [--clients openai,litellm] [--json OUT]

Installs each client from the package index into its own throwaway venv (`--venv DIR` keeps and
reuses them), starts `infer serve` (the default model, `--seed 0`), and runs scripts/clients_calls.py
in each venv: the client's basic, streaming, structured (a JSON schema with two integer fields) and
Responses calls, then `--runs` seeded structured calls at temperature 0.8 (200-token limit). The
server's access log gives the finish reasons; a seeded call that ends at the token limit is a
runaway (the issue's integers wrote 300 tokens of digits). Prints one row per client and exits 1 if
any integer has more than 16 digits or any seeded call ran to the token limit.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from infer.cli.serve.launch import start_server

HERE = Path(__file__).resolve().parent
CLIENT_PACKAGES = {
    "openai": "openai",
    "langchain-openai": "langchain-openai",
    "litellm": "litellm",
    "instructor": "instructor",
    "openai-agents": "openai-agents",
    "pydantic-ai": "pydantic-ai-slim[openai]",
    "llama-index": "llama-index-llms-openai-like",
}
"""Each client (by the name clients_calls.py knows it by) and what its venv installs: one venv per
client, as its users install it (they disagree on openai: openai-agents needs 3.x, litellm pins
below 3, and pydantic-ai's Responses model reads fields only 3.x has). pydantic-ai is its slim
distribution with the OpenAI extra: the full one pulls every provider's SDK."""
CALLS = ("basic", "stream", "structured", "responses")


def make_venv(folder: Path, requirement: str) -> Path:
    """The venv's python, creating the venv and installing `requirement` when it has none."""
    python = folder / "bin" / "python"
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True)
        # the venv's own pip may be old: its resolver backtracked for over 13 minutes on the seven
        # clients together, where a current one takes seconds per client
        subprocess.run([str(python), "-m", "pip", "install", "-q", "--upgrade", "pip"], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", requirement], check=True)
    return python


def run_client(python: Path, name: str, base: str, model: str, runs: int, timeout: float) -> dict[str, Any]:
    """clients_calls.py's report for one client (an `error` entry if it did not report)."""
    command = [str(python), str(HERE / "clients_calls.py"), name, base, model, str(runs)]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"client": name, "error": f"no report within {timeout:.0f} s"}
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode or not lines:
        return {"client": name, "error": (done.stderr or done.stdout)[-2000:]}
    return json.loads(lines[-1])  # type: ignore[no-any-return]


def finish_reasons(lines: list[str]) -> dict[str, int]:
    """Finish reasons counted from access-log lines (`... finish stop`)."""
    counts: dict[str, int] = {}
    for line in lines:
        if " finish " in line:
            for reason in line.rsplit(" finish ", 1)[1].split(","):
                counts[reason] = counts.get(reason, 0) + 1
    return counts


def summarise(report: dict[str, Any], log: list[str]) -> dict[str, Any]:
    """One row of the table: the calls' verdicts, the seeded runs, the longest integer, the finishes."""
    if "error" in report:
        return {"client": report["client"], "error": report["error"]}
    seeded = report["seeded"]
    digits = [len(str(abs(n))) for run in seeded for n in run["integers"]]
    marks = [i for i, line in enumerate(log) if " GET /health " in line]
    seeded_log = log[marks[0] + 1 :] if marks else log  # clients_calls.py marks where they start
    return {
        "client": report["client"],
        "version": report["version"],
        **{call: report["calls"][call]["ok"] for call in CALLS},
        "seeded_ok": sum(run["ok"] for run in seeded),
        "seeded": len(seeded),
        "seeded_at_token_limit": finish_reasons(seeded_log).get("length", 0),
        "max_integer_digits": max(digits, default=0),
        "finish_reasons": finish_reasons(log[: marks[0]] if marks else []),
        "seeded_finish_reasons": finish_reasons(seeded_log),
        "failures": sorted({run["detail"][:160] for run in seeded if not run["ok"]})[:5],
        "call_details": {call: report["calls"][call]["detail"][:200] for call in CALLS},
    }


def print_table(rows: list[dict[str, Any]]) -> None:
    """The rows as a plain table on stdout."""
    mark = {True: "ok", False: "FAIL", None: "n/a"}
    print(f"{'client':18} {'version':9} " + " ".join(f"{c:10}" for c in CALLS) + " seeded  limit digits")
    for row in rows:
        if "error" in row:
            print(f"{row['client']:18} ERROR {row['error'][-300:]}")
            continue
        cells = " ".join(f"{mark[row[c]]:10}" for c in CALLS)
        print(
            f"{row['client']:18} {row['version']:9} {cells} {row['seeded_ok']:>2}/{row['seeded']:<4} "
            f"{row['seeded_at_token_limit']:>5} {row['max_integer_digits']:>6}  "
            f"calls {row['finish_reasons']} seeded {row['seeded_finish_reasons']}"
        )
        for failure in row["failures"]:
            print(f"{'':18} seeded failure: {failure}")
        for call in CALLS:
            if row[call] is False:
                print(f"{'':18} {call}: {row['call_details'][call]}")


def main() -> int:
    """Install, serve, run every client, print the table; 1 on a runaway integer or a token-limit run."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="seeded structured calls per client")
    parser.add_argument("--venv", type=Path, help="keep (and reuse) the clients' venvs in this folder")
    parser.add_argument("--clients", default=",".join(CLIENT_PACKAGES), help="comma-separated subset")
    parser.add_argument("--json", type=Path, help="write the rows here as JSON")
    parser.add_argument("--timeout", type=float, default=3600, help="seconds per client")
    args = parser.parse_args()
    scratch = None if args.venv else Path(tempfile.mkdtemp(prefix="infer-clients-"))
    folder = args.venv or scratch
    assert folder is not None
    try:
        pythons = {}
        for name in args.clients.split(","):
            started = time.monotonic()
            pythons[name] = make_venv(folder / name, CLIENT_PACKAGES[name])
            print(f"{name}: venv ready in {time.monotonic() - started:.0f} s", file=sys.stderr)
        server = start_server(["-c", "2048", "--seed", "0", "--max-num-seqs", "4"])
        try:
            assert server.url is not None
            model = httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"][0]["id"]
            rows = []
            for name, python in pythons.items():
                mark = len(server.stderr_lines)
                began = time.monotonic()
                report = run_client(python, name, f"{server.url}/v1", model, args.runs, args.timeout)
                row = summarise(report, server.stderr_lines[mark:])
                row["seconds"] = round(time.monotonic() - began, 1)
                rows.append(row)
                done = f"{row.get('seeded_ok', '-')}/{args.runs}"
                print(f"{name}: {done} seeded runs ok in {row['seconds']} s", file=sys.stderr)
        finally:
            server.stop()
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    runaway = any(r.get("max_integer_digits", 0) > 16 or r.get("seeded_at_token_limit", 0) for r in rows)
    return 1 if runaway else 0


if __name__ == "__main__":
    sys.exit(main())
