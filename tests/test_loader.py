"""Loaders: GGUF and safetensors give the same model (and match a float64 reference); bad input fails cleanly.

The models come from tests/synthetic.py: the same random weights written as a GGUF (quantized,
llama.cpp's q/k permutation) and as a Hugging Face folder holding the dequantized weights.
"""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cli_process import infer_cli
from gguf import GGUFReader
from synthetic import (
    BOS_ID,
    CHAT_TEMPLATE,
    EOS_ID,
    QUANT_TYPES,
    TinyModel,
    gguf_permute,
    read_safetensors_folder,
    write_tiny_model,
)

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import Checkpoint, ModelLoadError, load_checkpoint
from infer.engine.models import build_model

pytest_plugins = ["conftest_synthetic"]  # the tiny-model fixtures
pytestmark = pytest.mark.usefixtures("single_blas_thread")

PROMPT = "<|im_start|>user\nhello the sea, 12345 é€ is it?<|im_end|>\n<|im_start|>assistant\n"

# ---- helpers -------------------------------------------------------------------------------------


def model_logits(checkpoint: Checkpoint, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), vocab]: a prefill of all but the last token, then one decode step."""
    model = build_model(checkpoint, CpuBackend())
    cache = model.make_cache(2, 64)
    slot = 1  # not slot 0, so a slot mix-up shows
    head = np.asarray(ids[:-1], dtype=np.int64)
    prefill = ForwardBatch(head, (Segment(slot, 0, len(head)),), np.arange(len(head), dtype=np.int64))
    first = model.forward(prefill, cache)
    step = ForwardBatch(
        np.asarray(ids[-1:], dtype=np.int64), (Segment(slot, len(head), 1),), np.zeros(1, np.int64)
    )
    last = model.forward(step, cache)
    return np.concatenate([first, last]).astype(np.float64)


def _rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * weight


def _inverse_frequencies(config: dict[str, Any], head_dim: int) -> np.ndarray:
    inv = 1.0 / config["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":  # transformers' _compute_llama3_parameters
        factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
        old = scaling["original_max_position_embeddings"]
        wavelen = 2 * np.pi / inv
        scaled = np.where(wavelen > old / low, inv / factor, inv)
        smooth = (old / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = (wavelen >= old / high) & (wavelen <= old / low)
        inv = np.where(medium, smoothed, scaled)
    return inv


def reference_logits(weights: dict[str, np.ndarray], config: dict[str, Any], ids: list[int]) -> np.ndarray:
    """An independent float64 forward pass from HF-layout weights (half-split RoPE, GQA, SwiGLU, RMSNorm)."""
    w = {name: array.astype(np.float64) for name, array in weights.items()}
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    eps = config["rms_norm_eps"]
    n = len(ids)
    angles = np.outer(np.arange(n), _inverse_frequencies(config, head_dim))
    cos, sin = np.cos(angles)[:, None, :], np.sin(angles)[:, None, :]

    def rope(x: np.ndarray) -> np.ndarray:  # x [n, heads, head_dim]
        x1, x2 = x[..., : head_dim // 2], x[..., head_dim // 2 :]
        return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)

    causal = np.triu(np.full((n, n), -np.inf), k=1)
    x = w["model.embed_tokens.weight"][ids]
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = _rms_norm(x, w[p + "input_layernorm.weight"], eps)
        proj = {}
        for name in ("q", "k", "v"):
            proj[name] = h @ w[p + f"self_attn.{name}_proj.weight"].T
            if p + f"self_attn.{name}_proj.bias" in w:
                proj[name] = proj[name] + w[p + f"self_attn.{name}_proj.bias"]
        q = rope(proj["q"].reshape(n, heads, head_dim))
        k = rope(proj["k"].reshape(n, kv_heads, head_dim))
        v = proj["v"].reshape(n, kv_heads, head_dim)
        group = heads // kv_heads
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)  # head j uses kv head j // group
        scores = np.einsum("qhd,khd->hqk", q, k) / np.sqrt(head_dim) + causal
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        attn = np.einsum("hqk,khd->qhd", probs, v).reshape(n, heads * head_dim)
        x = x + attn @ w[p + "self_attn.o_proj.weight"].T
        h = _rms_norm(x, w[p + "post_attention_layernorm.weight"], eps)
        gate, up = h @ w[p + "mlp.gate_proj.weight"].T, h @ w[p + "mlp.up_proj.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ w[p + "mlp.down_proj.weight"].T
    out = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return _rms_norm(x, w["model.norm.weight"], eps) @ out.T


def assert_close(actual: np.ndarray, expected: np.ndarray, atol: float, what: str) -> None:
    """Absolute comparison with the worst difference in the message."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    worst = float(np.max(np.abs(actual - expected)))
    assert worst <= atol, f"{what}: max |diff| {worst:.3g} > {atol:g}"


# ---- (a) both loaders, one model -----------------------------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    **{f"quant-{q}": {"quant": q} for q in QUANT_TYPES},
    "untied": {"tied": False},
    "gqa": {"kv_heads": 2},
    "gqa-untied-q4_k": {"quant": "Q4_K", "kv_heads": 2, "tied": False},
    "qwen2-bias": {"arch": "qwen2", "kv_heads": 2},
    "qwen2-q8_0": {"arch": "qwen2", "quant": "Q8_0", "tied": False},
    "llama3-rope": {"rope_scaling": "llama3", "kv_heads": 2},
    "llama3-rope-q5_k": {"rope_scaling": "llama3", "quant": "Q5_K"},
    "sharded": {"shards": 2, "tied": False},
    "bf16": {"hf_dtype": "BF16"},
    "bf16-sharded-gguf-bf16": {"hf_dtype": "BF16", "quant": "BF16", "shards": 3, "tied": False},
    "gpt2-pre": {"pre": "gpt-2"},
}


@pytest.fixture(scope="module")
def prompt_ids(tiny_model: TinyModel) -> list[int]:
    """The test prompt's ids (special tokens parsed), from the GGUF tokenizer."""
    ids = load_checkpoint(tiny_model.gguf_path).tokenizer.encode(PROMPT)
    assert 20 < len(ids) < 64
    return ids


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_gguf_and_safetensors_give_the_same_logits(
    variant: str, tiny_model_factory: Callable[..., TinyModel], prompt_ids: list[int]
) -> None:
    """Both files of one model give the same logits, and those match an independent float64 forward."""
    model = tiny_model_factory(**VARIANTS[variant])
    from_gguf = load_checkpoint(model.gguf_path)
    from_hf = load_checkpoint(model.hf_dir)
    gguf_logits = model_logits(from_gguf, prompt_ids)
    hf_logits = model_logits(from_hf, prompt_ids)
    assert np.abs(gguf_logits).max() > 0.5, "degenerate model: logits are all about zero"
    # Same float32 weights on both sides, so the logits agree to float32 rounding -- except that llama3
    # scaling reaches the GGUF as float32 rope factors while config.json's is computed in float64.
    tolerance = 3e-5 if "rope_scaling" in VARIANTS[variant] else 1e-5
    assert_close(gguf_logits, hf_logits, tolerance, f"{variant}: GGUF vs safetensors")
    reference = reference_logits(model.hf_weights(), model.hf_config(), prompt_ids)
    assert_close(hf_logits, reference, 1e-4, f"{variant}: safetensors vs float64 reference")
    assert_close(gguf_logits, reference, 1e-4, f"{variant}: GGUF vs float64 reference")


@pytest.mark.parametrize("variant", ["quant-F32", "gqa", "qwen2-bias", "llama3-rope", "bf16"])
def test_both_loaders_read_the_same_config_and_tokenizer(
    variant: str, tiny_model_factory: Callable[..., TinyModel]
) -> None:
    """Hyper-parameters and tokenizer agree; only the stored RoPE layout differs (llama GGUFs: permuted)."""
    kwargs = VARIANTS[variant]
    model = tiny_model_factory(**kwargs)
    a, b = load_checkpoint(model.gguf_path), load_checkpoint(model.hf_dir)
    fields = [f for f in a.config.__dataclass_fields__ if f not in ("rope_layout", "rope_scaling")]
    same = {f: getattr(b.config, f) for f in fields}
    # GGUF stores the epsilon as float32 (so does llama.cpp read it).
    same["rms_norm_eps"] = float(np.float32(b.config.rms_norm_eps))
    assert {f: getattr(a.config, f) for f in fields} == same
    expected_arch = kwargs.get("arch", "llama")
    assert a.config.architecture == expected_arch
    assert a.config.attention_bias == b.config.attention_bias == (expected_arch == "qwen2")
    assert a.config.rope_layout == ("half" if expected_arch == "qwen2" else "interleaved")
    assert b.config.rope_layout == "half"
    if kwargs.get("rope_scaling") == "llama3":
        assert b.config.rope_scaling["rope_type"] == "llama3"
        factors = a.weights.get("rope_freqs.weight")
        assert factors is not None and factors.shape == (a.config.head_dim // 2,)
    else:
        assert "rope_freqs.weight" not in a.weights
    ta, tb = a.tokenizer, b.tokenizer
    assert (ta.vocab_size, ta.bos_id, ta.eos_id) == (tb.vocab_size, BOS_ID, EOS_ID)
    assert tb.bos_id == BOS_ID and tb.eos_id == EOS_ID
    assert ta.chat_template == tb.chat_template == CHAT_TEMPLATE
    assert not ta.add_bos and not tb.add_bos
    for text in (PROMPT, "hello world  and 2024 digits", " the\n\nsea\t<|endoftext|>", "ünïcödé 🙂"):
        ids = ta.encode(text)
        assert ids == tb.encode(text), text
        assert ta.encode(text, parse_special=False) == tb.encode(text, parse_special=False), text
        assert ta.decode(ids) == tb.decode(ids) == text
    assert ta.encode("<|im_start|>")[0] == BOS_ID
    assert len(ta.encode("<|im_start|>", parse_special=False)) > 1


def test_gguf_holds_permuted_qk_and_safetensors_the_hf_layout(
    tiny_model_factory: Callable[..., TinyModel],
) -> None:
    """The synthetic GGUF stores q/k as llama.cpp's converter does; qwen2 keeps the HF layout."""
    for arch, kv_heads in (("llama", 2), ("qwen2", 2)):
        model = tiny_model_factory(arch=arch, kv_heads=kv_heads)
        hf = model.hf_weights()
        config = model.hf_config()
        tensors = {t.name: np.asarray(t.data) for t in GGUFReader(model.gguf_path).tensors}
        for gguf_name, hf_name, heads in (
            ("blk.1.attn_q.weight", "model.layers.1.self_attn.q_proj.weight", config["num_attention_heads"]),
            ("blk.1.attn_k.weight", "model.layers.1.self_attn.k_proj.weight", config["num_key_value_heads"]),
        ):
            stored, original = tensors[gguf_name], hf[hf_name]
            expected = gguf_permute(original, heads) if arch == "llama" else original
            np.testing.assert_array_equal(stored, expected)
            assert not np.array_equal(gguf_permute(original, heads), original)


def test_the_comparison_notices_a_wrong_rope_layout_or_missing_rope_factors(
    tiny_model_factory: Callable[..., TinyModel], prompt_ids: list[int]
) -> None:
    """Sanity check of the test itself: a GGUF read without un-permuting, or without its llama3 rope
    factors, gives clearly different logits, so the comparisons above can fail."""
    model = tiny_model_factory(rope_scaling="llama3", kv_heads=2)
    reference = model_logits(load_checkpoint(model.hf_dir), prompt_ids)
    wrong_layout = load_checkpoint(model.gguf_path)
    object.__setattr__(wrong_layout.config, "rope_layout", "half")
    assert np.abs(model_logits(wrong_layout, prompt_ids) - reference).max() > 1e-2
    no_factors = load_checkpoint(model.gguf_path)
    del no_factors.weights["rope_freqs.weight"]
    assert np.abs(model_logits(no_factors, prompt_ids) - reference).max() > 1e-2


def test_quantized_weights_are_really_quantized(tiny_model_factory: Callable[..., TinyModel]) -> None:
    """Each GGUF holds its 2-D weights in the requested type and norms in F32."""
    for quant in QUANT_TYPES:
        model = tiny_model_factory(quant=quant)
        types = {t.name: t.tensor_type.name for t in GGUFReader(model.gguf_path).tensors}
        assert types["token_embd.weight"] == quant
        assert types["blk.0.ffn_down.weight"] == quant
        assert types["blk.0.attn_norm.weight"] == "F32"


def _safetensors_dtypes(hf_dir: Path) -> dict[str, set[str]]:
    """{file name: the dtypes in its header}."""
    out = {}
    for path in sorted(hf_dir.glob("*.safetensors")):
        with path.open("rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            header = json.loads(handle.read(size))
        out[path.name] = {v["dtype"] for k, v in header.items() if k != "__metadata__"}
    return out


def test_safetensors_folders_are_written_as_asked(tiny_model_factory: Callable[..., TinyModel]) -> None:
    """bf16 really is BF16 on disk, shards are separate files with an index covering every tensor."""
    plain = tiny_model_factory(**VARIANTS["bf16"]).hf_dir
    assert _safetensors_dtypes(plain) == {"model.safetensors": {"BF16"}}
    assert not (plain / "model.safetensors.index.json").exists()
    sharded = tiny_model_factory(**VARIANTS["bf16-sharded-gguf-bf16"]).hf_dir
    dtypes = _safetensors_dtypes(sharded)
    assert sorted(dtypes) == [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]
    assert all(d == {"BF16"} for d in dtypes.values())
    index = json.loads((sharded / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == set(dtypes)
    assert set(index["weight_map"]) == set(read_safetensors_folder(sharded))
    assert "lm_head.weight" in index["weight_map"]


def test_tiny_models_load_fast(tiny_model_factory: Callable[..., TinyModel]) -> None:
    """The fixtures are meant for fast engine tests: a tiny model loads in well under a second."""
    for kwargs in ({}, {"quant": "Q4_K"}):
        model = tiny_model_factory(**kwargs)
        for path in model:
            load_checkpoint(path)  # warm imports and caches
            start = time.perf_counter()
            load_checkpoint(path)
            assert time.perf_counter() - start < 0.5, path


# ---- (b) bad input -------------------------------------------------------------------------------


def _copy(model: TinyModel, tmp_path: Path) -> TinyModel:
    gguf_path = tmp_path / "model.gguf"
    shutil.copy(model.gguf_path, gguf_path)
    hf_dir = tmp_path / "hf"
    shutil.copytree(model.hf_dir, hf_dir)
    return TinyModel(gguf_path, hf_dir)


def _bad_missing(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    return tmp / "nothing-here.gguf", ("no such file",)


def _bad_magic(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = tmp / "notes.gguf"
    path.write_bytes(b"GGML" + m.gguf_path.read_bytes()[4:])
    return path, ("magic",)


def _bad_text_file(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = tmp / "model.txt"
    path.write_text("hi\n")
    return path, ("not a GGUF",)


def _truncated(fraction: float) -> Callable[[Path, TinyModel], tuple[Path, tuple[str, ...]]]:
    def make(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
        data = m.gguf_path.read_bytes()
        path = tmp / "cut.gguf"
        path.write_bytes(data[: max(5, int(len(data) * fraction))])
        return path, ("truncated",)

    return make


def _gguf_variant(
    expect: tuple[str, ...], **kwargs: Any
) -> Callable[[Path, TinyModel], tuple[Path, tuple[str, ...]]]:
    def make(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
        return write_tiny_model(tmp / "variant", **kwargs).gguf_path, expect

    return make


def _hf_missing_config(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    (m.hf_dir / "config.json").unlink()
    return m.hf_dir, ("config.json", "no such file")


def _hf_missing_tokenizer(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    (m.hf_dir / "tokenizer.json").unlink()
    return m.hf_dir, ("tokenizer.json",)


def _hf_missing_shard(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    hf_dir = write_tiny_model(tmp / "sharded", shards=2).hf_dir
    (hf_dir / "model-00002-of-00002.safetensors").unlink()
    return hf_dir, ("model-00002-of-00002.safetensors", "missing")


def _hf_truncated_shard(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    shard = m.hf_dir / "model.safetensors"
    shard.write_bytes(shard.read_bytes()[:1000])
    return m.hf_dir, ("model.safetensors",)


def _hf_shape_mismatch(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = m.hf_dir / "config.json"
    path.write_text(path.read_text().replace('"intermediate_size": 128', '"intermediate_size": 96'))
    return m.hf_dir, ("mlp.gate_proj.weight", "shape")


def _hf_unsupported_arch(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = m.hf_dir / "config.json"
    path.write_text(path.read_text().replace("LlamaForCausalLM", "GPTNeoXForCausalLM"))
    return m.hf_dir, ("config.json", "GPTNeoXForCausalLM")


def _hf_missing_field(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = m.hf_dir / "config.json"
    path.write_text(path.read_text().replace('"num_hidden_layers"', '"n_layers"'))
    return m.hf_dir, ("config.json", "num_hidden_layers")


BAD_INPUTS: dict[str, Callable[[Path, TinyModel], tuple[Path, tuple[str, ...]]]] = {
    "missing-file": _bad_missing,
    "wrong-magic": _bad_magic,
    "text-file": _bad_text_file,
    "truncated-in-header": _truncated(0.001),
    "truncated-in-metadata": _truncated(0.01),
    "truncated-half": _truncated(0.5),
    "truncated-last-byte": _truncated(0.99999),
    "shape-vs-config": _gguf_variant(
        ("ffn_gate|gate_proj", "shape"), gguf_metadata={"llama.feed_forward_length": 96}
    ),
    "head-count-vs-shapes": _gguf_variant(("shape",), gguf_metadata={"llama.attention.head_count_kv": 1}),
    "unsupported-arch": _gguf_variant(
        ("general.architecture", "gptneox"), gguf_metadata={"general.architecture": "gptneox"}
    ),
    "missing-metadata": _gguf_variant(("llama.block_count",), gguf_metadata={"llama.block_count": None}),
    "unsupported-quant-q2_k": _gguf_variant(
        ("blk.0.ffn_down.weight", "Q2_K"), tensor_quants={"blk.0.ffn_down.weight": "Q2_K"}
    ),
    "unsupported-quant-q3_k": _gguf_variant(("token_embd.weight", "Q3_K"), quant="Q3_K"),
    "hf-missing-config": _hf_missing_config,
    "hf-missing-tokenizer": _hf_missing_tokenizer,
    "hf-missing-shard": _hf_missing_shard,
    "hf-truncated-shard": _hf_truncated_shard,
    "hf-shape-vs-config": _hf_shape_mismatch,
    "hf-unsupported-arch": _hf_unsupported_arch,
    "hf-missing-field": _hf_missing_field,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_raises_one_line_model_load_error(case: str, tiny_model: TinyModel, tmp_path: Path) -> None:
    """Each broken file or folder raises ModelLoadError with one line naming the file and the problem."""
    path, expect = BAD_INPUTS[case](tmp_path, _copy(tiny_model, tmp_path))
    with pytest.raises(ModelLoadError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert "\n" not in message.strip(), message
    assert str(path) in message, f"the message does not name {path}: {message}"
    for word in expect:  # "a|b": either spelling
        assert any(w in message for w in word.split("|")), f"{word!r} not in {message!r}"


def _gguf_rope_factors_of_wrong_length(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    import synthetic

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(synthetic, "llama3_rope_factors", lambda *args: np.ones(5, np.float32))
        path = write_tiny_model(tmp / "variant", rope_scaling="llama3").gguf_path
    return path, ("rope_freqs.weight",)


def _hf_config_not_an_object(tmp: Path, m: TinyModel) -> tuple[Path, tuple[str, ...]]:
    path = m.hf_dir / "config.json"
    path.write_text(f"[{path.read_text()}]")
    return m.hf_dir, ("config.json",)


# Malformed values that once raised bare exceptions (a traceback in the CLI).
MALFORMED_VALUES: dict[str, Callable[[Path, TinyModel], tuple[Path, tuple[str, ...]]]] = {
    "gguf-zero-heads": _gguf_variant(("head_count",), gguf_metadata={"llama.attention.head_count": 0}),
    "gguf-non-numeric-field": _gguf_variant(
        ("llama.block_count",), gguf_metadata={"llama.block_count": "two"}
    ),
    "gguf-rope-factors-of-wrong-length": _gguf_rope_factors_of_wrong_length,
    "hf-config-not-an-object": _hf_config_not_an_object,
}


@pytest.mark.parametrize("case", list(MALFORMED_VALUES))
def test_malformed_values(case: str, tiny_model: TinyModel, tmp_path: Path) -> None:
    """Malformed values raise a one-line ModelLoadError naming the file and the field."""
    path, expect = MALFORMED_VALUES[case](tmp_path, _copy(tiny_model, tmp_path))
    try:
        checkpoint = load_checkpoint(path)
        build_model(checkpoint, CpuBackend())
    except ModelLoadError as exc:
        message = str(exc)
        assert "\n" not in message.strip() and str(path) in message, message
        assert all(word in message for word in expect), message
    else:
        pytest.fail(f"{path} loaded without an error")


def _run_cli(model: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return infer_cli(
        "generate", "--model", str(model), "-n", "2", "--ignore-eos", "--json", "hi",
        timeout=120,
        env={"INFER_HOME": str(home), "NO_COLOR": "1"},
    )  # fmt: skip


@pytest.mark.parametrize("case", ["missing-file", "wrong-magic", "truncated-half", "unsupported-quant-q2_k"])
def test_cli_reports_bad_model_in_one_line(case: str, tiny_model: TinyModel, tmp_path: Path) -> None:
    """`infer generate --model BAD hi`: exit code 2, exactly one line on stderr, no traceback."""
    path, expect = BAD_INPUTS[case](tmp_path, _copy(tiny_model, tmp_path))
    result = _run_cli(path, tmp_path / "home")
    assert result.returncode == 2, (result.returncode, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert str(path) in lines[0], lines[0]
    for word in expect:
        assert any(w in lines[0] for w in word.split("|")), lines[0]
    assert result.stdout == ""


def test_cli_runs_the_good_tiny_model(tiny_model: TinyModel, tmp_path: Path) -> None:
    """Control for the test above: the same command on the intact model exits 0 and prints text."""
    result = _run_cli(tiny_model.gguf_path, tmp_path / "home")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    output = json.loads(result.stdout)
    assert output["completion_tokens"] == 2 and output["finish_reason"] == "length", output


def test_fast_metadata_reader_equals_the_gguf_package(tmp_path: Path) -> None:
    """The loader's one-pass array parsing gives exactly the `gguf` package's metadata: strings
    (empty, multi-byte), every scalar array type, a nested array, and the tensor table after them."""
    import gguf

    from infer.engine.loader.gguf import _PlainArrayReader, read_metadata

    path = tmp_path / "arrays.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("t.strings", ["", "a", "héllo ▁wörld", "x" * 300])
    writer.add_array("t.ints", [1, -2, 3])
    writer.add_array("t.floats", [0.5, -1.25])
    writer.add_array("t.bools", [True, False, True])
    writer.add_array("t.nested", [[1, 2], [3]])
    writer.add_array("t.empty", [])
    writer.add_string("t.after", "still aligned")
    writer.add_tensor("w", np.arange(6, dtype=np.float32).reshape(2, 3))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    fast, package = _PlainArrayReader(path), GGUFReader(path)
    assert read_metadata(fast) == read_metadata(package)
    assert read_metadata(fast)["t.strings"] == ["", "a", "héllo ▁wörld", "x" * 300]
    assert [(t.name, t.data_offset, t.data.tolist()) for t in fast.tensors] == [
        (t.name, t.data_offset, t.data.tolist()) for t in package.tensors
    ]
