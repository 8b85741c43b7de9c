"""Make the long-prompt oracle for Gemma 3 270M: transformers in float32 on the GGUF dequantized.

A prompt of 1,024+ tokens (longer than the 512-position sliding window) and its greedy 32-token path,
with the top-5 logits at every step. For contrast it also records the greedy path with the window
opened past the prompt (same RoPE bases), which shows the prompt really exercises the window.

Run once, in a throwaway virtual environment (transformers and torch are never project dependencies):

    python3 -m venv /tmp/venv-oracle
    /tmp/venv-oracle/bin/pip install "torch==2.13.0+cpu" transformers accelerate gguf sentencepiece
    /tmp/venv-oracle/bin/python scripts/gemma3_long_oracle.py ~/.cache/infer/models/gemma-3-270m-q4_k_m.gguf \
        tests/reference/gemma3_long_transformers.json

Only the JSON output is committed (tests/reference/gemma3_long_transformers.json).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STEPS = 32
MIN_PROMPT_TOKENS = 1024


def long_prompt() -> str:
    """A deterministic document that runs past the window: a log of numbered facts, then a question
    whose answer sits in the opening lines (outside the last 512 positions)."""
    cities = [
        ("Paris", "France"), ("Berlin", "Germany"), ("Madrid", "Spain"), ("Rome", "Italy"),
        ("Lisbon", "Portugal"), ("Vienna", "Austria"), ("Warsaw", "Poland"), ("Prague", "Czechia"),
        ("Dublin", "Ireland"), ("Oslo", "Norway"), ("Helsinki", "Finland"), ("Athens", "Greece"),
    ]  # fmt: skip
    lines = ["Project log. The secret code word for this project is 'marmalade'. Remember it.", ""]
    entry = 1
    while len(" ".join(lines).split()) < 1000:
        city, country = cities[entry % len(cities)]
        lines.append(
            f"Entry {entry}: the team visited {city}, the capital of {country}, and counted "
            f"{entry * 7 % 101} bridges, {entry * 13 % 37} museums and {entry * 3 % 17} markets."
        )
        entry += 1
    lines += [
        "",
        "Question: what is the secret code word for this project?",
        "Answer: The secret code word is",
    ]
    return "\n".join(lines)


def greedy(model, torch, ids: list[int]) -> tuple[list[int], list[dict[str, list]]]:
    """Greedy STEPS tokens with the top-5 logits at each step (one forward over the whole prefix per
    step would be slower; the KV cache path is transformers' own)."""
    with torch.no_grad():
        out = model(torch.tensor([ids]), use_cache=True)
        past, logits = out.past_key_values, out.logits[0, -1]
        generated, steps = [], []
        for _ in range(STEPS):
            top = torch.topk(logits, 5)
            steps.append(
                {"top_ids": top.indices.tolist(), "top_logits": [round(float(v), 5) for v in top.values]}
            )
            token = int(torch.argmax(logits))
            generated.append(token)
            out = model(torch.tensor([[token]]), past_key_values=past, use_cache=True)
            past, logits = out.past_key_values, out.logits[0, -1]
    return generated, steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("gguf", type=Path)
    parser.add_argument("output", type=Path)
    args = parser.parse_args()

    import torch
    import transformers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    folder, name = str(args.gguf.parent), args.gguf.name
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    model = AutoModelForCausalLM.from_pretrained(
        folder, gguf_file=name, dtype=torch.float32, attn_implementation="eager"
    ).eval()
    text = long_prompt()
    ids = tokenizer(text).input_ids
    if ids[0] != tokenizer.bos_token_id:
        ids = [tokenizer.bos_token_id, *ids]
    assert len(ids) >= MIN_PROMPT_TOKENS, len(ids)
    window = model.config.sliding_window
    assert len(ids) > 2 * window, (len(ids), window)
    greedy_ids, steps = greedy(model, torch, ids)

    # Contrast: the same model with the window opened past the prompt (sliding layers keep their own
    # RoPE base and everything else; only the mask and the sliding cache change).
    model.config.sliding_window = 1 << 20
    for layer in model.model.layers:
        if getattr(layer.self_attn, "sliding_window", None):
            layer.self_attn.sliding_window = 1 << 20
    no_window_ids, _ = greedy(model, torch, ids)

    result = {
        "model": name,
        "source": f"transformers {transformers.__version__} float32 (GGUF dequantized), torch "
        f"{torch.__version__}, eager attention; made by scripts/gemma3_long_oracle.py",
        "sliding_window": window,
        "prompt": text,
        "prompt_ids": ids,
        "greedy_ids": greedy_ids,
        "greedy_text": tokenizer.decode(greedy_ids),
        "steps": steps,
        "greedy_ids_without_window": no_window_ids,
    }
    args.output.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{len(ids)} prompt tokens; greedy: {result['greedy_text']!r}")
    print(f"without the window: {tokenizer.decode(no_window_ids)!r}")


if __name__ == "__main__":
    main()
