"""Every setting's command-line spellings, one literal line each: `grep -- --temp` finds where a flag
is defined, as llama.cpp's `add_opt` lines do.

The first spelling is the canonical one that provenance shows (`flag --temp`); the rest are aliases
(llama.cpp's names and short flags). Every other layer derives a setting's names from its flat name:
the env twin `INFER_<NAME>`, the profile key and the API field. `infer.profiles.settings` refuses a
setting without a line here, or a line for no setting, when it builds its table; a bool setting also
gets `--no-...` (the Typer option is built in `infer.cli.options`).
"""

from __future__ import annotations

FLAGS: dict[str, tuple[str, ...]] = {
    # this run
    "profile": ("--profile",),
    "strict_backend": ("--strict-backend",),
    # engine (the profile's top-level keys)
    "backend": ("--backend",),
    "server_url": ("--server", "--server-url"),
    "api_key_env": ("--api-key-env",),
    "dtype": ("--dtype",),
    "threads": ("--threads", "-t"),
    "cpu_kernels": ("--cpu-kernels",),
    "mmap": ("--mmap",),
    "ctx_size": ("--ctx-size", "-c"),
    "batch_size": ("--batch-size", "-b"),
    "max_batched_tokens": ("--max-batched-tokens",),
    "max_num_seqs": ("--max-num-seqs",),
    "max_queue": ("--max-queue",),
    "kv_cache_memory": ("--kv-cache-memory",),
    "kv_cache_dtype": ("--kv-cache-dtype",),
    "prefix_caching": ("--prefix-caching",),
    "model": ("--model", "-m"),
    "n_predict": ("--n-predict", "-n", "--max-tokens"),  # --max-tokens: the OpenAI and mlx-lm spelling
    "json_schema": ("--json-schema",),
    "json_object": ("--json-object",),
    "regex": ("--regex",),
    "grammar": ("--grammar",),
    "choice": ("--choice",),
    # sampler (`sampler.*`, `SamplingParams` fields)
    "temperature": ("--temp", "--temperature"),
    "top_k": ("--top-k",),
    "top_p": ("--top-p",),
    "min_p": ("--min-p",),
    "typical_p": ("--typical", "--typical-p"),
    "top_n_sigma": ("--top-n-sigma",),
    "repeat_penalty": ("--repeat-penalty",),
    "repeat_last_n": ("--repeat-last-n",),
    "presence_penalty": ("--presence-penalty",),
    "frequency_penalty": ("--frequency-penalty",),
    "xtc_probability": ("--xtc-probability",),
    "xtc_threshold": ("--xtc-threshold",),
    "dry_multiplier": ("--dry-multiplier",),
    "dry_base": ("--dry-base",),
    "dry_allowed_length": ("--dry-allowed-length",),
    "dry_penalty_last_n": ("--dry-penalty-last-n",),
    "dry_sequence_breakers": ("--dry-sequence-breakers",),
    "mirostat": ("--mirostat",),
    "mirostat_tau": ("--mirostat-ent", "--mirostat-tau"),
    "mirostat_eta": ("--mirostat-lr", "--mirostat-eta"),
    "dynatemp_range": ("--dynatemp-range",),
    "dynatemp_exponent": ("--dynatemp-exponent",),
    "min_keep": ("--min-keep",),
    "seed": ("--seed",),
    "n_probs": ("--n-probs",),
    "samplers": ("--samplers",),
    # speculative decoding (`speculative.*`)
    "spec_method": ("--spec-method",),
    "spec_num_tokens": ("--spec-num-tokens", "--draft-max"),
    "spec_draft_min": ("--spec-draft-min", "--draft-min"),
    "spec_draft_model": ("--spec-draft-model", "--draft-model", "--model-draft", "-md"),
    "spec_p_min": ("--spec-p-min", "--draft-p-min"),
    "spec_ngram_min": ("--spec-ngram-min",),
    "spec_ngram_max": ("--spec-ngram-max",),
    "spec_adaptive": ("--spec-adaptive",),
}
"""Setting name -> its flags, canonical first."""
