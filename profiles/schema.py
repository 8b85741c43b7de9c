"""Pydantic models of a profile file: which keys exist, their types, built-in defaults and descriptions.

This module is the one place a setting's type, default and description are written. The settings
resolver (`infer.profiles.settings`) and the CLI flags (`infer.cli.options`) are derived from it.

Range rules for sampler fields are *not* written here: `SamplingParams` (in `infer.engine.sampling`)
owns them, and the resolver builds one eagerly so a bad profile fails at load, not at the first token.
Range rules for engine and speculative fields live here (`ge=`, `Literal[...]`).

"Off" values, one per setting: `threads: 0` = all cores, `ctx_size: 0` = the model's trained context,
`n_predict: -1` = until end of sequence or context (0 is refused; the default is 512),
`model: null` = the embedded default model,
`sampler.seed: null` = a random seed.
"""

from __future__ import annotations

import functools
import operator
import os
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model

from infer.engine.backends import BACKEND_NAMES, KV_CACHE_DTYPES, kernel_modes
from infer.engine.sampling import SamplingParams

REMOTE_BACKEND = "remote"
"""`backend: remote`: not a compute backend but a server that replaces the whole engine (vLLM, SGLang,
llama-server, another `infer serve`), at `server_url`."""
Backend = Literal[(*BACKEND_NAMES, REMOTE_BACKEND)]  # type: ignore[valid-type]  # the registry, plus remote
DType = Literal["float32", "float16", "bfloat16"]
CpuKernels = Literal[kernel_modes("cpu")]  # type: ignore[valid-type]  # the cpu backend's capabilities
KvCacheDtype = Literal[tuple(KV_CACHE_DTYPES)]  # type: ignore[valid-type]  # the engine's one list
SpeculativeMethod = Literal["none", "prompt_lookup", "draft_model"]


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_default=False)


PER_REQUEST_SAMPLER_FIELDS: tuple[str, ...] = ("logit_bias", "logprobs")
"""`SamplingParams` fields that are not profile settings: each API request sets them for itself."""


def _profile_type(annotation: Any) -> Any:
    """A `SamplingParams` input type as a profile holds it: YAML and JSON have lists, not tuples."""
    if get_origin(annotation) is tuple:
        return list[get_args(annotation)[0]]  # type: ignore[misc]
    if get_origin(annotation) in (Union, types.UnionType):
        return functools.reduce(operator.or_, (_profile_type(a) for a in get_args(annotation)))
    return annotation


def _sampler_field(default: Any, description: str) -> Any:
    """A field with `SamplingParams`' default (tuples as fresh lists) and its docstring as description."""
    if isinstance(default, tuple):
        return Field(default_factory=lambda: list(default), description=description)
    return Field(default, description=description)


def _sampler_section() -> type[_Section]:
    """The `sampler:` section, one field per `SamplingParams` field (per-request ones left out), with
    that field's input type, default and docstring, so the two cannot drift."""
    types_, defaults, docs = (
        SamplingParams.field_input_types(),
        SamplingParams.field_defaults(),
        SamplingParams.field_docs(),
    )
    fields: dict[str, Any] = {
        name: (_profile_type(types_[name]), _sampler_field(defaults[name], docs[name]))
        for name in SamplingParams.field_names()
        if name not in PER_REQUEST_SAMPLER_FIELDS
    }
    return create_model(  # type: ignore[call-overload,no-any-return]
        "SamplerSection",
        __base__=_Section,
        __module__=__name__,
        __doc__=(
            "The `sampler:` section: defaults for `SamplingParams`. Types are checked here; ranges, and "
            "the\ndefaults themselves, come from `SamplingParams` (`infer.engine.sampling`)."
        ),
        **fields,
    )


SamplerSection = _sampler_section()
"""The `sampler:` section model, derived from `SamplingParams`' fields (see `_sampler_section`)."""


class SpeculativeSection(_Section):
    """The `speculative:` section: speculative decoding. Types only: the limits' ranges are checked
    once, by the engine's own `check_spec_limits` (what `SpecConfig` runs), when settings resolve."""

    method: SpeculativeMethod = Field(
        "none",
        description="Speculative decoding: none, prompt_lookup (n-grams of prompt + output) or "
        "draft_model (a smaller model with the same tokenizer). Tokens are those of none either way.",
    )
    num_tokens: int = Field(
        5,
        description="Most tokens drafted per step (llama.cpp --draft-max); the length adapts below it.",
    )
    draft_min: int = Field(
        0, description="Drafts shorter than this are dropped, not verified (llama.cpp --draft-min)."
    )
    draft_model: str | None = Field(
        None, description="Draft model path (method draft_model); its tokenizer must be the model's."
    )
    p_min: float = Field(
        0.75,
        description="Draft model: stop drafting when its top-1 probability falls below this "
        "(llama.cpp --draft-p-min).",
    )
    ngram_min: int = Field(1, description="Prompt lookup: shortest n-gram matched.")
    ngram_max: int = Field(3, description="Prompt lookup: longest n-gram matched.")
    adaptive: bool = Field(
        True,
        description="Shrink the draft length after rejections (pausing after repeated misses) and grow "
        "it after full acceptance; false drafts num_tokens every step.",
    )


_MEMORY_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
}


def memory_bytes(value: str) -> int:
    """Bytes of a memory size: `2GiB`, `512MiB`, `1.5GB`, a plain byte count, `0` (no bound), or a
    fraction of the machine's memory below 1 (`0.25`). Raises ValueError naming the accepted forms."""
    import re

    text = str(value).strip()
    match = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B|B)?", text, flags=re.IGNORECASE)
    if match is None:
        raise ValueError(f"{value!r} is not a memory size (e.g. 2GiB, 512MiB, 1.5GB, 0.25 of RAM, or 0)")
    number, unit = float(match.group(1)), (match.group(2) or "").upper()
    if not unit and 0 < number < 1:
        pages, page_size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
        return int(number * pages * page_size)
    return int(number * _MEMORY_UNITS[unit])


def _memory_size(value: str) -> str:
    memory_bytes(value)  # refuse a bad size when the profile or flag is read, not at load
    return str(value)


def _not_zero(n_predict: int) -> int:
    # 0 once meant "no limit" in one layer and "nothing" in another: one off value (-1) is enough.
    if n_predict == 0:
        raise ValueError("0 generates nothing: use -1 for no limit or a number of tokens >= 1")
    return n_predict


class ProfileFile(_Section):
    """One profile YAML file. Every key is optional; what a file leaves out comes from `extends:` or the
    built-in default (the defaults below). The engine limits (`ctx_size` ... `max_queue`) are typed
    here and range-checked once, by the engine's own `EngineConfig`, when settings resolve."""

    extends: str | None = Field(
        None, description="Profile to inherit from: a shipped name or a path relative to this file."
    )
    description: str | None = Field(None, description="One line shown by `infer profiles list`.")

    backend: Backend = Field(
        "cpu",
        description="Compute backend: cpu (numpy), cuda (CuPy) or metal (MLX); or remote: an "
        "OpenAI-compatible server at server_url (vLLM, SGLang, llama-server, infer serve) runs the "
        "requests instead of a local engine.",
    )
    server_url: str | None = Field(
        None,
        description="The server's base URL (http://host:8000) for backend remote; given on its own "
        "(flag --server, env INFER_SERVER_URL) it selects backend remote. null = run locally.",
    )
    api_key_env: str = Field(
        "INFER_API_KEY",
        description="The environment variable that holds the remote server's API key (the key itself "
        "never goes in a file); unset or empty = no key.",
    )
    dtype: DType = Field("float32", description="Compute dtype for weights and activations.")
    threads: int = Field(
        0,
        ge=0,
        description="CPU threads for the matmuls (the numba kernels, or BLAS with cpu_kernels blas); "
        "0 = all cores (with the numba kernels: one fewer per core other processes keep busy, "
        "re-checked as the load changes).",
    )
    cpu_kernels: CpuKernels = Field(
        "int8",
        description="How the cpu backend multiplies by a GGUF matrix: int8 (the default: integer kernels "
        "with activations quantized as llama.cpp does, per 32-block for the legacy types and per 256 for "
        "the K-quants; the fastest mode measured, and batch invariant), exact (numba kernels on the "
        "quantized blocks, float32 accumulation: equal to the transformers float32 reference token for "
        "token) or blas (a float32 copy through BLAS).",
    )
    mmap: bool = Field(
        False,
        description="The cpu backend copies the GGUF's blocks into memory at load (false, the default: "
        "decode at 1B-8B streams every weight byte once a token, and copies on transparent huge pages "
        "read about 1.2x faster than the file's mapped pages; past what free memory holds the rest stays "
        "mapped) or computes on them in the file's memory map (true, llama.cpp's default: RSS only for "
        "the pages read, e.g. the experts a mixture-of-experts model routes to). The GPU backends copy "
        "weights to their device either way.",
    )
    ctx_size: int = Field(4096, description="Context size in tokens; 0 = the model's trained context.")
    batch_size: int = Field(512, description="Prefill chunk: prompt tokens processed per step.")
    max_batched_tokens: int = Field(2048, description="Scheduler: most tokens in one step.")
    max_num_seqs: int = Field(64, description="Scheduler: most sequences running at once.")
    max_queue: int = Field(
        1024,
        description="Requests that may wait for a free sequence at once; one more is refused "
        "(the server answers 503 with Retry-After). 0 = no bound.",
    )
    kv_cache_memory: Annotated[str, AfterValidator(_memory_size)] = Field(
        "0",
        description="KV memory the running sequences (and kept prefixes) may hold: 2GiB, 512MiB, "
        "a fraction of RAM below 1 (0.25), or 0 = no bound. A request waits until its prompt and "
        "token limit fit; one that could never fit is refused.",
    )
    kv_cache_dtype: KvCacheDtype = Field(
        "f32",
        description="How the KV cache stores keys and values: f32 (float32, the reference tests' and "
        "gates' choice) or f16 (IEEE halves, as llama.cpp's default: half the KV memory and half the "
        "bytes attention reads per step, computed in float32; the cpu backend with cpu_kernels exact "
        "or int8 only). A row's tokens stay the same alone or batched either way; f16 and f32 tokens "
        "may differ.",
    )
    prefix_caching: bool = Field(
        False,
        description="Keep finished prompts' whole prefill chunks (batch_size tokens each) in the KV "
        "cache, so a request starting with the same tokens (a shared system prompt, the next turn "
        "of a chat) skips computing them; the tokens are the same with or without it.",
    )
    model: str | None = Field(
        None,
        description="A GGUF file, a safetensors folder, a name `infer models list` shows, "
        "hf://OWNER/REPO or hf://OWNER/REPO/FILE.gguf; null = the default model "
        "(SmolLM2-135M-Instruct, pulled from PyPI).",
    )
    n_predict: Annotated[int, AfterValidator(_not_zero)] = Field(
        512,
        ge=-1,
        description="Most tokens to generate (default 512, as a one-shot answer rarely needs more); "
        "-1 = until end of sequence or the context is full. 0 is refused.",
    )
    # Output constraints (at most one; see infer.profiles.constraints).
    json_schema: str | None = Field(
        None, description="Constrain the output to a JSON schema: a file path, or the schema as JSON text."
    )
    json_object: bool = Field(False, description="Constrain the output to a JSON object (any keys).")
    regex: str | None = Field(None, description="Constrain the output to match this regular expression.")
    grammar: str | None = Field(
        None, description="Constrain the output to a grammar file: llguidance Lark syntax, or GBNF."
    )
    choice: list[str] = Field(
        default_factory=list,
        description="Constrain the output to one of these strings (flag: comma-separated; [] = off).",
    )

    sampler: SamplerSection = Field(default_factory=SamplerSection, description="Sampler defaults.")
    speculative: SpeculativeSection = Field(
        default_factory=SpeculativeSection, description="Speculative decoding."
    )


SECTION_MODELS: dict[str, type[BaseModel]] = {
    "sampler": SamplerSection,
    "speculative": SpeculativeSection,
}
"""Profile sections that are nested mappings, by key."""

META_KEYS: tuple[str, ...] = ("extends", "description")
"""Top-level keys that describe the file rather than set a value."""
