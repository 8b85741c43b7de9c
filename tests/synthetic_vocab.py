"""Tiny random models that carry a real vocabulary, steered so that constrained output ends.

`write_vocab_model(folder, source)` writes `folder/model.gguf`: the tiny llama of tests/synthetic.py
(hidden 32, 2 heads, 2 layers) with the `tokenizer.*` key/values of the GGUF `source` (one of
llama.cpp's tokenizer test vocabularies in tests/data/vocab, or a real model) and its vocabulary size.

The weights are steered so that generation under any grammar ends soon: every layer's output
projections are zero (the logits depend on the current token only), every embedding row shares one
direction, and the rows of a few tokens are multiples of it, so wherever the grammar allows one of
them the one with the largest multiple wins: a stop token, then a newline, `"`, `}`, `]`. The grammar
still decides what is allowed at each step; the steering only makes a JSON value or a list of lines
end rather than run to the token limit. (The Hugging Face folder write_tiny_model also writes keeps
its synthetic tokenizer: use only the GGUF.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from synthetic import write_tiny_model

from infer.engine.loader.gguf import open_reader, read_metadata
from infer.engine.text.tokenizer import Tokenizer

__all__ = ["STEERED_TEXTS", "vocabulary_fields", "write_vocab_model"]

STEERED_TEXTS = ("\n", '"', "}", "]")
"""The texts whose tokens the model prefers after its stop tokens, most preferred first."""

_SYNTHETIC_TOKENIZER_KEYS = (
    "model", "pre", "tokens", "token_type", "merges", "bos_token_id", "eos_token_id",
    "unknown_token_id", "padding_token_id", "add_bos_token",
)  # fmt: skip
"""The `tokenizer.ggml.*` keys write_tiny_model writes; its ChatML `tokenizer.chat_template` stays
where the source has no template (a chat route needs one)."""


def vocabulary_fields(source: Path) -> dict[str, Any]:
    """The `tokenizer.*` key/values of the GGUF `source`."""
    metadata = read_metadata(open_reader(Path(source)))
    return {key: value for key, value in metadata.items() if key.startswith("tokenizer.")}


def _steering(tokenizer: Tokenizer) -> dict[int, float]:
    """Token id -> multiple of the shared direction: the stop tokens first, then STEERED_TEXTS (each
    the first plain token spelled exactly so)."""
    boosts = dict.fromkeys(tokenizer.stop_ids, 8.0)
    spelled = {}
    for token in range(tokenizer.vocab_size):
        if token not in tokenizer.special_ids:
            spelled.setdefault(tokenizer.token_bytes(token), token)
    for rank, text in enumerate(STEERED_TEXTS):
        if text.encode() not in spelled:
            raise ValueError(f"no token of this vocabulary spells {text!r}")
        boosts[spelled[text.encode()]] = 7.0 - rank
    return boosts


def write_vocab_model(folder: Path, source: Path, *, seed: int = 0) -> Path:
    """Write the steered tiny model with `source`'s vocabulary (see the module docstring); its GGUF."""
    fields = vocabulary_fields(source)
    tokenizer = Tokenizer.from_gguf_metadata(fields)
    boosts = _steering(tokenizer)

    def steer(weights: dict[str, np.ndarray]) -> None:
        embedding = weights["model.embed_tokens.weight"]
        rng = np.random.default_rng(seed + 1)
        shared = rng.standard_normal(embedding.shape[1]).astype(np.float32)
        shared *= 2.0 / np.linalg.norm(shared)  # as long as a random row
        embedding += shared
        for token, multiple in boosts.items():
            embedding[token] = multiple * shared
        for name, weight in weights.items():
            if name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
                weight[:] = 0.0

    overrides: dict[str, Any] = {f"tokenizer.ggml.{key}": None for key in _SYNTHETIC_TOKENIZER_KEYS}
    overrides.update(fields)
    model = write_tiny_model(
        folder,
        hidden=32,
        heads=2,
        vocab=tokenizer.vocab_size,
        gguf_metadata=overrides,
        adjust_weights=steer,
        seed=seed,
    )
    return model.gguf_path
