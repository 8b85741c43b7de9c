"""infer's engine, through its front door: what the commands, the server and scripts use.

`from infer.engine import Engine, Request, SamplingParams, load_engine, ...`: every name below is
loaded from the module that defines it on first use (PEP 562 `__getattr__`), so importing the package
costs nothing and a command pays only for the parts it touches (`infer --help` loads no engine code).
Callers outside the engine import from here, not from its modules (tests/test_import_direction.py
holds `cli/` to it); the layout behind the door (engine/README.md) may change without them.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, tuple[str, str]] = {
    # running requests
    "Engine": ("runtime.engine", "Engine"),
    "EngineConfig": ("runtime.config", "EngineConfig"),
    "EngineConfigError": ("runtime.config", "EngineConfigError"),
    "load_engine": ("runtime.engine", "load_engine"),
    "Request": ("runtime.request", "Request"),
    "RequestError": ("runtime.request", "RequestError"),
    "EngineBusy": ("runtime.request", "EngineBusy"),
    "FaultHook": ("runtime.request", "FaultHook"),
    "MAX_STOP_STRINGS": ("runtime.request", "MAX_STOP_STRINGS"),
    "MAX_STOP_CHARS": ("runtime.request", "MAX_STOP_CHARS"),
    "RequestStream": ("runtime.stream", "RequestStream"),
    "Completion": ("runtime.stream", "Completion"),
    # events
    "Event": ("runtime.events", "Event"),
    "TokenEvent": ("runtime.events", "TokenEvent"),
    "DoneEvent": ("runtime.events", "DoneEvent"),
    "FinishReason": ("runtime.events", "FinishReason"),
    "Usage": ("runtime.events", "Usage"),
    "Timings": ("runtime.events", "Timings"),
    # sampling
    "SamplingParams": ("sampling", "SamplingParams"),
    "SamplingParamsError": ("sampling", "SamplingParamsError"),
    "FIELD_RANGES": ("sampling.params", "FIELD_RANGES"),
    "LOGIT_BIAS_LIMIT": ("sampling.params", "LOGIT_BIAS_LIMIT"),
    "MAX_SAMPLER_STAGES": ("sampling.list_caps", "MAX_SAMPLER_STAGES"),
    "MAX_DRY_BREAKERS": ("sampling.list_caps", "MAX_DRY_BREAKERS"),
    "MAX_DRY_BREAKER_CHARS": ("sampling.list_caps", "MAX_DRY_BREAKER_CHARS"),
    "DEVICE_POOL_LIMIT": ("sampling.envelope", "POOL_LIMIT"),
    "in_device_envelope": ("sampling.envelope", "in_envelope"),
    # speculative decoding
    "SpecConfig": ("speculative", "SpecConfig"),
    "SpecConfigError": ("speculative", "SpecConfigError"),
    "spec_summary": ("speculative", "summary"),
    "merge_spec_counters": ("speculative", "merge"),
    # output constraints
    "GrammarSpec": ("grammar", "GrammarSpec"),
    "GrammarError": ("grammar", "GrammarError"),
    "audit_tokens": ("grammar", "audit_tokens"),
    # models, tokenizers, prompts
    "load_checkpoint": ("loader", "load_checkpoint"),
    "model_architecture": ("loader", "model_architecture"),
    "ModelLoadError": ("loader", "ModelLoadError"),
    "Tokenizer": ("text.tokenizer", "Tokenizer"),
    "prompt_ids": ("text.prompts", "prompt_ids"),
    "ChatTemplateError": ("text.chat", "ChatTemplateError"),
    "VALID_ROLES": ("text.chat", "VALID_ROLES"),
    "TemplateSandbox": ("text.sandbox", "TemplateSandbox"),
    "chat_template_of": ("text.prompts", "chat_template_of"),
    "template_renders_tools": ("text.prompts", "template_renders_tools"),
    # tool calls
    "CallStreamParser": ("text.tool_calls", "CallStreamParser"),
    "CallSyntax": ("text.tool_calls", "CallSyntax"),
    "ToolCall": ("text.tool_calls", "ToolCall"),
    "TextPiece": ("text.tool_calls", "TextPiece"),
    "TOOL_CALL_PARSERS": ("text.tool_calls", "SYNTAX_NAMES"),
    "GENERIC_TOOL_SYNTAX": ("text.tool_calls", "GENERIC_TOOL_SYNTAX"),
    "syntax_named": ("text.tool_calls", "syntax_named"),
    "syntax_for_template": ("text.tool_calls", "syntax_for_template"),
    "with_generic_tool_prompt": ("text.tool_calls", "with_generic_tool_prompt"),
    "FunctionSchema": ("grammar.tools", "FunctionSchema"),
    "tool_call_grammar": ("grammar.tools", "tool_call_grammar"),
    # reasoning blocks
    "REASONING_PARSERS": ("text.reasoning", "REASONING_PARSERS"),
    "ReasoningSplitter": ("text.reasoning", "ReasoningSplitter"),
    "ReasoningPiece": ("text.reasoning", "ReasoningPiece"),
    "ContentPiece": ("text.reasoning", "ContentPiece"),
    "ThinkingStart": ("text.reasoning", "ThinkingStart"),
    "THINK_MARKERS": ("text.reasoning", "THINK_MARKERS"),
    "THINK_CLOSE": ("text.reasoning", "THINK_CLOSE"),
    "splits_reasoning": ("text.reasoning", "splits_reasoning"),
    "thinking_start": ("text.reasoning", "thinking_start"),
    # the backend choice and what a backend sets up
    "BACKEND_CLASSES": ("backends", "BACKEND_CLASSES"),
    "BACKEND_NAMES": ("backends", "BACKEND_NAMES"),
    "BackendError": ("backends", "BackendError"),
    "KVCacheDtypeError": ("backends.kv_cache", "KVCacheDtypeError"),
    "BackendOptions": ("backends", "BackendOptions"),
    "kernel_modes": ("backends", "kernel_modes"),
    "prepare_process": ("backends", "prepare_process"),
    "threads_note": ("backends", "threads_note"),
    "threads_warning": ("backends", "threads_warning"),
    "watch_compiles": ("backends", "watch_compiles"),
    "BackendChoice": ("backends.probe", "BackendChoice"),
    "probe_backend": ("backends.probe", "probe_backend"),
    "select_backend": ("backends.probe", "select_backend"),
    "fallback_notice": ("backends.probe", "fallback_notice"),
    "with_dtype": ("backends.probe", "with_dtype"),
    "dtype_note": ("backends.probe", "dtype_note"),
}
"""Each exported name: (module under infer.engine, its name there)."""

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    """Load an exported name from its module on first use (then it is a plain attribute)."""
    try:
        module, attribute = _EXPORTS[name]
    except KeyError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
    value = getattr(importlib.import_module(f"{__name__}.{module}"), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
