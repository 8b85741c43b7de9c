"""`infer gate`'s own options (the shared settings flags come on top; an anchor pins its sampler and
n_predict, so those flags are refused). `--server URL` is the shared `server_url` setting (env
`INFER_SERVER_URL`, or a profile with `backend: remote`): the anchors then run on that server, and
`--model` names the served model (default: the first of /v1/models)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from infer.cli.options import option
from infer.cli.server_client import API_KEY_ENV, DEFAULT_TIMEOUT_S

DEFAULT_TIE_MARGIN = 1e-3
"""Near-tie threshold: the top two probabilities differ by less than this fraction."""


@dataclass(frozen=True)
class GateOptions:
    """How to check the anchors and report; each field is the command-line option of its metadata."""

    bless: bool = option(False, "--bless", help="Write fresh expectations (and fingerprint) back.")
    keep_tokens: bool = option(
        False, "--keep-tokens", help="With --bless: also store token ids and per-step top-2 gaps."
    )
    tie_margin: float = option(
        DEFAULT_TIE_MARGIN,
        "--tie-margin",
        help="Near-tie: the top two probabilities differ by less than this fraction, (p1-p2)/p1.",
    )
    allow_ties: bool = option(
        False, "--allow-ties", help="A divergence that starts at a near-tie is a warning, not a failure."
    )
    deterministic: bool = option(
        False, "--deterministic", help="Pin BLAS threads to the profile's value (0 = all cores) for the run."
    )
    junit: Optional[Path] = option(None, "--junit", help="Write a JUnit XML report here.")
    json_output: bool = option(False, "--json", help="JSON results on stdout (everything else on stderr).")
    filters: Optional[list[str]] = option(
        None, "--filter", help="Run only anchors whose name contains NAME (or matches a glob); repeatable."
    )
    audit: bool = option(
        False,
        "--audit",
        help="Replay every token of constrained anchors through a fresh matcher; fail on any token "
        "the grammar did not allow.",
    )
    api_key: Optional[str] = option(
        None, "--api-key", help=f"With --server: the API key (env {API_KEY_ENV}).", show_default=False
    )
    tokenizer: Optional[str] = option(
        None,
        "--tokenizer",
        help="With --server: the model file whose tokenizer makes raw prompts into ids and retokenizes "
        "text when the server returns no ids; 'none' for no local tokenizer. Default: the anchors' model.",
    )
    timeout: float = option(
        DEFAULT_TIMEOUT_S, "--timeout", help="With --server: seconds to wait for each answer."
    )
