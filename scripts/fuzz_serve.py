#!/usr/bin/env python
"""Fuzz `infer serve` with schemathesis: every route, every check, from the server's own OpenAPI document.

Starts `infer serve` on 127.0.0.1 (a given model, or a tiny synthetic one built on the spot), runs
`schemathesis run --checks all --continue-on-failure` against it with a fixed seed and example
budget, and prints the failures by check. Every response is checked against the document, streamed
ones event by event (the document describes each Server-Sent Event's JSON). `--continue-on-failure`
keeps each route's fuzzing going past its first failure, so one ungated finding (a schema-valid body
the server refuses on purpose, ST202) cannot end a route's fuzzing before a request succeeds. Exit 1
when a *gated* check failed (the four issue 19 names: a 5xx, a status, a content type or a body the
document does not describe), when the server logged a traceback, or when it did not exit cleanly;
other checks are reported, not gated.

    python scripts/fuzz_serve.py                              # the long run: 1000 examples per route
    python scripts/fuzz_serve.py --max-examples 40            # what CI runs (tests/test_serve_fuzz.py)
    python scripts/fuzz_serve.py --model ~/.cache/infer/models/...gguf --max-examples 300
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from infer.cli.serve.launch import ServerProcess, start_server

GATED_CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "response_schema_conformance",
    "content_type_conformance",
)
"""The checks a run must pass with 0 failures (issue 19's acceptance)."""


def codes_for(check_names: tuple[str, ...]) -> frozenset[str]:
    """Schemathesis failure codes (`ST101`, ...) that these checks report, read from its classes."""
    import schemathesis.openapi.checks  # noqa: F401 -- defines the OpenAPI failure classes
    from schemathesis.core.failures import Failure

    codes: set[str] = set()
    pending = [Failure]
    while pending:
        cls = pending.pop()
        pending.extend(cls.__subclasses__())
        checks = getattr(cls, "checks", ())
        if isinstance(checks, tuple) and set(checks) & set(check_names) and isinstance(cls.code, str):
            codes.add(cls.code)
    return frozenset(codes)


def gated_codes() -> frozenset[str]:
    """The failure codes of the gated checks."""
    return codes_for(GATED_CHECKS)


@dataclass
class FuzzResult:
    """What one schemathesis run found."""

    generated: int
    seconds: float
    failures: list[dict[str, object]] = field(default_factory=list)
    errors: list[dict[str, object]] = field(default_factory=list)
    gated_failures: list[dict[str, object]] = field(default_factory=list)
    server_tracebacks: int = 0
    output: str = ""

    @property
    def ok(self) -> bool:
        """No gated failure, no traceback in the server's log."""
        return not self.gated_failures and self.server_tracebacks == 0

    def count(self, *codes: str) -> int:
        """How many failures of these schemathesis codes were found."""
        return sum(int(f.get("count", 1) or 1) for f in self.failures if f.get("code") in codes)


def tiny_model(folder: Path) -> Path:
    """A tiny synthetic GGUF (the test suite's generator) in `folder`."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic import write_tiny_model

    return write_tiny_model(folder).gguf_path


def run_schemathesis(
    url: str, *, max_examples: int, seed: int, workers: int, report: Path, timeout: float
) -> subprocess.CompletedProcess[str]:
    """`schemathesis run` against `url`'s own document, every check, a JSON report at `report`. It runs
    in the report's folder: schemathesis keeps a cache (`.schemathesis/`) in its working directory."""
    executable = shutil.which("schemathesis") or shutil.which("st")
    command = [executable] if executable else [sys.executable, "-m", "schemathesis.cli"]
    command += [
        "run",
        f"{url}/openapi.json",
        "--checks",
        "all",
        "--max-examples",
        str(max_examples),
        "--seed",
        str(seed),
        "--workers",
        str(workers),
        "--generation-database",
        "none",
        "--request-timeout",
        "60",
        "--no-color",
        "--continue-on-failure",
        "--report",
        "json",
        "--report-json-path",
        str(report),
    ]
    return subprocess.run(
        command, capture_output=True, text=True, timeout=timeout, check=False, cwd=report.parent
    )


def fuzz(
    server: ServerProcess, *, max_examples: int, seed: int, workers: int = 2, timeout: float = 3600
) -> FuzzResult:
    """Run schemathesis against a started server and collect its findings."""
    assert server.url is not None
    with tempfile.TemporaryDirectory() as tmp:
        report_path = Path(tmp) / "report.json"
        started = time.monotonic()
        run = run_schemathesis(
            server.url, max_examples=max_examples, seed=seed, workers=workers, report=report_path,
            timeout=timeout,
        )  # fmt: skip
        seconds = time.monotonic() - started
        if not report_path.exists():
            raise RuntimeError(f"schemathesis wrote no report:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}")
        report = json.loads(report_path.read_text())
    codes = gated_codes()
    failures = list(report.get("failures", []))
    return FuzzResult(
        generated=int(report.get("test_cases", {}).get("generated", 0)),
        seconds=seconds,
        failures=failures,
        errors=list(report.get("errors", [])),
        gated_failures=[f for f in failures if f.get("code") in codes],
        server_tracebacks=server.stderr.count("Traceback"),
        output=run.stdout,
    )


def main(argv: list[str] | None = None) -> int:
    """Parse flags, start the server, fuzz, print the findings; exit 1 on a gated failure."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", help="model to serve (default: a tiny synthetic GGUF)")
    parser.add_argument("--max-examples", type=int, default=1000, help="examples per route and phase")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--ctx-size", type=int, default=64, help="small: every generation stays short")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(tiny_model(Path(tmp) / "tiny"))
        server = start_server(["-m", model, "-c", str(args.ctx_size), "--max-num-seqs", "8"])
        try:
            result = fuzz(server, max_examples=args.max_examples, seed=args.seed, workers=args.workers)
        finally:
            status = server.stop()
    print(f"schemathesis: {result.generated} cases in {result.seconds:.0f} s (seed {args.seed})")
    for failure in result.failures:
        gated = "GATED " if failure in result.gated_failures else ""
        print(f"  {gated}{failure.get('code')} {failure.get('title')}: {failure.get('count')} "
              f"({', '.join(map(str, failure.get('operations', [])))})")  # fmt: skip
    for error in result.errors:
        print(f"  schemathesis error: {str(error)[:200]}")
    print(f"server: exit {status}, {result.server_tracebacks} tracebacks in its log")
    print(
        f"summary: {result.generated} cases, {result.count(*codes_for(('not_a_server_error',)))} x 5xx, "
        f"{result.count(*codes_for(('response_schema_conformance',)))} response-schema violations, "
        f"{len(result.gated_failures)} gated failures, {len(result.errors)} schemathesis errors, "
        f"server {'crashed' if status not in (0, None) else 'exited 0'}"
    )
    return 0 if result.ok and status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
