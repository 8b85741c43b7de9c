"""The model registry: a family defined here, in tests/, runs through `Engine` without any file under
engine/ knowing it; an unknown architecture fails with a ModelLoadError naming the registered ones.

The toy family ("toyformer"): one layer, one attention head without RoPE, a SwiGLU MLP, tied
embeddings. Its GGUF uses its own tensor and metadata names, so the loader cannot be relying on
llama's.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest
from synthetic import BOS_ID, EOS_ID, tiny_vocabulary

from infer.engine.backends.attention import AttentionPlan
from infer.engine.backends.base import Backend, Weight
from infer.engine.backends.kv_cache import KVCache
from infer.engine.batch import ForwardBatch
from infer.engine.loader import ModelLoadError, load_checkpoint
from infer.engine.models import register, registered_architectures, unregister
from infer.engine.models.base import Checkpoint, ModelConfig, check_shapes
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

ARCH = "toyformer"
HIDDEN, HEAD_DIM, FFN = 32, 16, 48
EPS = 1e-5

# The toy's own GGUF tensor names -> its canonical names.
TENSOR_NAMES = {
    "toy.embedding": "embed",
    "toy.mix.norm": "attn_norm",
    "toy.mix.qkv": "qkv",
    "toy.mix.out": "out",
    "toy.ffn.norm": "ffn_norm",
    "toy.ffn.gate_up": "gate_up",
    "toy.ffn.down": "down",
    "toy.final_norm": "final_norm",
}


class ToyModel:
    """The toy forward, written only against the Backend protocol."""

    def __init__(self, checkpoint: Checkpoint, backend: Backend) -> None:
        self.config = checkpoint.config
        self.backend = backend
        w = checkpoint.weights
        qkv = w["qkv"].copy()
        qkv[:HEAD_DIM] *= np.float32(1.0 / np.sqrt(HEAD_DIM))  # the backend's attention does not scale
        self.weights: dict[str, Weight] = {name: backend.weight(w[name]) for name in w if name != "qkv"}
        self.weights["qkv"] = backend.weight(qkv)

    @property
    def vocab_size(self) -> int:
        return int(self.weights["embed"].shape[0])

    def make_cache(self, slots: int, capacity: int, dtype: str = "f32") -> KVCache:
        return KVCache.allocate(self.backend, 1, slots, 1, capacity, HEAD_DIM, dtype)

    def forward(self, batch: ForwardBatch, cache: KVCache) -> np.ndarray:
        b, w = self.backend, self.weights
        rows = batch.token_ids.shape[0]
        slots = np.asarray([s.slot for s in batch.segments], dtype=np.int64)
        starts = np.asarray([s.start for s in batch.segments], dtype=np.int64)
        lengths = np.asarray([s.length for s in batch.segments], dtype=np.int64)
        positions = np.concatenate([np.arange(s.start, s.start + s.length) for s in batch.segments])
        hidden = b.embed(w["embed"], batch.token_ids)
        qkv = b.linear(b.rms_norm(hidden, w["attn_norm"], EPS), w["qkv"])
        q = qkv[:, :HEAD_DIM].reshape(rows, 1, HEAD_DIM)
        k = qkv[:, HEAD_DIM : 2 * HEAD_DIM].reshape(rows, 1, HEAD_DIM)
        v = qkv[:, 2 * HEAD_DIM :].reshape(rows, 1, HEAD_DIM)
        b.write_kv(cache, 0, np.repeat(slots, lengths), positions, k, v)
        attn = b.attention(q, cache, 0, AttentionPlan.build(slots, starts, lengths))
        hidden += b.linear(attn.reshape(rows, HEAD_DIM), w["out"])
        gate_up = b.linear(b.rms_norm(hidden, w["ffn_norm"], EPS), w["gate_up"])
        hidden += b.linear(b.silu_mul(gate_up, FFN), w["down"])
        last = b.rms_norm(hidden[b.asarray(batch.logit_rows)], w["final_norm"], EPS)
        return b.to_host(b.logits(last, w["embed"]))


class ToyFamily:
    """The toy's declaration: config mapping, tensor names and shapes, model class."""

    architectures = (ARCH,)
    hf_architectures: Mapping[str, str] = {"ToyformerForCausalLM": ARCH}

    def gguf_tensor_name(self, name: str) -> str | None:
        return TENSOR_NAMES.get(name)

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        width = meta.get(f"{ARCH}.width")
        if width is None:
            raise ModelLoadError(f"{source}: missing metadata field {ARCH}.width")
        return ModelConfig(
            architecture=architecture,
            vocab_size=int(meta[f"{ARCH}.vocab"]),
            hidden_size=int(width),
            intermediate_size=FFN,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            head_dim=HEAD_DIM,
            rms_norm_eps=EPS,
            rope_theta=0.0,
            max_position_embeddings=int(meta[f"{ARCH}.context"]),
            tie_word_embeddings=True,
        )

    def config_from_hf(
        self, raw: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        raise ModelLoadError(f"{source}: the toy family has no Hugging Face layout")

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        h, v = config.hidden_size, config.vocab_size
        expected = {
            "embed": (v, h),
            "attn_norm": (h,),
            "qkv": (3 * HEAD_DIM, h),
            "out": (h, HEAD_DIM),
            "ffn_norm": (h,),
            "gate_up": (2 * FFN, h),
            "down": (h, FFN),
            "final_norm": (h,),
        }
        check_shapes(expected, weights, source)

    def build(self, checkpoint: Checkpoint, backend: Backend) -> ToyModel:
        return ToyModel(checkpoint, backend)


def toy_weights(vocab: int, seed: int = 5) -> dict[str, np.ndarray]:
    """Random float32 weights by canonical name. The attention and MLP outputs are scaled up so the
    tied embedding does not just predict the last token again: the greedy runs vary (seed 5 gives
    14 distinct tokens over the three prompts)."""
    rng = np.random.default_rng(seed)

    def matrix(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    return {
        "embed": (rng.standard_normal((vocab, HIDDEN)) * 0.5).astype(np.float32),
        "attn_norm": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "qkv": matrix(3 * HEAD_DIM, HIDDEN, 2.0),
        "out": matrix(HIDDEN, HEAD_DIM, 4.0),
        "ffn_norm": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
        "gate_up": matrix(2 * FFN, HIDDEN, 2.0),
        "down": matrix(HIDDEN, FFN, 4.0),
        "final_norm": (1 + 0.1 * rng.standard_normal(HIDDEN)).astype(np.float32),
    }


def write_toy_gguf(path: Path, weights: Mapping[str, np.ndarray], arch: str = ARCH) -> Path:
    """The toy as a GGUF with the synthetic byte-level BPE tokenizer."""
    tokens, token_types, merges = tiny_vocabulary()
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_uint32(f"{arch}.width", HIDDEN)
    writer.add_uint32(f"{arch}.vocab", len(tokens))
    writer.add_uint32(f"{arch}.context", 128)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-2")
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    by_canonical = {canonical: name for name, canonical in TENSOR_NAMES.items()}
    for canonical, array in weights.items():
        writer.add_tensor(by_canonical[canonical], array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def reference_logits(w: Mapping[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """The toy in float64 numpy over the whole sequence: logits of every position."""
    w64 = {name: array.astype(np.float64) for name, array in w.items()}

    def norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + EPS) * weight

    h = w64["embed"][ids]
    qkv = norm(h, w64["attn_norm"]) @ w64["qkv"].T
    q, k, v = qkv[:, :HEAD_DIM], qkv[:, HEAD_DIM : 2 * HEAD_DIM], qkv[:, 2 * HEAD_DIM :]
    scores = q @ k.T / np.sqrt(HEAD_DIM)
    scores[np.triu_indices(len(ids), 1)] = -np.inf
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    h = h + (probs @ v) @ w64["out"].T
    gate_up = norm(h, w64["ffn_norm"]) @ w64["gate_up"].T
    gate, up = gate_up[:, :FFN], gate_up[:, FFN:]
    h = h + (gate / (1 + np.exp(-gate)) * up) @ w64["down"].T
    return norm(h, w64["final_norm"]) @ w64["embed"].T


def reference_greedy(w: Mapping[str, np.ndarray], prompt: list[int], count: int) -> list[int]:
    """`count` greedy tokens of the float64 toy, recomputing the whole sequence each step."""
    ids = list(prompt)
    for _ in range(count):
        logits = reference_logits(w, ids)[-1]
        top2 = np.sort(logits)[-2:]
        assert top2[1] - top2[0] > 1e-3, "near tie: pick another seed for a meaningful comparison"
        ids.append(int(np.argmax(logits)))
    return ids[len(prompt) :]


@pytest.fixture
def toy_family() -> Iterator[ToyFamily]:
    """The toy family, registered for the test only."""
    family = ToyFamily()
    register(family)
    try:
        yield family
    finally:
        unregister(family)


def test_toy_family_runs_through_the_engine(toy_family: ToyFamily, tmp_path: Path) -> None:
    """Greedy tokens from the Engine equal the float64 numpy toy's, alone and batched."""
    vocab = len(tiny_vocabulary()[0])
    weights = toy_weights(vocab)
    path = write_toy_gguf(tmp_path / "toy.gguf", weights)
    engine = load_engine(path, EngineConfig(ctx_size=64, max_num_seqs=3, max_batched_tokens=64, batch_size=8))
    assert type(engine.model).__name__ == "ToyModel"
    prompts = [[5, 40, 77, 120, 9, 33, 250, 17, 61, 200, 3], [101, 7], [44, 45, 46, 47, 48]]
    count = 6
    expected = [reference_greedy(weights, p, count) for p in prompts]
    greedy = SamplingParams(temperature=0.0)
    alone = engine.generate(Request(tuple(prompts[0]), greedy, max_tokens=count, ignore_eos=True))
    assert list(alone.token_ids) == expected[0]
    # Together: ragged prefill chunks (batch_size 8 splits the first prompt) and batched decode rows.
    streams = [engine.submit(Request(tuple(p), greedy, max_tokens=count, ignore_eos=True)) for p in prompts]
    for stream, want in zip(streams, expected, strict=True):
        assert list(stream.result().token_ids) == want


def test_the_registry_lists_the_toy_only_while_registered(toy_family: ToyFamily) -> None:
    assert ARCH in registered_architectures() and "llama" in registered_architectures()
    unregister(toy_family)
    assert ARCH not in registered_architectures()


def test_unknown_architecture_names_the_registered_ones(toy_family: ToyFamily, tmp_path: Path) -> None:
    path = write_toy_gguf(tmp_path / "other.gguf", toy_weights(len(tiny_vocabulary()[0])), arch="mystery")
    with pytest.raises(ModelLoadError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and "'mystery'" in message and "general.architecture" in message
    for architecture in ("llama", "mistral", "qwen2", ARCH):
        assert architecture in message, message


def test_toy_shapes_are_checked_by_its_family(toy_family: ToyFamily, tmp_path: Path) -> None:
    weights = toy_weights(len(tiny_vocabulary()[0]))
    weights["out"] = weights["out"][:, :8]
    path = write_toy_gguf(tmp_path / "bad.gguf", weights)
    with pytest.raises(
        ModelLoadError, match=r"tensor out has shape \(32, 8\), the config implies \(32, 16\)"
    ):
        load_checkpoint(path)
