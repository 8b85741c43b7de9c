"""Make exactness oracles for model families the engine does not load yet, from tiny random HF models.

For each family (qwen3, qwen3moe, phi3, phi4mini, gemma2, olmo2, granite, smollm3, mistral_sliding) it
builds a tiny seeded float32 Hugging Face model with a tiny trained tokenizer, saves it as a safetensors
folder (`hf/`), converts that folder with llama.cpp's own `convert_hf_to_gguf.py` (`f32.gguf`,
`q8_0.gguf`), and writes transformers' float32 greedy ids and top-5 logits (`oracle.json`), also
of the weights the Q8_0 file holds (`q8_0_reading`; `--q8-only` rewrites just that). It also
writes `README.md` next to the family folders: the GGUF metadata under `<arch>.` and the tensors of
layer 0 plus the global ones, read back from each `f32.gguf`.

transformers, torch, sentencepiece and protobuf are NEVER project dependencies: run this once, in a
throwaway virtual environment, and commit only its outputs (tests/reference/families/):

    python3 -m venv /tmp/oracle-venv
    /tmp/oracle-venv/bin/pip install torch==2.14.1 transformers==5.24.0 \\
        sentencepiece safetensors gguf protobuf
    /tmp/oracle-venv/bin/python scripts/family_oracles.py --out tests/reference/families

The converter is the one vendored by the llama-cpp-python sdist that scripts/llamacpp_build.py unpacks
(`--llamacpp` to point elsewhere); its own `gguf-py/` goes first on the path, so the metadata is exactly
what that llama.cpp version writes. The converter runs as a subprocess through this same file
(`--run-converter`), which patches one thing: the byte-level BPE pre-tokenizer lookup
(`TextModel.get_vocab_base_pre`, a table of hashes of known tokenizers, on which a tiny trained
tokenizer cannot be) returns "gpt-2", the pre-tokenizer these tokenizers really use.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import runpy
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STEPS = 32
TOP = 5
MIN_GAP = 1e-2
PROMPT_TARGETS = (4, 10, 20)
BPE_PRE_TOKENIZER = "gpt-2"
DEFAULT_LLAMACPP = Path("/root/.cache/infer/llamacpp-build/src/llama_cpp_python-0.3.36/vendor/llama.cpp")
# Files save_pretrained may write that loading does not need.
KEEP_HF_FILES = {
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "tokenizer.model",
    "generation_config.json",
}

# The text the tiny tokenizers are trained on: English prose, numbers, punctuation and a little code,
# so the merges are ordinary ones and the prompts below tokenize into a few tokens a word.
CORPUS = """\
Once upon a time, a small robot learned to count the stars above the quiet town.
The quick brown fox jumps over the lazy dog, and the dog does not mind at all.
In the morning the market opens early; farmers bring apples, bread, cheese and fresh milk.
Children run between the stalls laughing loudly while their parents talk about the weather.
Hello there, friend! How are you today? I am fine, thank you, and you?
Paris is the capital of France, Berlin is the capital of Germany, and Rome is the capital of Italy.
The river flows from the mountains to the sea, past forests, fields and old stone bridges.
She wrote a letter to her brother, who lived far away in a city by the ocean.
Numbers: 1, 2, 3, 10, 42, 100, 2024, 3.14 and 1000000 are all written here.
def add(a, b):
    return a + b
for i in range(10):
    print(i * i)
The teacher asked the students to read the first chapter of the book before the next lesson.
A cold wind blew across the hills, and the shepherd gathered his sheep into the barn.
Time flies like an arrow; fruit flies like a banana.
We walked along the beach at sunset and watched the waves roll over the sand.
The library was quiet except for the soft sound of pages turning and pencils writing.
Scientists measure the temperature of the water every day at noon and record it in a notebook.
My favourite colours are blue, green and yellow, but my sister prefers red and purple.
"""

# Prompt sources: words are added from a source until the tokenizer gives at least the target count.
PROMPT_SOURCES = (
    "Hello there, friend of mine",
    "Once upon a time, a small robot learned to count the stars above the quiet town.",
    "In the morning the market opens early; farmers bring apples, bread, cheese and fresh milk "
    "while children run between the stalls laughing loudly.",
)


@dataclass
class Family:
    """One family: the HF class, its config (beyond the shared tiny shape) and its tokenizer kind."""

    name: str
    hf_class: str
    config: dict[str, Any]
    tokenizer: str  # "bpe" (byte-level, GPT-2 pre-tokenizer), "sp-llama" or "sp-gemma" (SentencePiece)
    notes: str
    init_range: float
    # Config changes under which the HF model computes what llama.cpp does with the converted GGUF,
    # where the GGUF cannot express the HF config (a second greedy path is recorded under them).
    gguf_reading: dict[str, Any] | None = None
    gguf_reading_note: str = ""
    # Config changes that show the oracle exercises what makes the family differ: for each, how many
    # prompts' greedy paths change and how far the first step's logits move (recorded, not required).
    probes: list[dict[str, Any]] = field(default_factory=list)
    # After init, weights whose name ends with a key are multiplied by (scale) or shifted by (shift) its
    # value: granite divides its logits by 8; gemma2's tied embedding would otherwise dominate (greedy
    # repeats one token) and its attention scores would stay far below the softcap.
    scale: dict[str, float] = field(default_factory=dict)
    shift: dict[str, float] = field(default_factory=dict)
    seeds: range = field(default_factory=lambda: range(1, 200))


def shape(layers: int = 2, intermediate: int = 128) -> dict[str, Any]:
    """The tiny shape every family shares: hidden 64, 4 query heads and 2 KV heads of 16."""
    return {
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "num_hidden_layers": layers,
        "intermediate_size": intermediate,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6,
    }


def families() -> list[Family]:
    """The families, in the order they are made."""
    longrope_short = [1.0 + 0.25 * (i + 1) for i in range(6)]  # rotary_dim 12 -> 6 factors each
    longrope_long = [2.0 + 1.5 * i for i in range(6)]
    return [
        Family(
            "qwen3",
            "Qwen3ForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                "eos_token_id": 0,
            },
            "bpe",
            "Llama layout plus an RMSNorm over each head of q and of k (q_norm/k_norm, weight of head_dim) "
            "before RoPE; NeoX (half-split) RoPE; no biases; untied output.",
            0.25,
            probes=[{"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0}}],
        ),
        Family(
            "qwen3moe",
            "Qwen3MoeForCausalLM",
            {
                **shape(intermediate=128),
                "tie_word_embeddings": False,
                "num_experts": 8,
                "num_experts_per_tok": 2,
                "moe_intermediate_size": 32,
                "norm_topk_prob": True,
                "decoder_sparse_step": 1,
                "mlp_only_layers": [],
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6},
                "eos_token_id": 0,
            },
            "bpe",
            "Qwen3 attention (per-head q/k RMSNorm); every layer's MLP is a sparse MoE: router softmax over "
            "8 experts, top-2, the two weights renormalised to sum 1 (norm_topk_prob), SwiGLU experts of "
            "32; no shared expert.",
            0.25,
            probes=[{"norm_topk_prob": False}, {"num_experts_per_tok": 1}],
        ),
        Family(
            "phi3",
            "Phi3ForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": False,
                "original_max_position_embeddings": 4096,
                "rope_parameters": {
                    "rope_type": "default",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 1.0,
                },
                "sliding_window": None,
                "bos_token_id": 1,
                "eos_token_id": 2,
                "pad_token_id": None,
            },
            "sp-llama",
            "Phi-3-mini layout: fused qkv_proj and fused gate_up_proj (gate first), full NeoX RoPE, no rope "
            "scaling, no sliding window (GGUF sliding_window 0); SentencePiece tokenizer.",
            0.25,
            probes=[
                {
                    "rope_parameters": {
                        "rope_type": "default",
                        "rope_theta": 500000.0,
                        "partial_rotary_factor": 1.0,
                    }
                }
            ],
        ),
        Family(
            "phi4mini",
            "Phi3ForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": True,
                "max_position_embeddings": 131072,
                "original_max_position_embeddings": 4096,
                "rope_parameters": {
                    "rope_type": "longrope",
                    "rope_theta": 10000.0,
                    "partial_rotary_factor": 0.75,
                    "original_max_position_embeddings": 4096,
                    "short_factor": longrope_short,
                    "long_factor": longrope_long,
                },
                "sliding_window": None,
                "bos_token_id": 0,
                "eos_token_id": 0,
                "pad_token_id": None,
            },
            "bpe",
            "Phi-4-mini layout: Phi-3 tensors, partial RoPE (first 12 of 16 dims of each head, NeoX within "
            "them), longrope: inv_freq divided by short_factor (positions up to "
            "original_max_position_embeddings 4096, so always here) or long_factor, cos/sin times "
            "sqrt(1 + ln(131072/4096)/ln(4096)); tied output; GPT2Tokenizer byte-level BPE.",
            0.25,
            probes=[
                {
                    "rope_parameters": {
                        "rope_type": "default",
                        "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.75,
                    }
                },
                {
                    "rope_parameters": {
                        "rope_type": "longrope",
                        "rope_theta": 10000.0,
                        "partial_rotary_factor": 0.75,
                        "original_max_position_embeddings": 4096,
                        "short_factor": longrope_long,
                        "long_factor": longrope_long,
                    }
                },
            ],
        ),
        Family(
            "gemma2",
            "Gemma2ForCausalLM",
            {
                **shape(layers=4, intermediate=64),
                "tie_word_embeddings": True,
                "attn_logit_softcapping": 50.0,
                "final_logit_softcapping": 30.0,
                "sliding_window": 8,
                "layer_types": ["sliding_attention", "full_attention"] * 2,
                "query_pre_attn_scalar": 24,
                "hidden_activation": "gelu_pytorch_tanh",
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                "pad_token_id": 0,
                "eos_token_id": 1,
                "bos_token_id": 2,
            },
            "sp-gemma",
            "Embeddings times sqrt(hidden)=8; RMSNorm weights stored zero-centred (HF multiplies by 1+w; "
            "the converter adds 1); four norms a layer (input, post_attention, pre_feedforward, "
            "post_feedforward); GeGLU (tanh gelu); attention scores tanh-softcapped at 50 and scaled by "
            "query_pre_attn_scalar**-0.5 = 24**-0.5 (not head_dim); layers 0 and 2 see only the last 8 "
            "positions (sliding_window 8), layers 1 and 3 all; final logits softcapped at 30; tied output.",
            0.25,
            scale={"q_proj.weight": 2.5, "k_proj.weight": 2.5},
            shift={"post_attention_layernorm.weight": 4.0, "post_feedforward_layernorm.weight": 4.0},
            gguf_reading={"query_pre_attn_scalar": 16},
            gguf_reading_note="The converter writes no query_pre_attn_scalar (nor attention.scale) for "
            "gemma2; llama.cpp scales by 1/sqrt(head_dim)=1/sqrt(16) unless the model has 46 layers. "
            "This path is the same weights with query_pre_attn_scalar 16, which is what the GGUF alone "
            "gives; hf/config.json has 24.",
            probes=[
                {"attn_logit_softcapping": None},
                {"final_logit_softcapping": None},
                {"sliding_window": 4096},
            ],
        ),
        Family(
            "olmo2",
            "Olmo2ForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": False,
                "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
                "pad_token_id": None,
                "bos_token_id": None,
                "eos_token_id": 0,
            },
            "bpe",
            "No pre-norms: each sublayer's output is RMSNormed (post_attention_layernorm, "
            "post_feedforward_layernorm) before it is added to the residual; q_norm over the whole q "
            "projection (64) and k_norm over the whole k projection (32), before RoPE; NeoX RoPE.",
            0.25,
            probes=[{"rms_norm_eps": 1e-2}],
        ),
        Family(
            "granite",
            "GraniteForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": False,
                "embedding_multiplier": 12.0,
                "attention_multiplier": 0.1,
                "residual_multiplier": 0.22,
                "logits_scaling": 8.0,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                "bos_token_id": 0,
                "eos_token_id": 0,
                "pad_token_id": None,
            },
            "bpe",
            "Llama layout with four scalars: embeddings times embedding_multiplier 12, attention scores "
            "times attention_multiplier 0.1 (instead of 1/sqrt(head_dim)), each sublayer output times "
            "residual_multiplier 0.22 before the residual add, final logits divided by logits_scaling 8.",
            0.25,
            scale={"lm_head.weight": 6.0},
            probes=[
                {"embedding_multiplier": 1.0},
                {"attention_multiplier": 0.25},
                {"residual_multiplier": 1.0},
                {"logits_scaling": 1.0},
            ],
        ),
        Family(
            "smollm3",
            "SmolLM3ForCausalLM",
            {
                **shape(layers=4, intermediate=64),
                "tie_word_embeddings": True,
                "no_rope_layer_interval": 4,
                "no_rope_layers": [1, 1, 1, 0],
                "rope_parameters": {"rope_type": "default", "rope_theta": 2000000.0},
                "bos_token_id": None,
                "eos_token_id": 0,
                "pad_token_id": None,
            },
            "bpe",
            "Llama layout (the converter permutes q/k as for llama) with NoPE layers: "
            "no_rope_layers[i]=0 means layer i applies no RoPE; here layer 3 (every 4th, "
            "no_rope_layer_interval 4). The GGUF carries no key for it: llama.cpp hard-codes "
            "use_rope = (il+1) % 4 != 0 for smollm3. Tied output.",
            0.25,
            probes=[{"no_rope_layers": [1, 1, 1, 1]}],
        ),
        Family(
            "mistral_sliding",
            "MistralForCausalLM",
            {
                **shape(),
                "tie_word_embeddings": False,
                "sliding_window": 8,
                "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
                "bos_token_id": 0,
                "eos_token_id": 0,
                "pad_token_id": None,
            },
            "bpe",
            "Llama layout with a sliding window of 8 on every layer (a query at position p sees keys at "
            "positions p-7..p).",
            0.25,
            gguf_reading={"sliding_window": None},
            gguf_reading_note="MistralForCausalLM converts as general.architecture 'llama' and the "
            "converter writes no sliding_window key, so llama.cpp runs it with full attention. This path "
            "is the same weights with the window off, which is what the GGUF alone gives; "
            "hf/config.json has sliding_window 8.",
        ),
    ]


# --- tokenizers ---------------------------------------------------------------------------------


def corpus_lines() -> list[str]:
    """The training corpus, repeated so that every merge has enough counts to be stable."""
    return [line for line in CORPUS.splitlines() if line.strip()] * 20


def train_bpe(folder: Path, tokenizer_class: str, vocab_size: int) -> None:
    """A byte-level BPE tokenizer (GPT-2 pre-tokenizer and byte alphabet), saved as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus_lines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token=None
    )
    fast.save_pretrained(folder)
    # The converter picks its vocabulary reader from tokenizer_class (Phi-3's path wants GPT2Tokenizer).
    finish_tokenizer_config(folder, tokenizer_class=tokenizer_class, add_bos_token=False)


def train_sentencepiece(folder: Path, gemma: bool, vocab_size: int) -> None:
    """A SentencePiece BPE model with byte fallback (tokenizer.model) and transformers' fast
    tokenizer built from it (tokenizer.json): Llama's special ids and prefix space, or Gemma's."""
    import sentencepiece as spm
    from transformers import GemmaTokenizer, LlamaTokenizer

    # Gemma's ids and piece names (pad 0, eos 1, bos 2, unk 3, mask 4), else Llama's (unk 0, bos 1, eos 2).
    ids: dict[str, Any] = (
        {
            **{"pad_id": 0, "eos_id": 1, "bos_id": 2, "unk_id": 3},
            **{"pad_piece": "<pad>", "eos_piece": "<eos>", "bos_piece": "<bos>", "unk_piece": "<unk>"},
            "control_symbols": ["<mask>"],
        }
        if gemma
        else {"unk_id": 0, "bos_id": 1, "eos_id": 2, "pad_id": -1}
    )
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()),
        model_writer=model,
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        split_digits=True,
        character_coverage=1.0,
        add_dummy_prefix=not gemma,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
        **ids,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.model").write_bytes(model.getvalue())
    cls = GemmaTokenizer if gemma else LlamaTokenizer
    # Gemma adds BOS (as google/gemma-2 does); the Phi-3 one adds none.
    fast = cls.from_pretrained(folder, add_bos_token=gemma, add_eos_token=False)
    fast.save_pretrained(folder)
    finish_tokenizer_config(folder, add_bos_token=gemma)


def finish_tokenizer_config(folder: Path, add_bos_token: bool, **updates: Any) -> None:
    """Write add_bos_token/add_eos_token out (so the GGUF's tokenizer.ggml.add_bos_token says what the
    tokenizer does; llama.cpp's SentencePiece default is to add one) and drop the keys save_pretrained
    records about where it loaded from (an absolute vocab_file path)."""
    path = folder / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config.update(updates, add_bos_token=add_bos_token, add_eos_token=False)
    for key in ("vocab_file", "is_local", "local_files_only"):
        config.pop(key, None)
    path.write_text(json.dumps(config, indent=2) + "\n")


def make_tokenizer(family: Family, folder: Path, vocab_size: int):
    """Train the family's tokenizer into folder and load it back as transformers does."""
    from transformers import AutoTokenizer

    if family.tokenizer == "bpe":
        cls = "GPT2Tokenizer" if family.name == "phi4mini" else "PreTrainedTokenizerFast"
        train_bpe(folder, cls, vocab_size)
    else:
        train_sentencepiece(folder, family.tokenizer == "sp-gemma", vocab_size)
    return AutoTokenizer.from_pretrained(folder)


def prompts(tokenizer) -> list[tuple[str, list[int]]]:
    """Three prompts of about PROMPT_TARGETS tokens: words of each source until the count is reached."""
    out = []
    for target, source in zip(PROMPT_TARGETS, PROMPT_SOURCES, strict=True):
        words = source.split(" ")
        for n in range(1, len(words) + 1):
            text = " ".join(words[:n])
            ids = tokenizer(text).input_ids
            if len(ids) >= target:
                break
        out.append((text, list(ids)))
    return out


# --- the model and its greedy path --------------------------------------------------------------


def build_model(family: Family, vocab_size: int, seed: int):
    """The seeded float32 model. Norm weights (all 1 or all 0 at init) get noise too, so a norm read
    from the wrong tensor, or its offset dropped, changes the logits."""
    import torch
    import transformers

    cls = getattr(transformers, family.hf_class)
    config_cls = cls.config_class
    config = config_cls(
        vocab_size=vocab_size,
        initializer_range=family.init_range,
        attn_implementation="eager",
        dtype="float32",
        **family.config,
    )
    config.architectures = [family.hf_class]
    torch.manual_seed(seed)
    model = cls(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim == 1:
                param.add_(0.2 * torch.randn_like(param))
            for suffix, factor in family.scale.items():
                if name.endswith(suffix):
                    param.mul_(factor)
            for suffix, offset in family.shift.items():
                if name.endswith(suffix):
                    param.add_(offset)
    return model


def with_config(model, family: Family, overrides: dict[str, Any]):
    """The same weights under a changed config (the GGUF's reading of the model)."""
    import torch
    import transformers

    cls = getattr(transformers, family.hf_class)
    config = cls.config_class(**{**model.config.to_dict(), **overrides})
    config._attn_implementation = "eager"
    other = cls(config).to(torch.float32).eval()
    other.load_state_dict(model.state_dict())
    return other


def probe(model, family: Family, change: dict[str, Any], prompt_list, result) -> dict[str, Any]:
    """How much one config change moves the oracle: prompts whose greedy path changes, and the largest
    logit change at the first step (a softcap or a final scale moves logits, never the argmax)."""
    import torch

    other = with_config(model, family, change)
    changed, moved = 0, 0.0
    with torch.no_grad():
        for (_, ids), ref in zip(prompt_list, result, strict=True):
            path, _ = greedy(other, ids)
            changed += path != ref["greedy"]
            a = model(torch.tensor([ids]), use_cache=False).logits[0, -1]
            b = other(torch.tensor([ids]), use_cache=False).logits[0, -1]
            moved = max(moved, float((a - b).abs().max()))
    return {
        "config_change": change,
        "prompts_whose_greedy_changes": changed,
        "max_first_step_logit_change": moved,
    }


def greedy(model, ids: list[int]) -> tuple[list[int], list[dict[str, Any]]]:
    """STEPS greedy tokens, each from a full float32 forward over the whole sequence (no cache), with
    the top-TOP logits that chose it and the top-1/top-2 gap. Never stops at EOS."""
    import torch

    seq = list(ids)
    generated, steps = [], []
    with torch.no_grad():
        for _ in range(STEPS):
            logits = model(torch.tensor([seq]), use_cache=False).logits[0, -1].to(torch.float32)
            top = torch.topk(logits, TOP)
            values = [float(v) for v in top.values]
            token = int(torch.argmax(logits))
            assert token == int(top.indices[0])
            steps.append(
                {
                    "top5_ids": [int(i) for i in top.indices],
                    "top5_logits": values,
                    "gap": values[0] - values[1],
                }
            )
            generated.append(token)
            seq.append(token)
    return generated, steps


def oracle_prompts(model, prompt_list: list[tuple[str, list[int]]]) -> tuple[list[dict[str, Any]], float]:
    """The greedy path of every prompt and the smallest top-1/top-2 gap over all their steps."""
    out = []
    for text, ids in prompt_list:
        path, steps = greedy(model, ids)
        out.append({"text": text, "ids": ids, "greedy": path, "steps": steps})
    gap = min(s["gap"] for p in out for s in p["steps"])
    return out, gap


# --- conversion and the GGUF listing ------------------------------------------------------------


def run_converter_wrapped(llamacpp: Path, argv: list[str]) -> None:
    """Run llama.cpp's converter in this process with only the BPE pre-tokenizer lookup patched."""
    sys.path.insert(0, str(llamacpp / "gguf-py"))
    sys.path.insert(0, str(llamacpp))
    import gguf
    from conversion import base

    assert Path(gguf.__file__).is_relative_to(llamacpp / "gguf-py"), gguf.__file__

    def fixed_pre(self, tokenizer) -> str:
        # The hash table lists real tokenizers only; ours uses the GPT-2 ByteLevel pre-tokenizer.
        return BPE_PRE_TOKENIZER

    base.TextModel.get_vocab_base_pre = fixed_pre
    sys.argv = [str(llamacpp / "convert_hf_to_gguf.py"), *argv]
    runpy.run_path(str(llamacpp / "convert_hf_to_gguf.py"), run_name="__main__")


def convert(llamacpp: Path, hf: Path, outfile: Path, outtype: str) -> None:
    """The converter as a subprocess (through --run-converter) for one output type."""
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(llamacpp / "gguf-py"), str(llamacpp)]),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    cmd = [
        sys.executable,
        str(Path(__file__).resolve()),
        "--llamacpp",
        str(llamacpp),
        "--run-converter",
        "--",
    ]
    cmd += [str(hf), "--outfile", str(outfile), "--outtype", outtype]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"converter failed for {hf} ({outtype}):\n{result.stderr[-4000:]}")


def gguf_reader(llamacpp: Path):
    """gguf-py's reader from llama.cpp's own copy (the one the converter wrote with)."""
    sys.path.insert(0, str(llamacpp / "gguf-py"))
    import gguf

    return gguf


def field_value(gguf, fld) -> Any:
    """A GGUF metadata value as plain Python."""
    kind = fld.types[0]
    if kind == gguf.GGUFValueType.ARRAY:
        inner = fld.types[1] if len(fld.types) > 1 else None
        if inner == gguf.GGUFValueType.STRING:
            return [bytes(fld.parts[i]).decode("utf-8", "replace") for i in fld.data]
        return [fld.parts[i].tolist()[0] for i in fld.data]
    if kind == gguf.GGUFValueType.STRING:
        return bytes(fld.parts[fld.data[0]]).decode("utf-8")
    value = fld.parts[fld.data[0]].tolist()[0]
    return float(value) if kind in (gguf.GGUFValueType.FLOAT32, gguf.GGUFValueType.FLOAT64) else value


def describe_gguf(llamacpp: Path, path: Path) -> dict[str, Any]:
    """general.architecture, every `<arch>.` key, tokenizer summary, and layer-0 + global tensors."""
    gguf = gguf_reader(llamacpp)
    reader = gguf.GGUFReader(path)
    arch = field_value(gguf, reader.fields["general.architecture"])
    keys = {k: field_value(gguf, f) for k, f in reader.fields.items() if k.startswith(f"{arch}.")}
    tok_keys = {}
    for k, f in reader.fields.items():
        if k.startswith("tokenizer.ggml.") and k not in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges"):
            value = field_value(gguf, f)
            if isinstance(value, list):
                value = f"[{len(value)} values]"
            tok_keys[k] = value
    tensors = []
    for t in reader.tensors:
        if t.name.startswith("blk.") and not t.name.startswith("blk.0."):
            continue
        tensors.append({"name": t.name, "shape": [int(d) for d in t.shape], "type": t.tensor_type.name})
    return {"architecture": arch, "keys": keys, "tokenizer": tok_keys, "tensors": tensors}


# --- one family ---------------------------------------------------------------------------------


def vocab_for(family: Family) -> int:
    """Vocabulary size: 320 rows keep every folder near 1 MB (the byte alphabet alone is 256); 288 for
    the MoE, whose experts take the room."""
    return 288 if family.name == "qwen3moe" else 320


def make_family(family: Family, out: Path, llamacpp: Path) -> dict[str, Any]:
    """Build, search a seed with clear greedy picks, save, convert and write the family's oracle."""
    import torch
    import transformers

    folder = out / family.name
    hf = folder / "hf"
    if folder.exists():
        shutil.rmtree(folder)
    hf.mkdir(parents=True)
    vocab = vocab_for(family)
    tokenizer = make_tokenizer(family, hf, vocab)
    assert len(tokenizer) <= vocab, (family.name, len(tokenizer))
    prompt_list = prompts(tokenizer)
    adds_bos = json.loads((hf / "tokenizer_config.json").read_text())["add_bos_token"]
    for _, ids in prompt_list:
        assert (ids[0] == tokenizer.bos_token_id) == adds_bos, (family.name, ids)

    chosen = None
    for seed in family.seeds:
        model = build_model(family, vocab, seed)
        result, gap = oracle_prompts(model, prompt_list)
        variant = None
        if family.gguf_reading is not None:
            other = with_config(model, family, family.gguf_reading)
            v_prompts, v_gap = oracle_prompts(other, prompt_list)
            variant = (v_prompts, v_gap)
            gap = min(gap, v_gap)
        print(f"{family.name}: seed {seed} min gap {gap:.4g}", flush=True)
        if gap >= MIN_GAP:
            chosen = (seed, model, result, variant)
            break
    if chosen is None:
        raise RuntimeError(f"{family.name}: no seed in {family.seeds} gives a min gap >= {MIN_GAP}")
    seed, model, result, variant = chosen

    model.save_pretrained(hf, safe_serialization=True)
    for path in hf.iterdir():
        if path.name not in KEEP_HF_FILES:
            path.unlink() if path.is_file() else shutil.rmtree(path)
    # The saved folder must reload to the same logits (what an engine loading hf/ will see).
    reloaded = getattr(transformers, family.hf_class).from_pretrained(
        hf, dtype=torch.float32, attn_implementation="eager"
    )
    check, _ = oracle_prompts(reloaded.eval(), prompt_list[:1])
    assert check[0]["greedy"] == result[0]["greedy"], family.name

    convert(llamacpp, hf, folder / "f32.gguf", "f32")
    convert(llamacpp, hf, folder / "q8_0.gguf", "q8_0")
    described = describe_gguf(llamacpp, folder / "f32.gguf")

    min_gap = min(s["gap"] for p in result for s in p["steps"])
    probes = [probe(model, family, change, prompt_list, result) for change in family.probes]
    oracle: dict[str, Any] = {
        "family": family.name,
        "hf_architecture": family.hf_class,
        "gguf_architecture": described["architecture"],
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "seed": seed,
        "config_notes": family.notes,
        "min_gap": min_gap,
        "prompts": result,
    }
    if variant is not None:
        v_prompts, v_gap = variant
        oracle["gguf_reading"] = {
            "note": family.gguf_reading_note,
            "config_change": family.gguf_reading,
            "min_gap": v_gap,
            "differs_from_hf": any(
                a["greedy"] != b["greedy"] for a, b in zip(result, v_prompts, strict=True)
            ),
            "prompts": [{"greedy": p["greedy"], "steps": p["steps"]} for p in v_prompts],
        }
    if probes:
        oracle["probes"] = probes
    (folder / "oracle.json").write_text(dump_oracle(oracle))
    add_q8_0_reading(folder, family, llamacpp)
    oracle = json.loads((folder / "oracle.json").read_text())
    return {"family": family, "oracle": oracle, "gguf": described, "bytes": folder_bytes(folder)}


ROUTER_SUFFIX = "mlp.gate.weight"
"""The mixture-of-experts router: the one matrix llama.cpp's converter keeps in F32 in a Q8_0 file
(every other matrix, the embedding table included, is Q8_0; vectors stay F32)."""


def q8_0_round_trip(model, llamacpp: Path) -> None:
    """Replace, in place, every weight the Q8_0 file stores as Q8_0 by its Q8_0 round trip through
    llama.cpp's own gguf-py (blocks of 32 along each row, as the converter quantizes): the float32
    numbers a Q8_0 GGUF holds. Row permutations the converter applies (llama-family q/k) move whole
    rows, so the round trip in Hugging Face's layout gives the same values."""
    import torch

    gguf = gguf_reader(llamacpp)
    from gguf.quants import dequantize, quantize

    q8 = gguf.GGMLQuantizationType.Q8_0
    with torch.no_grad():
        for name, param in model.named_parameters():
            if param.ndim < 2 or name.endswith(ROUTER_SUFFIX):
                continue
            data = param.detach().to(torch.float32).numpy()
            restored = dequantize(quantize(data, q8), q8).reshape(data.shape)
            param.copy_(torch.from_numpy(restored))


def add_q8_0_reading(folder: Path, family: Family, llamacpp: Path) -> None:
    """Add `q8_0_reading` to a family's oracle.json: transformers' float32 greedy path of the weights
    its q8_0.gguf holds (under the GGUF's reading of the config where that differs). Q8_0 moves these
    scaled random weights enough that the F32 path is kept only for a few steps, so the Q8_0 file is
    checked against the same model run on its own numbers."""
    import torch
    import transformers

    oracle = json.loads((folder / "oracle.json").read_text())
    model = getattr(transformers, family.hf_class).from_pretrained(
        folder / "hf", dtype=torch.float32, attn_implementation="eager"
    )
    if family.gguf_reading is not None:
        model = with_config(model, family, family.gguf_reading)
    q8_0_round_trip(model, llamacpp)
    prompt_list = [(p["text"], p["ids"]) for p in oracle["prompts"]]
    result, gap = oracle_prompts(model.eval(), prompt_list)
    oracle["q8_0_reading"] = {
        "note": "transformers float32 on the Q8_0 file's numbers (every matrix round-tripped through "
        "gguf-py's Q8_0, the MoE router kept F32)"
        + ("; the GGUF's reading of the config (gguf_reading)" if family.gguf_reading else ""),
        "min_gap": gap,
        "prompts": [{"greedy": p["greedy"], "steps": p["steps"]} for p in result],
    }
    (folder / "oracle.json").write_text(dump_oracle(oracle))
    print(f"{family.name}: q8_0 reading, min gap {gap:.4g}", flush=True)


def dump_oracle(oracle: dict[str, Any]) -> str:
    """JSON with one line per step (readable diffs, a third of indent=1's size)."""
    steps_marker = "\u0000steps\u0000"
    stash: list[str] = []

    def collapse(node: Any) -> Any:
        if isinstance(node, dict):
            return {k: collapse(v) for k, v in node.items()}
        if isinstance(node, list) and node and isinstance(node[0], dict) and "gap" in node[0]:
            stash.extend(json.dumps(step) for step in node)
            return [f"{steps_marker}{len(stash) - len(node) + i}" for i in range(len(node))]
        if isinstance(node, list) and all(isinstance(v, (int, float)) for v in node):
            stash.append(json.dumps(node))
            return f"{steps_marker}{len(stash) - 1}"
        if isinstance(node, list):
            return [collapse(v) for v in node]
        return node

    text = json.dumps(collapse(oracle), indent=1)
    for i in range(len(stash) - 1, -1, -1):
        text = text.replace(json.dumps(f"{steps_marker}{i}"), stash[i])
    return text + "\n"


def folder_bytes(folder: Path) -> int:
    """Total size of the files under folder."""
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


# --- README -------------------------------------------------------------------------------------


README_HEAD = """\
# Tiny random models of families the engine does not load yet

Made by `scripts/family_oracles.py`, run once in a throwaway virtual environment (torch and
transformers are never project dependencies; the venv has torch 2.14.1, transformers 5.24.0,
sentencepiece, safetensors, gguf and protobuf):

    /tmp/oracle-venv/bin/python scripts/family_oracles.py --out tests/reference/families

Per family:

- `hf/`: the seeded float32 transformers model (`config.json`, `model.safetensors`) and its tiny
  trained tokenizer (`tokenizer.json`, `tokenizer_config.json`, `tokenizer.model` for SentencePiece).
- `f32.gguf`, `q8_0.gguf`: that folder converted by llama.cpp's own `convert_hf_to_gguf.py` (the copy
  vendored in llama-cpp-python 0.3.36, with its own gguf-py) with `--outtype f32` / `--outtype q8_0`.
  Only the BPE pre-tokenizer hash lookup is patched, to `gpt-2` (the byte-level tokenizers here are
  trained with the GPT-2 ByteLevel pre-tokenizer; no hash table lists them).
- `oracle.json`: transformers float32 (eager attention) greedy paths for three prompts (about 4, 10
  and 20 tokens; `ids` are exactly the ids fed), 32 steps each, every step a full forward over the
  whole sequence, EOS never stops it. `steps[i]` holds the top-5 ids/logits that chose `greedy[i]`
  and the top-1/top-2 `gap`; the seed was chosen so `min_gap` (over all steps) is >= 1e-2.
  Where the GGUF cannot express the HF config (gemma2's query_pre_attn_scalar, mistral's sliding
  window) `gguf_reading` holds the greedy path of the same weights as llama.cpp reads the GGUF.
  `probes` record what a config change does to the same weights (evidence that the prompts
  exercise the feature; a softcap or a final logit scale moves logits but never the argmax).

Weights are drawn with a large initializer_range (0.25) and 1-D weights (norms) get N(0, 0.2)
noise, so greedy picks are not near-ties and a norm mapped to the wrong tensor shows. Tensor shapes
below are GGUF order (ne0 first, the reverse of the PyTorch shape).

Checked once by hand (not by this script) with llama.cpp itself, built from the same sdist (CPU,
F32 KV cache, greedy from the recorded ids): on every `f32.gguf` it reproduces all 3x32 greedy ids
with top logits within 3e-5 for qwen3, qwen3moe, phi3, phi4mini, olmo2, granite and smollm3;
mistral_sliding matches `gguf_reading` (full attention) 32/32 x3; gemma2 matches `gguf_reading`
32/32 on two prompts and 15/32 on the first, its logits ~1e-3 off because ggml's CPU GELU reads an
fp16 table. Q8_0 is far from F32 on these large random weights: transformers on the Q8_0-dequantized
weights (float activations) shares these leading greedy ids with the F32 oracle, per prompt:
qwen3 16/32/30, qwen3moe 32/21/4, phi3 4/5/5, phi4mini 11/32/26, gemma2 10/12/0, olmo2 32/32/32,
granite 32/32/2, smollm3 9/1/6, mistral_sliding 2/2/1 (llama.cpp's own Q8_0 run, which also
quantizes the activations, is of the same order), so the Q8_0 file has its own oracle,
`q8_0_reading`: transformers float32 on the numbers the file holds (every matrix round-tripped
through gguf-py's Q8_0, the MoE router kept F32, as the converter keeps it).
"""


def readme(made: list[dict[str, Any]]) -> str:
    """The README of tests/reference/families: how the files were made, then one section a family."""
    lines = [*README_HEAD.splitlines(), ""]
    for item in made:
        family, oracle, described = item["family"], item["oracle"], item["gguf"]
        lines += [
            f"## {family.name}",
            "",
            f"`{family.hf_class}` -> `general.architecture` = `{described['architecture']}`; seed "
            f"{oracle['seed']}, min gap {oracle['min_gap']:.4g}; folder {item['bytes'] / 1e6:.2f} MB.",
            "",
            family.notes,
            "",
        ]
        if "gguf_reading" in oracle:
            reading = oracle["gguf_reading"]
            lines += [
                f"**GGUF cannot express it**: {reading['note']} (greedy differs from the HF path: "
                f"{reading['differs_from_hf']}; its min gap {reading['min_gap']:.4g}.)",
                "",
            ]
        for item_probe in oracle.get("probes", []):
            lines.append(
                f"- probe `{json.dumps(item_probe['config_change'])}`: greedy changes in "
                f"{item_probe['prompts_whose_greedy_changes']}/3 prompts, first-step logits move up to "
                f"{item_probe['max_first_step_logit_change']:.3g}."
            )
        if oracle.get("probes"):
            lines.append("")
        lines += ["| key | value |", "|---|---|"]
        lines += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in described["keys"].items()]
        lines += [f"| `{k}` | `{json.dumps(v)}` |" for k, v in described["tokenizer"].items()]
        lines += ["", "| tensor | shape (ne) | type |", "|---|---|---|"]
        lines += [f"| `{t['name']}` | {t['shape']} | {t['type']} |" for t in described["tensors"]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/reference/families"))
    parser.add_argument("--llamacpp", type=Path, default=DEFAULT_LLAMACPP)
    parser.add_argument("--only", nargs="*", help="family names (default: all)")
    parser.add_argument(
        "--q8-only", action="store_true", help="only (re)write each existing folder's q8_0_reading"
    )
    parser.add_argument("--run-converter", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.run_converter:
        run_converter_wrapped(args.llamacpp, [a for a in args.rest if a != "--"])
        return

    import torch

    torch.set_num_threads(1)  # deterministic reductions, and the machine is shared
    args.out.mkdir(parents=True, exist_ok=True)
    if args.q8_only:
        for family in families():
            if (not args.only or family.name in args.only) and (args.out / family.name).is_dir():
                add_q8_0_reading(args.out / family.name, family, args.llamacpp)
        return
    made = []
    failed = {}
    for family in families():
        if args.only and family.name not in args.only:
            continue
        try:
            made.append(make_family(family, args.out, args.llamacpp))
        except Exception as error:  # one family that cannot convert must not stop the rest
            failed[family.name] = f"{type(error).__name__}: {error}"
            print(f"{family.name}: FAILED {failed[family.name][:2000]}", flush=True)
    if not args.only:
        text = readme(made)
        if failed:
            text += "\n## Not made\n\n" + "\n".join(f"- {k}: {v.splitlines()[0]}" for k, v in failed.items())
        (args.out / "README.md").write_text(text + "\n")
    for item in made:
        print(f"{item['family'].name}: {item['bytes'] / 1e6:.2f} MB, min gap {item['oracle']['min_gap']:.4g}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
