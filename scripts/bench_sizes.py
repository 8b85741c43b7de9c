"""`infer` against llama.cpp at the sizes people run: Llama 3.2 1B / 3B and Llama 3.1 8B shapes (issue 28),
and Qwen3-30B-A3B's mixture-of-experts layers (issue 31: `--shapes qwen3moe`, 12 of its 48 layers).

Usage: python scripts/bench_sizes.py [--shapes 1b,3b,8b,qwen3moe] [--mixes Q4_0,Q8_0,Q4_K_M,Q5_K_M,Q6_K]
           [--rounds 3] [--threads N] [--decode 64] [--prefill 256] [--streams 16]
           [--infer-args "--cpu-kernels exact"] [--models DIR] [--avx2-only] [--json]

Writes random-weight GGUFs at the real shapes (GQA, the 128,256-token Llama 3 vocabulary with the
tokenizer metadata copied from llama.cpp's own `ggml-vocab-llama-bpe.gguf`, tied heads for 1B/3B and an
untied one for 8B) in the chosen quantization mixes, as llama-quantize mixes them: Q4_K_M = Q4_K with
Q6_K for the output/tied embedding and for attn_v and ffn_down of the "more bits" layers (the first and
last eighth and every third between), Q5_K_M likewise over Q5_K, Q4_0 with a Q6_K output, Q8_0 and
Q6_K throughout; on request (--mixes) also Q5_0 and Q5_1, each with a Q6_K output as Q4_0. Block
scales are chosen so weights have a standard deviation of about 0.02 and the activations stay finite.
The files are cached outside the repository ($INFER_HOME/bench-models).
RANDOM WEIGHTS: the figures measure speed only; the text is noise.

Then, for each model, `rounds` alternating rounds of llama.cpp and infer with the same thread count:
  decode       llama-bench -p 0 -n D                 vs  infer bench -p 0 -n D --temp 0
  prefill      llama-bench -p P -n 0                 vs  infer bench -p P -n 0 --temp 0
  streams      llama-batched-bench -npp 32 -ntg 32 -npl S (B*TG / T)
               vs  infer bench --concurrency S --concurrency-prompt 32 -n 32 (1B shape only)
and prints medians, ratios, decode GB/s (the weight bytes one token reads: every matrix, the output head
included, the embedding table only when untied, since a lookup reads only its rows) against the machine's
read bandwidth (a STREAM-style parallel read of 2 GiB on the same threads, measured in this script), and
infer's peak RSS beside the file size. llama.cpp is built from the llama-cpp-python sdist
(scripts/llamacpp_build.py). Exit 2 with one line when a build or a run fails.

`--avx2-only` compares the two as an AVX2 machine without VNNI or AVX-512 (Haswell to Zen 3) runs them, on
a newer host: llama.cpp built without those extensions (GGML_AVX512=OFF, GGML_AVX_VNNI=OFF) and infer's
kernels compiled by numba for `haswell` with the AVX2 features (NUMBA_CPU_NAME / NUMBA_CPU_FEATURES), so
they take their AVX2 paths.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import gguf
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_llamacpp import RunError, Setup, infer_bench_tps, run
from llamacpp_build import BuildError, avx2_only, cpuinfo_flags, default_cache_dir, ensure_built

HASWELL_FEATURES = (
    "+64bit,+avx,+avx2,+bmi,+bmi2,+cmov,+cx16,+f16c,+fma,+lzcnt,+movbe,+popcnt,+sse,+sse2,+sse3,+sse4.1,"
    "+sse4.2,+ssse3,+xsave,-avx512f,-avx512bw,-avx512vl,-avx512dq,-avx512cd,-avx512vnni,-avxvnni"
)
"""numba's target features for `--avx2-only` (with NUMBA_CPU_NAME=haswell): AVX2 and FMA, no VNNI or
AVX-512."""

GGMLType = gguf.GGMLQuantizationType


@dataclass(frozen=True)
class Shape:
    """A Llama 3 shape (Hugging Face config names)."""

    name: str
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    tie_word_embeddings: bool
    vocab_size: int = 128256
    rope_theta: float = 500000.0
    rope_factor: float = 32.0
    """llama3 RoPE scaling (low 1, high 4, original context 8192); 8.0 for 3.1 8B; 0: none."""
    head_size: int = 0
    """Width of one attention head when it is not hidden / heads (Qwen3)."""
    experts: int = 0
    """Experts per layer of a mixture-of-experts shape (Qwen3-MoE); 0: dense."""
    experts_used: int = 0
    """Experts each token is routed to."""
    architecture: str = "llama"
    """GGUF general.architecture: llama, or qwen3moe (q/k norms, experts, no RoPE scaling)."""

    @property
    def head_dim(self) -> int:
        """Width of one attention head."""
        return self.head_size or self.hidden_size // self.num_attention_heads


SHAPES: dict[str, Shape] = {
    "1b": Shape("Llama-3.2-1B", 2048, 16, 32, 8, 8192, True),
    "3b": Shape("Llama-3.2-3B", 3072, 28, 24, 8, 8192, True),
    "8b": Shape("Llama-3.1-8B", 4096, 32, 32, 8, 14336, False, rope_factor=8.0),
    # Qwen3-30B-A3B's layers (hidden 2048, 32 q / 4 kv heads of 128, 128 experts of 768, 8 active),
    # 12 of its 48 so the file stays near 5 GB; Llama 3's vocabulary (the tokenizer copied here)
    # instead of Qwen's 151,936 rows.
    "qwen3moe": Shape(
        "Qwen3-30B-A3B-12L",
        2048,
        12,
        32,
        4,
        768,
        False,
        rope_theta=1_000_000.0,
        rope_factor=0.0,
        head_size=128,
        experts=128,
        experts_used=8,
        architecture="qwen3moe",
    ),
}

MIXES = ("Q4_0", "Q8_0", "Q4_K_M", "Q5_K_M", "Q6_K")
"""The mixes measured by default (the ones people run)."""
OTHER_MIXES = ("Q5_0", "Q5_1")
"""Legacy mixes measured when asked for (--mixes): each type everywhere but the Q6_K output."""
_FILE_TYPES = {"Q4_0": 2, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q4_K_M": 15, "Q5_K_M": 17, "Q6_K": 18}
"""general.file_type (llama_ftype) of each mix."""


def more_bits(layer: int, layers: int) -> bool:
    """llama-quantize's use_more_bits: the first and last eighth of the layers and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def tensor_type(mix: str, role: str, layer: int, layers: int) -> GGMLType:
    """The GGUF type llama-quantize gives tensor `role` (output, token_embd, attn_v, ffn_down, other)."""
    if mix in ("Q8_0", "Q6_K"):
        return GGMLType[mix]
    if role == "output":
        return GGMLType.Q6_K
    if mix in ("Q4_0", *OTHER_MIXES):
        return GGMLType[mix]
    base = GGMLType.Q4_K if mix == "Q4_K_M" else GGMLType.Q5_K
    if role in ("attn_v", "ffn_down") and more_bits(layer, layers):
        return GGMLType.Q6_K
    return base


_SCALE_AT = {
    GGMLType.Q4_0: (0, None),
    GGMLType.Q8_0: (0, None),
    GGMLType.Q5_0: (0, None),
    GGMLType.Q5_1: (0, 2),  # m: added to every weight of the block, as dmin's term is
    GGMLType.Q4_K: (0, 2),
    GGMLType.Q5_K: (0, 2),
    GGMLType.Q6_K: (208, None),
}
"""Byte offsets of each block's f16 scale d (and min scale dmin) for the types written here."""


def random_blocks(kind: GGMLType, rows: int, cols: int, std: float, rng: np.random.Generator) -> np.ndarray:
    """uint8 [rows, row bytes] of random blocks whose dequantized weights have mean ~0 and standard
    deviation ~std: the quants are random bytes, every block's d (and dmin) the same, solved from two
    probe dequantizations of a sample (weights are linear in d and dmin)."""
    elements, size = gguf.GGML_QUANT_SIZES[kind]
    blocks = rng.integers(0, 256, size=(rows, cols // elements, size), dtype=np.uint8)
    d_at, dmin_at = _SCALE_AT[kind]
    sample = blocks[: min(rows, 64)].copy()

    def probe(d: float, dmin: float) -> np.ndarray:
        sample[:, :, d_at : d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
        if dmin_at is not None:
            sample[:, :, dmin_at : dmin_at + 2] = np.frombuffer(np.float16(dmin).tobytes(), np.uint8)
        return gguf.quants.dequantize(sample.reshape(sample.shape[0], -1), kind).astype(np.float64)

    a = probe(1.0, 0.0)
    b = probe(0.0, 1.0) if dmin_at is not None else np.zeros_like(a)
    ratio = -a.mean() / b.mean() if dmin_at is not None else 0.0
    d = std / float(np.std(a + ratio * b))
    blocks[:, :, d_at : d_at + 2] = np.frombuffer(np.float16(d).tobytes(), np.uint8)
    if dmin_at is not None:
        blocks[:, :, dmin_at : dmin_at + 2] = np.frombuffer(np.float16(d * ratio).tobytes(), np.uint8)
    return blocks.reshape(rows, -1)


def llama3_rope_factors(shape: Shape) -> np.ndarray:
    """rope_freqs.weight as llama.cpp's converter writes it for llama3 scaling (low 1, high 4, 8192)."""
    dim = shape.head_dim
    freqs = 1.0 / (shape.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim))
    wavelengths = 2 * np.pi / freqs
    low_wave, high_wave = 8192 / 1.0, 8192 / 4.0
    smooth = (8192 / wavelengths - 1.0) / (4.0 - 1.0)
    factors = np.where(
        wavelengths < high_wave,
        1.0,
        np.where(
            wavelengths > low_wave, shape.rope_factor, 1.0 / ((1 - smooth) / shape.rope_factor + smooth)
        ),
    )
    return factors.astype(np.float32)


def vocabulary_gguf(cache: Path) -> Path:
    """llama.cpp's Llama 3 vocabulary file from the extracted sdist (the build extracts it)."""
    found = sorted(cache.glob("src/*/vendor/llama.cpp/models/ggml-vocab-llama-bpe.gguf"))
    if not found:
        raise BuildError(f"no ggml-vocab-llama-bpe.gguf under {cache / 'src'}: build llama.cpp first")
    return found[-1]


def copy_tokenizer(writer: gguf.GGUFWriter, vocab: Path) -> None:
    """Every tokenizer.* key of the vocabulary GGUF, with its type."""
    reader = gguf.GGUFReader(vocab)
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer."):
            continue
        kind = field.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(key, field.contents(), kind, sub_type=field.types[1])
        else:
            writer.add_key_value(key, field.contents(), kind)


def write_model(path: Path, shape: Shape, mix: str, vocab: Path, seed: int = 0) -> None:
    """A random-weight GGUF of `shape` in quantization mix `mix` (see the module docstring)."""
    rng = np.random.default_rng(seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".partial")
    writer = gguf.GGUFWriter(tmp, shape.architecture, use_temp_file=True)
    writer.add_name(f"{shape.name} {mix} (random weights, bench_sizes.py)")
    writer.add_uint32("general.file_type", _FILE_TYPES[mix])
    writer.add_context_length(131072)
    writer.add_embedding_length(shape.hidden_size)
    writer.add_block_count(shape.num_hidden_layers)
    writer.add_feed_forward_length(shape.intermediate_size)
    writer.add_head_count(shape.num_attention_heads)
    writer.add_head_count_kv(shape.num_key_value_heads)
    writer.add_rope_freq_base(shape.rope_theta)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_vocab_size(shape.vocab_size)
    writer.add_rope_dimension_count(shape.head_dim)
    writer.add_key_length(shape.head_dim)
    writer.add_value_length(shape.head_dim)
    if shape.experts:
        writer.add_expert_count(shape.experts)
        writer.add_expert_used_count(shape.experts_used)
        writer.add_expert_feed_forward_length(shape.intermediate_size)
    copy_tokenizer(writer, vocab)
    layers = shape.num_hidden_layers
    hidden, kv = shape.hidden_size, shape.num_key_value_heads * shape.head_dim
    q = shape.num_attention_heads * shape.head_dim

    def matrix(name: str, role: str, layer: int, rows: int, cols: int) -> None:
        kind = tensor_type(mix, role, layer, layers)
        writer.add_tensor(name, random_blocks(kind, rows, cols, 0.02, rng), raw_dtype=kind)

    embed_role = "output" if shape.tie_word_embeddings else "other"

    def experts(name: str, role: str, layer: int, rows: int, cols: int) -> None:
        # A stack [experts, rows, cols] of blocks (GGUF's ffn_*_exps), as llama-quantize types it.
        kind = tensor_type(mix, role, layer, layers)
        blocks = random_blocks(kind, shape.experts * rows, cols, 0.02, rng)
        writer.add_tensor(name, blocks.reshape(shape.experts, rows, -1), raw_dtype=kind)

    matrix("token_embd.weight", embed_role, 0, shape.vocab_size, hidden)
    if shape.rope_factor:
        writer.add_tensor("rope_freqs.weight", llama3_rope_factors(shape))
    for i in range(layers):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(hidden, np.float32))
        matrix(f"blk.{i}.attn_q.weight", "other", i, q, hidden)
        matrix(f"blk.{i}.attn_k.weight", "other", i, kv, hidden)
        matrix(f"blk.{i}.attn_v.weight", "attn_v", i, kv, hidden)
        matrix(f"blk.{i}.attn_output.weight", "other", i, hidden, q)
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(hidden, np.float32))
        if shape.architecture == "qwen3moe":
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(shape.head_dim, np.float32))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(shape.head_dim, np.float32))
        if shape.experts:
            router = rng.standard_normal((shape.experts, hidden)).astype(np.float32) * np.float32(0.02)
            writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", router)
            experts(f"blk.{i}.ffn_gate_exps.weight", "other", i, shape.intermediate_size, hidden)
            experts(f"blk.{i}.ffn_up_exps.weight", "other", i, shape.intermediate_size, hidden)
            experts(f"blk.{i}.ffn_down_exps.weight", "ffn_down", i, hidden, shape.intermediate_size)
            continue
        matrix(f"blk.{i}.ffn_gate.weight", "other", i, shape.intermediate_size, hidden)
        matrix(f"blk.{i}.ffn_up.weight", "other", i, shape.intermediate_size, hidden)
        matrix(f"blk.{i}.ffn_down.weight", "ffn_down", i, hidden, shape.intermediate_size)
    writer.add_tensor("output_norm.weight", np.ones(hidden, np.float32))
    if not shape.tie_word_embeddings:
        matrix("output.weight", "output", 0, shape.vocab_size, hidden)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    tmp.rename(path)


def decode_bytes(path: Path) -> int:
    """Weight bytes one decode step reads: every 2-D tensor but an untied embedding table, and of an
    expert stack (3-D) the share of its experts one token uses."""
    reader = gguf.GGUFReader(path)
    names = {t.name for t in reader.tensors}
    tied = "output.weight" not in names
    arch = str(reader.fields["general.architecture"].contents())
    used = reader.fields.get(f"{arch}.expert_used_count")
    count = reader.fields.get(f"{arch}.expert_count")
    share = int(used.contents()) / int(count.contents()) if used is not None and count is not None else 1.0
    total = 0.0
    for t in reader.tensors:
        if len(t.shape) == 2 and (t.name != "token_embd.weight" or tied):
            total += int(t.n_bytes)
        elif len(t.shape) == 3:
            total += int(t.n_bytes) * share
    return int(total)


def read_bandwidth(threads: int, gib: float = 2.0, repeats: int = 5) -> float:
    """GB/s of a parallel read of `gib` GiB on `threads` threads (best of `repeats`): the sum of every
    64-bit word, split over the threads in contiguous ranges, as a decode step streams its weights."""
    import numba

    # Each thread sums its range with numba's vectorised array sum: the element loop written out by hand
    # was not vectorised on a Zen 5 VM and read 9 GB/s where this reads 42 (compute-bound, not memory).
    @numba.njit(parallel=True, cache=False)
    def total(words: np.ndarray, parts: int) -> int:
        per = (words.shape[0] + parts - 1) // parts
        sums = np.zeros(parts, np.int64)
        for p in numba.prange(parts):
            start = p * per
            sums[p] = words[start : min(words.shape[0], start + per)].sum()
        return sums.sum()

    numba.set_num_threads(threads)
    words = np.ones(int(gib * (1 << 30)) // 8, np.int64)
    total(words, threads)
    best = min(_timed(lambda: total(words, threads)) for _ in range(repeats))
    return words.nbytes / best / 1e9


def read_bandwidth_in_child(threads: int) -> float:
    """read_bandwidth measured in a child process: a parent holding the 2 GiB buffer would pass its
    memory high-water mark to every child it forks, and the children's peak RSS would read 2 GB high."""
    here = str(Path(__file__).resolve().parent)
    code = f"import sys; sys.path.insert(0, {here!r}); import bench_sizes as b; "
    code += f"print(b.read_bandwidth({threads:d}))"
    done = run([sys.executable, "-c", code], "read bandwidth")
    return float(done.stdout.strip().splitlines()[-1])


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


@dataclass
class Result:
    """The medians of one model's rounds."""

    shape: str
    mix: str
    file_mb: float
    decode_mb: float
    decode_infer: float
    decode_llamacpp: float
    prefill_infer: float
    prefill_llamacpp: float
    streams_infer: float | None
    streams_llamacpp: float | None
    infer_rss_mb: float
    bandwidth_gbs: float

    @property
    def decode_gbs(self) -> float:
        """infer's decode read rate: weight bytes per token times tokens/s."""
        return self.decode_mb * self.decode_infer / 1000


def measure_model(setup: Setup, shape_key: str, args: argparse.Namespace, say: Callable[[str], None]) -> dict:
    """`args.rounds` alternating rounds on one model; the medians of each figure."""
    rows: dict[str, list[float]] = {k: [] for k in ("dl", "di", "pl", "pi", "sl", "si", "rss")}
    d, p, s = args.decode, args.prefill, args.streams
    for round_ in range(args.rounds):
        say(f"  round {round_ + 1}/{args.rounds} (load {os.getloadavg()[0]:.2f})")
        rows["dl"].append(setup.llama_bench("-p", "0", "-n", str(d))[f"tg{d}"])
        rows["di"].append(infer_bench_tps(setup.infer_bench("-p", "0", "-n", str(d)), 0, d))
        rows["pl"].append(setup.llama_bench("-p", str(p), "-n", "0")[f"pp{p}"])
        rows["pi"].append(infer_bench_tps(setup.infer_bench("-p", str(p), "-n", "0"), p, 0))
        if shape_key == "1b" and s > 1:
            row, _ = setup.batched(32, 32, s)
            rows["sl"].append(row.generated_per_s)
            conc = setup.infer_bench("--concurrency", str(s), "--concurrency-prompt", "32", "-n", "32")
            rows["si"].append(infer_bench_tps(conc, 32, 32, concurrency=s))
    gen = ["generate", "-n", "16", "--ignore-eos", "--temp", "0", "-c", "4096", "Hello"]
    # ru_maxrss comes in KiB (peak_rss_mb: MiB); the file sizes here are 10**6 bytes, so is this
    rows["rss"].append(run(setup.infer(*gen), "infer generate").peak_rss_mb * 2**20 / 1e6)
    return {k: (statistics.median(v) if v else None) for k, v in rows.items()}


def render(results: list[Result]) -> str:
    """The table the issue asks for: medians, ratios, GB/s and RSS."""
    header = (
        "model",
        "file MB",
        "decode i/l tok/s",
        "ratio",
        "prefill i/l tok/s",
        "ratio",
        "streams i/l",
        "ratio",
        "decode GB/s (% of read bw)",
        "RSS MB (over file)",
    )
    lines = [header]
    for r in results:
        streams = "-"
        sratio = "-"
        if r.streams_infer is not None and r.streams_llamacpp:
            streams = f"{r.streams_infer:.1f}/{r.streams_llamacpp:.1f}"
            sratio = f"{r.streams_infer / r.streams_llamacpp:.2f}x"
        lines.append(
            (
                f"{r.shape} {r.mix}",
                f"{r.file_mb:,.0f}",
                f"{r.decode_infer:.2f}/{r.decode_llamacpp:.2f}",
                f"{r.decode_infer / r.decode_llamacpp:.2f}x",
                f"{r.prefill_infer:.1f}/{r.prefill_llamacpp:.1f}",
                f"{r.prefill_infer / r.prefill_llamacpp:.2f}x",
                streams,
                sratio,
                f"{r.decode_gbs:.1f} ({100 * r.decode_gbs / r.bandwidth_gbs:.0f}%)",
                f"{r.infer_rss_mb:,.0f} (+{r.infer_rss_mb - r.file_mb:,.0f})",
            )
        )
    widths = [max(len(row[i]) for row in lines) for i in range(len(header))]
    out = []
    for row in lines:
        cells = enumerate(zip(row, widths, strict=True))
        out.append("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in cells))
    out.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Write (or reuse) the models, run the rounds, print the table (or JSON)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="1b,3b,8b")
    parser.add_argument("--mixes", default=",".join(MIXES))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--decode", type=int, default=64, help="decode tokens per run")
    parser.add_argument("--prefill", type=int, default=256, help="prompt tokens of the prefill runs")
    parser.add_argument("--streams", type=int, default=16, help="concurrent streams (1B shape only)")
    parser.add_argument("--repetitions", type=int, default=1, help="-r of each llama-bench / infer bench")
    parser.add_argument("--infer-args", default="", help="appended to every infer command")
    parser.add_argument("--llamacpp-args", default="", help="appended to every llama.cpp command")
    parser.add_argument("--models", type=Path, default=None, help="where the random GGUFs are cached")
    parser.add_argument("--avx2-only", action="store_true", help="both sides as an AVX2-only CPU runs them")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    flags = cpuinfo_flags(Path("/proc/cpuinfo").read_text(errors="replace"))
    if args.avx2_only:  # the infer runs are child processes: they compile (and cache) for this target
        flags = avx2_only(flags)
        os.environ.update(NUMBA_CPU_NAME="haswell", NUMBA_CPU_FEATURES=HASWELL_FEATURES)
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    shapes = [s.strip() for s in args.shapes.split(",") if s.strip()]
    mixes = [m.strip() for m in args.mixes.split(",") if m.strip()]
    unknown = [s for s in shapes if s not in SHAPES] + [m for m in mixes if m not in MIXES + OTHER_MIXES]
    if unknown:
        print(f"bench_sizes: error: unknown shape or mix {', '.join(unknown)}", file=sys.stderr)
        return 2
    cache = default_cache_dir()
    models = args.models or cache.parent / "bench-models"
    models.mkdir(parents=True, exist_ok=True)
    try:
        bins = ensure_built(cache, flags, log=say)
        vocab = vocabulary_gguf(cache)
        bandwidth = read_bandwidth_in_child(args.threads)
        say(f"read bandwidth on {args.threads} threads: {bandwidth:.1f} GB/s")
        say("RANDOM WEIGHTS at real shapes: the figures are speed only")
        results = []
        for shape_key in shapes:
            for mix in mixes:
                shape = SHAPES[shape_key]
                path = models / f"{shape.name}-{mix}-random.gguf"
                if not path.is_file():
                    say(f"writing {path} ...")
                    write_model(path, shape, mix, vocab)
                say(f"{shape.name} {mix}:")
                setup = Setup(
                    bins,
                    path,
                    args.threads,
                    args.repetitions,
                    shlex.split(args.infer_args),
                    shlex.split(args.llamacpp_args),
                )
                m = measure_model(setup, shape_key, args, say)
                results.append(
                    Result(
                        shape.name,
                        mix,
                        path.stat().st_size / 1e6,
                        decode_bytes(path) / 1e6,
                        m["di"],
                        m["dl"],
                        m["pi"],
                        m["pl"],
                        m["si"],
                        m["sl"],
                        m["rss"],
                        bandwidth,
                    )
                )
    except (BuildError, RunError) as exc:
        print(f"bench_sizes: error: {exc}", file=sys.stderr)
        return 2
    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    if args.json:
        rows = [asdict(r) | {"decode_gbs": r.decode_gbs} for r in results]
        summary = {
            "cpu": cpu,
            "avx2_only": args.avx2_only,
            "threads": args.threads,
            "bandwidth_gbs": bandwidth,
            "results": rows,
        }
        print(json.dumps(summary, indent=1))
    else:
        target = " (AVX2-only: both sides)" if args.avx2_only else ""
        print(
            f"\n{cpu}{target}, {args.threads} threads, read bandwidth {bandwidth:.1f} GB/s; "
            f"decode {args.decode} tokens, prefill {args.prefill}; i/l = infer/llama.cpp, "
            f"medians of {args.rounds} rounds"
        )
        print(render(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
