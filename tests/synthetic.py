"""Tiny random llama-family models, written both as GGUF and as a Hugging Face safetensors folder.

Fixtures (tests/conftest_synthetic.py) -- in a test module:

    pytest_plugins = ["conftest_synthetic"]  # tiny_model, tiny_gguf, tiny_hf_dir, tiny_model_factory
    pytestmark = pytest.mark.usefixtures("single_blas_thread")  # optional: 1 BLAS thread, much faster

    def test_something(tiny_gguf):          # Path of the default tiny F32 llama GGUF (read-only)
        ...

    def test_q4(tiny_model_factory):
        model = tiny_model_factory(quant="Q4_0", kv_heads=2)   # -> TinyModel(gguf_path, hf_dir)

Without fixtures: `from synthetic import write_tiny_model` (tests/ is on sys.path under pytest), then
`write_tiny_model(folder, quant=..., ...) -> TinyModel(gguf_path, hf_dir)`.

What is written (the way llama.cpp's converter and `transformers` would write it):

* GGUF: architecture `llama` (or `qwen2`) with `<arch>.*` hyper-parameters; a byte-level BPE `gpt2`
  tokenizer (`tokenizer.ggml.pre` "smollm" or "gpt-2"): ids 0..2 are the control tokens
  `<|endoftext|>`, `<|im_start|>` (BOS), `<|im_end|>` (EOS), then the 256 single-byte tokens, then the
  tokens of the merges; a ChatML `tokenizer.chat_template`. 2-D weights are stored as `quant`, 1-D
  ones (norms, biases, `rope_freqs.weight`) as F32. q/k rows are permuted into llama.cpp's interleaved
  RoPE layout for llama (not for qwen2, which keeps the half-split "neox" layout).
* Safetensors folder: `config.json`, `tokenizer.json` (built with `tokenizers`, same vocabulary),
  `tokenizer_config.json`, weights in Hugging Face layout in one file or `shards` files with
  `model.safetensors.index.json`, in float32 or bfloat16. Its weights are the GGUF's weights
  dequantized, so both files describe exactly the same float32 model and give the same logits.

Defaults are small (vocab 316, hidden 64, 4 heads, 2 layers; hidden 256 for k-quants, whose rows must
be multiples of 256 elements) so a model is written in ~10 ms and loads in ~20 ms (k-quants: ~0.1 s).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import gguf
import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize, quantize
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

__all__ = [
    "BOS_ID",
    "CHAT_TEMPLATE",
    "ENDOFTEXT_ID",
    "EOS_ID",
    "K_QUANTS",
    "QUANT_TYPES",
    "SPECIAL_TOKENS",
    "TinyModel",
    "bf16_round",
    "gguf_permute",
    "read_safetensors_folder",
    "tiny_vocabulary",
    "write_tiny_model",
]

QUANT_TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K", "Q5_K", "Q6_K")
"""Every GGUF weight type the synthetic models can be written in (and the CPU loader supports)."""
K_QUANTS = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
"""Types with 256-element blocks; `gguf.quants.quantize` cannot write them, so blocks are crafted."""

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
"""Control tokens (GGUF token type 3), ids 0, 1, 2."""
ENDOFTEXT_ID, BOS_ID, EOS_ID = 0, 1, 2
"""`<|endoftext|>`; BOS is `<|im_start|>` and EOS `<|im_end|>` (as in SmolLM2). BOS is not auto-added."""

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""ChatML, as SmolLM2 and Qwen2 use it."""

# Words whose byte-level spellings become tokens; each is built left to right, one merge per character.
_WORDS = (
    "Ġt", "Ġthe", "Ġa", "Ġand", "Ġof", "Ġto", "in", "ing", "is", "er", "on", "re", "Ġhello", "hello",
    "Ġworld", "Ġsea", "Ġhaiku", "ĠĠ", "ĊĊ", "Ġis", "Ġit", "user", "assistant", "system",
)  # fmt: skip

LLAMA3_ROPE_SCALING = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    # Small on purpose: with head_dim 16 and theta 1e4 this scales some frequencies, smooths some and
    # keeps the rest, so a loader that ignores the scaling gives visibly different logits.
    "original_max_position_embeddings": 64,
}


class TinyModel(NamedTuple):
    """Paths of one synthetic model written twice; unpacks as `gguf_path, hf_dir = model`."""

    gguf_path: Path
    """The GGUF file."""
    hf_dir: Path
    """The Hugging Face folder (config.json, tokenizer files, *.safetensors)."""

    def hf_config(self) -> dict[str, Any]:
        """The folder's parsed config.json."""
        return json.loads((self.hf_dir / "config.json").read_text())

    def hf_weights(self) -> dict[str, np.ndarray]:
        """The folder's weights (HF names and layout) as float32, read without `infer`'s loader."""
        return read_safetensors_folder(self.hf_dir)


# ---- vocabulary ----------------------------------------------------------------------------------


def _byte_to_unicode() -> list[str]:
    """GPT-2's byte -> printable character table, indexed by byte value."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), 256)]
    table: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


def tiny_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """(tokens, GGUF token types, merges "left right") of the synthetic byte-level BPE vocabulary."""
    tokens = [*SPECIAL_TOKENS, *_byte_to_unicode()]
    types = [3] * len(SPECIAL_TOKENS) + [1] * 256
    known = set(tokens)
    merges: list[str] = []
    for word in _WORDS:
        piece = word[0]
        for ch in word[1:]:
            merged = piece + ch
            if merged not in known:
                merges.append(f"{piece} {ch}")
                tokens.append(merged)
                types.append(1)
                known.add(merged)
            piece = merged
    return tokens, types, merges


def _hf_tokenizer_json(tokens: list[str], merges: list[str], pre: str) -> str:
    vocab = {t: i for i, t in enumerate(tokens)}
    hf = HFTokenizer(models.BPE(vocab, [tuple(m.split(" ", 1)) for m in merges]))
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre == "smollm":  # SmolLM2's own tokenizer.json: digits one by one, then GPT-2's regex
        hf.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Digits(individual_digits=True), byte_level]
        )
    elif pre == "gpt-2":
        hf.pre_tokenizer = byte_level
    else:
        raise ValueError(f"pre must be 'smollm' or 'gpt-2', not {pre!r}")
    hf.decoder = decoders.ByteLevel()
    hf.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return hf.to_str()


# ---- weights -------------------------------------------------------------------------------------


def gguf_permute(weight: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter permutation of q/k rows: HF half-split RoPE layout -> interleaved pairs."""
    head_dim = weight.shape[0] // heads
    rest = weight.shape[1:]
    return weight.reshape(heads, 2, head_dim // 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def _gguf_unpermute(weight: np.ndarray, heads: int) -> np.ndarray:
    head_dim = weight.shape[0] // heads
    rest = weight.shape[1:]
    return weight.reshape(heads, head_dim // 2, 2, *rest).swapaxes(1, 2).reshape(weight.shape)


def bf16_round(array: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16 (ties to even), still as float32."""
    bits = np.ascontiguousarray(array, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16 << 16
    return bits.astype(np.uint32).view(np.float32).reshape(array.shape)


# Byte offsets of the float16 super-block scales (d, dmin) inside one block of each k-quant.
_KQUANT_SCALES = {"Q2_K": (80, 82), "Q3_K": (108, None), "Q4_K": (0, 2), "Q5_K": (0, 2), "Q6_K": (208, None)}


def _craft_kquant(shape: tuple[int, int], qtype: str, std: float, rng: np.random.Generator) -> np.ndarray:
    """Random k-quant blocks whose dequantized values have mean ~0 and standard deviation ~`std`.

    Dequantized values are linear in the block's float16 scales (d, dmin), so the scales are solved
    for from two probe dequantizations of the same random quant bytes.
    """
    kind = GGMLQuantizationType[qtype]
    block, size = gguf.GGML_QUANT_SIZES[kind]
    if shape[1] % block:
        raise ValueError(f"{qtype} rows need a multiple of {block} elements, got shape {shape}")
    blocks = rng.integers(0, 256, size=(shape[0] * shape[1] // block, size), dtype=np.uint8)
    d_at, dmin_at = _KQUANT_SCALES[qtype]

    def with_scales(d: float, dmin: float) -> np.ndarray:
        out = blocks.copy()
        out[:, d_at : d_at + 2] = np.float16(d).reshape(1).view(np.uint8)
        if dmin_at is not None:
            out[:, dmin_at : dmin_at + 2] = np.float16(dmin).reshape(1).view(np.uint8)
        return out.reshape(shape[0], -1)

    a = dequantize(with_scales(1.0, 0.0), kind)
    b = dequantize(with_scales(0.0, 1.0), kind) if dmin_at is not None else np.zeros_like(a)
    ratio = -a.mean() / b.mean() if dmin_at is not None else 0.0
    d = std / float(np.std(a + ratio * b))
    return with_scales(d, d * ratio)


def _encode(array: np.ndarray, qtype: str, rng: np.random.Generator) -> tuple[np.ndarray, Any]:
    """(data, raw_dtype) for GGUFWriter.add_tensor, and check it round-trips through dequantize."""
    if qtype == "F32":
        return np.ascontiguousarray(array, dtype=np.float32), None
    if qtype == "F16":
        return array.astype(np.float16), None
    kind = GGMLQuantizationType[qtype]
    if qtype in K_QUANTS:
        return _craft_kquant(array.shape, qtype, float(np.std(array)), rng), kind
    block = gguf.GGML_QUANT_SIZES[kind][0]
    if array.shape[-1] % block:
        raise ValueError(f"{qtype} rows need a multiple of {block} elements, got shape {array.shape}")
    return quantize(np.ascontiguousarray(array, dtype=np.float32), kind), kind


def _decode(data: np.ndarray, raw_dtype: Any) -> np.ndarray:
    if raw_dtype is None:
        return data.astype(np.float32)
    return np.asarray(dequantize(data, raw_dtype), dtype=np.float32)


def _random_weights(
    rng: np.random.Generator,
    *,
    vocab: int,
    hidden: int,
    intermediate: int,
    layers: int,
    heads: int,
    kv_heads: int,
    head_dim: int,
    tied: bool,
    bias: bool,
) -> dict[str, np.ndarray]:
    """HF-named, HF-layout float32 weights, scaled so activations and logits stay O(1)."""

    def matrix(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm(width: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(width)).astype(np.float32)

    # Embedding rows of norm ~2, so logits (normed hidden . row) are O(1) at any width.
    w = {"model.embed_tokens.weight": (2.0 * matrix(vocab, hidden))}
    for i in range(layers):
        p = f"model.layers.{i}."
        w[p + "input_layernorm.weight"] = norm(hidden)
        w[p + "self_attn.q_proj.weight"] = 2.0 * matrix(heads * head_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = 2.0 * matrix(kv_heads * head_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = matrix(kv_heads * head_dim, hidden)
        if bias:
            w[p + "self_attn.q_proj.bias"] = (0.5 * rng.standard_normal(heads * head_dim)).astype(np.float32)
            w[p + "self_attn.k_proj.bias"] = (0.5 * rng.standard_normal(kv_heads * head_dim)).astype(
                np.float32
            )
            w[p + "self_attn.v_proj.bias"] = (0.1 * rng.standard_normal(kv_heads * head_dim)).astype(
                np.float32
            )
        w[p + "self_attn.o_proj.weight"] = matrix(hidden, heads * head_dim)
        w[p + "post_attention_layernorm.weight"] = norm(hidden)
        w[p + "mlp.gate_proj.weight"] = matrix(intermediate, hidden)
        w[p + "mlp.up_proj.weight"] = matrix(intermediate, hidden)
        w[p + "mlp.down_proj.weight"] = matrix(hidden, intermediate)
    w["model.norm.weight"] = norm(hidden)
    if not tied:
        w["lm_head.weight"] = 2.0 * matrix(vocab, hidden)
    return w


_GGUF_NAMES = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_GGUF_LAYER_NAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def _gguf_name(hf_name: str) -> str:
    if hf_name in _GGUF_NAMES:
        return _GGUF_NAMES[hf_name]
    _, _, layer, rest = hf_name.split(".", 3)
    return f"blk.{layer}.{_GGUF_LAYER_NAMES[rest]}"


def llama3_rope_factors(head_dim: int, theta: float, scaling: Mapping[str, float]) -> np.ndarray:
    """Per-frequency divisors as llama.cpp's converter writes them into `rope_freqs.weight`."""
    factor, low, high = scaling["factor"], scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_context = scaling["original_max_position_embeddings"]
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factors = []
    for freq in freqs:
        wavelen = 2 * np.pi / freq
        if wavelen < old_context / high:
            factors.append(1.0)
        elif wavelen > old_context / low:
            factors.append(factor)
        else:
            smooth = (old_context / wavelen - low) / (high - low)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return np.asarray(factors, dtype=np.float32)


# ---- safetensors ---------------------------------------------------------------------------------


def _write_safetensors(path: Path, weights: Mapping[str, np.ndarray], dtype: str) -> int:
    """Write one safetensors file in F32 or BF16 (header written here: numpy has no bfloat16).

    Returns the bytes of tensor data.
    """
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    chunks: list[bytes] = []
    offset = 0
    for name, array in weights.items():
        if dtype == "BF16":  # the values are already bf16-exact: keep the top 16 bits
            data = (np.ascontiguousarray(array, np.float32).view(np.uint32) >> 16).astype("<u2").tobytes()
        else:
            data = np.ascontiguousarray(array, "<f4").tobytes()
        header[name] = {
            "dtype": dtype,
            "shape": list(array.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + b"".join(chunks))
    return offset


def read_safetensors_folder(folder: Path | str) -> dict[str, np.ndarray]:
    """Every tensor of every *.safetensors file in `folder` as float32 (F32, F16 and BF16 handled)."""
    weights: dict[str, np.ndarray] = {}
    for path in sorted(Path(folder).glob("*.safetensors")):
        raw = path.read_bytes()
        (header_len,) = struct.unpack("<Q", raw[:8])
        header = json.loads(raw[8 : 8 + header_len])
        body = raw[8 + header_len :]
        for name, info in header.items():
            if name == "__metadata__":
                continue
            start, end = info["data_offsets"]
            chunk = body[start:end]
            if info["dtype"] == "BF16":
                array = (np.frombuffer(chunk, "<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                array = np.frombuffer(chunk, {"F32": "<f4", "F16": "<f2"}[info["dtype"]]).astype(np.float32)
            weights[name] = array.reshape(info["shape"])
    return weights


# ---- the writer ----------------------------------------------------------------------------------


def write_tiny_model(
    folder: Path | str,
    *,
    quant: str = "F32",
    arch: str = "llama",
    hidden: int | None = None,
    intermediate: int | None = None,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int | None = None,
    tied: bool = True,
    rope_scaling: str | None = None,
    pre: str = "smollm",
    hf_dtype: str = "F32",
    shards: int = 1,
    seed: int = 0,
    context_length: int = 512,
    tensor_quants: Mapping[str, str] | None = None,
    gguf_metadata: Mapping[str, Any] | None = None,
    vocab: int | None = None,
    adjust_weights: Callable[[dict[str, np.ndarray]], None] | None = None,
) -> TinyModel:
    """Write one random model as `folder/model.gguf` and the folder `folder/hf`; return both paths.

    quant: GGUF type of the 2-D weights (one of QUANT_TYPES; also "Q2_K"/"Q3_K", which the loader
        does not support). arch: "llama" (q/k rows permuted in the GGUF, LlamaForCausalLM) or "qwen2"
        (q/k/v bias, no permutation, Qwen2ForCausalLM). hidden/intermediate: default 64/128, or
        256/256 for k-quants. heads/kv_heads: kv_heads < heads gives grouped-query attention.
        tied: no separate lm_head / output.weight. rope_scaling: None or "llama3" (config.json
        `rope_scaling`; `rope_freqs.weight` in the GGUF). pre: tokenizer pre-tokenizer, "smollm" or
        "gpt-2". hf_dtype: "F32" or "BF16" safetensors (BF16 needs quant "F32" or "BF16"; the
        weights are then rounded to bfloat16 in both files). shards: number of safetensors files
        (more than one writes model.safetensors.index.json). seed: weights are a function of it.
        tensor_quants: per-GGUF-tensor type overrides, e.g. {"blk.0.ffn_down.weight": "Q2_K"}.
        gguf_metadata: GGUF key/value overrides written after the normal ones (a value of None drops
        the key), e.g. {"general.architecture": "gptneox"}; the folder is unaffected.
        vocab: pad the vocabulary with filler tokens `<|filler_N|>` (no merge makes them) up to this
        size, for a model of a real model's shapes (scripts/gpu_synthetic.py).
        adjust_weights: edits the random float32 weights (Hugging Face names) in place before both
        files are written, for a model steered to some behaviour (tests/synthetic_vocab.py).
    """
    if quant not in (*QUANT_TYPES, *K_QUANTS):
        raise ValueError(f"quant must be one of {QUANT_TYPES}, not {quant!r}")
    if arch not in ("llama", "qwen2"):
        raise ValueError(f"arch must be 'llama' or 'qwen2', not {arch!r}")
    if hf_dtype not in ("F32", "BF16") or (hf_dtype == "BF16" and quant not in ("F32", "BF16")):
        raise ValueError("hf_dtype must be F32, or BF16 with quant F32 or BF16")
    big = quant in K_QUANTS or any(q in K_QUANTS for q in (tensor_quants or {}).values())
    hidden = hidden or (256 if big else 64)
    intermediate = intermediate or (256 if big else 128)
    kv_heads = kv_heads or heads
    head_dim = hidden // heads
    theta, eps = 10000.0, 1e-5
    folder = Path(folder)
    hf_dir = folder / "hf"
    hf_dir.mkdir(parents=True, exist_ok=True)
    gguf_path = folder / "model.gguf"

    tokens, token_types, merges = tiny_vocabulary()
    if vocab is not None and vocab > len(tokens):
        fillers = vocab - len(tokens)
        tokens = [*tokens, *(f"<|filler_{i}|>" for i in range(fillers))]
        token_types = [*token_types, *([token_types[-1]] * fillers)]
    rng = np.random.default_rng(seed)
    hf = _random_weights(
        rng,
        vocab=len(tokens),
        hidden=hidden,
        intermediate=intermediate,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        tied=tied,
        bias=arch == "qwen2",
    )
    if adjust_weights is not None:
        adjust_weights(hf)
    if hf_dtype == "BF16" or quant == "BF16":
        hf = {name: bf16_round(w) for name, w in hf.items()}
    scaling = dict(LLAMA3_ROPE_SCALING) if rope_scaling == "llama3" else None
    if rope_scaling not in (None, "llama3"):
        raise ValueError(f"rope_scaling must be None or 'llama3', not {rope_scaling!r}")

    # ---- GGUF: permute, quantize; the folder gets the dequantized values back in HF layout.
    writer = gguf.GGUFWriter(str(gguf_path), arch)
    writer.add_name(f"tiny-{arch}-{quant}")
    writer.add_context_length(context_length)
    writer.add_embedding_length(hidden)
    writer.add_block_count(layers)
    writer.add_feed_forward_length(intermediate)
    writer.add_head_count(heads)
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base(theta)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(head_dim)
    writer.add_vocab_size(len(tokens))
    file_type = {"F32": "ALL_F32", "Q4_K": "MOSTLY_Q4_K_M", "Q5_K": "MOSTLY_Q5_K_M", "Q3_K": "MOSTLY_Q3_K_M"}
    writer.add_file_type(gguf.LlamaFileType[file_type.get(quant, f"MOSTLY_{quant}")])
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_bos_token_id(BOS_ID)
    writer.add_eos_token_id(EOS_ID)
    writer.add_unk_token_id(ENDOFTEXT_ID)
    writer.add_pad_token_id(EOS_ID)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHAT_TEMPLATE)
    for key, value in (gguf_metadata or {}).items():
        if key in writer.kv_data[0]:
            del writer.kv_data[0][key]
        if value is not None:
            vtype = gguf.GGUFValueType.get_type(value)
            sub = gguf.GGUFValueType.get_type(value[0]) if isinstance(value, list) and value else None
            writer.add_key_value(key, value, vtype, sub_type=sub)

    if scaling is not None:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(head_dim, theta, scaling))
    final: dict[str, np.ndarray] = {}
    for name, weight in hf.items():
        gname = _gguf_name(name)
        permute_heads = None
        if arch == "llama" and ".q_proj." in name:
            permute_heads = heads
        elif arch == "llama" and ".k_proj." in name:
            permute_heads = kv_heads
        stored = gguf_permute(weight, permute_heads) if permute_heads else weight
        qtype = (tensor_quants or {}).get(gname, quant if weight.ndim == 2 else "F32")
        data, raw_dtype = _encode(stored, qtype, rng)
        writer.add_tensor(gname, data, raw_dtype=raw_dtype)
        back = _decode(data, raw_dtype).reshape(weight.shape)
        final[name] = _gguf_unpermute(back, permute_heads) if permute_heads else back
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()

    # ---- Hugging Face folder.
    config: dict[str, Any] = {
        "architectures": ["Qwen2ForCausalLM" if arch == "qwen2" else "LlamaForCausalLM"],
        "model_type": arch,
        "vocab_size": len(tokens),
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": eps,
        "rope_theta": theta,
        "rope_scaling": scaling,
        "max_position_embeddings": context_length,
        "tie_word_embeddings": tied,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "torch_dtype": "bfloat16" if hf_dtype == "BF16" else "float32",
    }
    if arch == "llama":  # Qwen2's config has no such field: its bias is implied by the architecture
        config["attention_bias"] = False
    (hf_dir / "config.json").write_text(json.dumps(config, indent=2))
    (hf_dir / "tokenizer.json").write_text(_hf_tokenizer_json(tokens, merges, pre))
    tokenizer_config = {
        "add_bos_token": False,
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "pad_token": SPECIAL_TOKENS[EOS_ID],
        "unk_token": SPECIAL_TOKENS[ENDOFTEXT_ID],
        "chat_template": CHAT_TEMPLATE,
        "model_max_length": context_length,
        "tokenizer_class": "GPT2Tokenizer",
        "added_tokens_decoder": {
            str(i): {"content": t, "special": True, "normalized": False, "lstrip": False, "rstrip": False}
            for i, t in enumerate(SPECIAL_TOKENS)
        },
    }
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(tokenizer_config, indent=2))
    for stale in (*hf_dir.glob("*.safetensors"), hf_dir / "model.safetensors.index.json"):
        stale.unlink(missing_ok=True)
    if shards <= 1:
        _write_safetensors(hf_dir / "model.safetensors", final, hf_dtype)
    else:
        names = list(final)
        weight_map: dict[str, str] = {}
        total = 0
        for k in range(shards):
            part = names[k * len(names) // shards : (k + 1) * len(names) // shards]
            file = f"model-{k + 1:05d}-of-{shards:05d}.safetensors"
            total += _write_safetensors(hf_dir / file, {n: final[n] for n in part}, hf_dtype)
            weight_map |= dict.fromkeys(part, file)
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (hf_dir / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return TinyModel(gguf_path, hf_dir)
