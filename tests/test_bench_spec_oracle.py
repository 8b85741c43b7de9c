"""scripts/bench_spec.py's oracle drafter bound, on hand-made token streams."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))

import bench_spec  # found through the path above

NGRAM = range(4, 0, -1)


def test_a_copied_prompt_is_gained_k_plus_one_tokens_a_step() -> None:
    """Step 1 has nothing to copy (the first token); from then on each verify keeps 4 drafts and the
    target's own token: 1 + 5 + 5 + 1 tokens in 4 steps."""
    prompt = list(range(10, 22))  # 12 distinct tokens
    output = [10, *range(11, 21), 99]  # the prompt again, then a token it never had
    assert bench_spec.oracle_tokens_per_step(prompt, output, 4, NGRAM) == len(output) / 4


def test_the_oracle_takes_the_occurrence_whose_continuation_matches() -> None:
    """Two earlier occurrences of the last token: a drafter taking the most recent one would fail, the
    oracle takes the one the answer follows."""
    prompt = [1, 2, 3, 1, 7, 8, 9, 1]
    output = [2, 3, 5]
    # one step: the occurrence at 0 gives drafts 2, 3 (then 1, not 5), the target's token is 5
    assert bench_spec.oracle_tokens_per_step(prompt, output, 4, NGRAM) == 3.0


def test_nothing_to_copy_is_one_token_a_step() -> None:
    assert bench_spec.oracle_tokens_per_step([1, 2, 3], [4, 5, 6], 4, NGRAM) == 1.0
