"""Write a model with the default model's shapes from seeded random weights (nothing is downloaded).

Usage: python scripts/gpu_synthetic.py FOLDER [--seed 0] [--layers 30]
SmolLM2-135M's shapes: vocab 49152, hidden 576, intermediate 1536, 30 layers, 9 heads, 3 KV heads,
tied embeddings; matrices Q4_1 and the embedding Q8_0, as in the default GGUF. Writes FOLDER/model.gguf
and FOLDER/hf (config.json, tokenizer, float32 safetensors holding the GGUF's weights dequantized, so
transformers and infer compute the same model). Used by scripts/gpu_check.sh on a lent GPU, which can
neither download the default model nor carry it (64 MiB limit).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

DEFAULT_SHAPES = {
    "vocab": 49152,
    "hidden": 576,
    "intermediate": 1536,
    "layers": 30,
    "heads": 9,
    "kv_heads": 3,
}
"""The default model's (SmolLM2-135M-Instruct) shapes."""


def main() -> None:
    """Write the model and print its paths."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--layers", type=int, default=DEFAULT_SHAPES["layers"])
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from synthetic import write_tiny_model

    started = time.perf_counter()
    shapes = {**DEFAULT_SHAPES, "layers": args.layers}
    model = write_tiny_model(
        args.folder,
        quant="Q4_1",
        tensor_quants={"token_embd.weight": "Q8_0"},
        seed=args.seed,
        context_length=8192,
        **shapes,
    )
    print(f"wrote {model.gguf_path} and {model.hf_dir} in {time.perf_counter() - started:.1f} s ({shapes})")


if __name__ == "__main__":
    main()
