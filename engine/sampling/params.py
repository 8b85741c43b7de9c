"""Sampling parameters: validated eagerly, with llama.cpp's names, defaults and "off" values.

Re-exported by :mod:`infer.engine.sampling`; import from there.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import itertools
import math
import re
import secrets
import textwrap
import typing
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np


class SamplingParamsError(ValueError):
    """A sampling parameter is invalid; ``parameter`` names the field, ``value`` is what was given."""

    def __init__(self, parameter: str, value: Any, message: str) -> None:
        super().__init__(message)
        self.parameter = parameter
        self.value = value


class NoFiniteLogitsError(RuntimeError):
    """No token can be drawn: the model gave NaN/+inf logits, or every allowed token is at -inf."""


SAMPLER_STAGES: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
"""Stage names accepted in ``samplers`` (llama.cpp's canonical names)."""

DEFAULT_SAMPLERS: tuple[str, ...] = (
    "penalties",
    "dry",
    "top_n_sigma",
    "top_k",
    "typ_p",
    "top_p",
    "min_p",
    "xtc",
    "temperature",
)
"""llama.cpp's default sampler order (``common_params_sampling::samplers``)."""

_STAGE_LETTERS = {
    "e": "penalties",
    "d": "dry",
    "s": "top_n_sigma",
    "k": "top_k",
    "y": "typ_p",
    "p": "top_p",
    "m": "min_p",
    "x": "xtc",
    "t": "temperature",
}
_STAGE_ALIASES = {
    "top-k": "top_k",
    "top-p": "top_p",
    "nucleus": "top_p",
    "top-n-sigma": "top_n_sigma",
    "typical": "typ_p",
    "typical-p": "typ_p",
    "typical_p": "typ_p",
    "typ-p": "typ_p",
    "typ": "typ_p",
    "min-p": "min_p",
    "temp": "temperature",
}

_SEED_LIMIT = 1 << 64


class FrozenLogitBias(Mapping[int, float]):
    """An immutable, hashable ``{token_id: bias}`` mapping (iterates in token-id order)."""

    __slots__ = ("_items",)

    def __init__(self, items: Sequence[tuple[int, float]] = ()) -> None:
        self._items = tuple(sorted(items))

    def __getitem__(self, key: int) -> float:
        for tok, bias in self._items:
            if tok == key:
                return bias
        raise KeyError(key)

    def __iter__(self) -> Iterator[int]:
        return (tok for tok, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(self._items)

    def __repr__(self) -> str:
        return f"FrozenLogitBias({dict(self._items)!r})"


def _err(name: str, value: Any, message: str) -> SamplingParamsError:
    return SamplingParamsError(name, value, f"{name} {message}, got {value!r}.")


def _as_float(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise _err(name, value, "must be a number")
    v = float(value)
    if not math.isfinite(v):
        raise _err(name, value, "must be a finite number")
    return v


def _as_int(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise _err(name, value, "must be an integer")
    if isinstance(value, (int, np.integer)):
        return int(value)
    if isinstance(value, (float, np.floating)) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    raise _err(name, value, "must be an integer")


def _in_range(name: str, v: float, lo: float, hi: float, lo_open: bool, hi_open: bool) -> None:
    bad = (v <= lo if lo_open else v < lo) or (v >= hi if hi_open else v > hi)
    if bad:
        lo_s = "-inf" if lo == -math.inf else f"{lo:g}"
        hi_s = "inf" if hi == math.inf else f"{hi:g}"
        interval = f"{'(' if lo_open else '['}{lo_s}, {hi_s}{')' if hi_open else ']'}"
        raise _err(name, v, f"must be in {interval}")


def _parse_samplers(value: Any) -> tuple[str, ...]:
    name = "samplers"
    if isinstance(value, str):
        parts = [p for p in re.split(r"[;,\s]+", value.strip()) if p]
        if len(parts) == 1 and parts[0].lower() not in SAMPLER_STAGES + tuple(_STAGE_ALIASES):
            word = parts[0]
            if all(ch in _STAGE_LETTERS for ch in word):
                return tuple(_STAGE_LETTERS[ch] for ch in word)
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise _err(name, value, "must be a list of stage names or a ';'-separated string")
    out = []
    for part in parts:
        if not isinstance(part, str):
            raise _err(name, value, f"must contain stage names (one of {', '.join(SAMPLER_STAGES)})")
        key = part.strip().lower()
        key = _STAGE_ALIASES.get(key, key)
        if key not in SAMPLER_STAGES:
            raise SamplingParamsError(
                name,
                value,
                f"samplers has unknown stage {part!r} (allowed: {', '.join(SAMPLER_STAGES)}), got {value!r}.",
            )
        out.append(key)
    return tuple(out)


def _parse_logit_bias(value: Any) -> FrozenLogitBias:
    name = "logit_bias"
    if value is None:
        return FrozenLogitBias()
    if isinstance(value, FrozenLogitBias):
        return value
    if isinstance(value, Mapping):
        pairs = list(value.items())
    elif isinstance(value, (list, tuple)):
        pairs = list(value)
    else:
        raise _err(name, value, "must be a mapping {token_id: bias} or a list of [token_id, bias] pairs")
    seen: dict[int, float] = {}
    for pair in pairs:
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _err(name, value, "entries must be [token_id, bias] pairs")
        tok, bias = pair
        if isinstance(tok, str) and tok.strip().isdigit():
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or int(tok) < 0:
            raise _err(name, value, f"token ids must be integers >= 0 (bad key {tok!r})")
        tok = int(tok)
        if isinstance(bias, bool) or not isinstance(bias, (int, float, np.integer, np.floating)):
            raise _err(name, value, f"biases must be numbers (bad bias for token {tok})")
        b = float(bias)
        if math.isnan(b) or b == math.inf:
            raise _err(name, value, f"biases must be finite or -inf (bad bias for token {tok})")
        if tok in seen:
            raise _err(name, value, f"lists token {tok} more than once")
        seen[tok] = b
    return FrozenLogitBias(tuple(seen.items()))


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling settings for one request (llama.cpp names, defaults and "off" values).

    Construction normalises and validates every field eagerly; a bad field raises
    :class:`SamplingParamsError` naming the field, the value and the allowed range. NaN and +-inf are
    rejected in every float field (``-inf`` is allowed only as a ``logit_bias`` value, where it bans
    the token). Each field's "off" value is given in its docstring; there is exactly one.
    """

    temperature: float = 0.8
    """Softmax temperature. ``0`` = greedy argmax (off); values < 0 are normalised to 0."""
    top_k: int = 40
    """Keep the k most likely tokens. ``0`` = off; values <= 0 normalise to 0; k >= vocab is a no-op."""
    top_p: float = 0.95
    """Nucleus sampling mass in (0, 1]. ``1.0`` = off."""
    min_p: float = 0.05
    """Keep tokens with p >= min_p * p_max, in [0, 1]. ``0.0`` = off; 1.0 keeps the argmax and ties."""
    typical_p: float = 1.0
    """Locally typical sampling mass in (0, 1]. ``1.0`` = off."""
    top_n_sigma: float = -1.0
    """Keep logits >= max - n * std(logits). ``-1.0`` = off; values <= 0 normalise to -1."""
    repeat_penalty: float = 1.0
    """Repetition penalty (> 0) on tokens in the last ``repeat_last_n``. ``1.0`` = off."""
    repeat_last_n: int = 64
    """Window (tokens, prompt included) for the three penalties. ``0`` = off; ``-1`` = whole history."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token in the window, in [-2, 2] as OpenAI allows
    (negative encourages repetition). ``0.0`` = off."""
    frequency_penalty: float = 0.0
    """Subtracted count-times from the logit of every token in the window, in [-2, 2] as OpenAI
    allows. ``0.0`` = off."""
    logit_bias: Mapping[int, float] = field(default_factory=FrozenLogitBias)
    """``{token_id: bias}`` added to the raw logits; ``-inf`` bans. A list of pairs is accepted;
    a token listed twice is an error. Stored as an immutable :class:`FrozenLogitBias`. ``{}`` = off."""
    xtc_probability: float = 0.0
    """Chance in [0, 1] that XTC removes the top choices at a step. ``0.0`` = off."""
    xtc_threshold: float = 0.1
    """XTC probability threshold in [0, 1]; values > 0.5 make XTC a no-op (as llama.cpp)."""
    dry_multiplier: float = 0.0
    """DRY penalty multiplier, >= 0. ``0.0`` = off."""
    dry_base: float = 1.75
    """DRY exponential base, >= 1."""
    dry_allowed_length: int = 2
    """Repetitions longer than this (>= 1 tokens) are penalised by DRY."""
    dry_penalty_last_n: int = -1
    """DRY scan window in tokens (prompt included). ``-1`` = whole history; ``0`` = off."""
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    """Strings that end a repetition for DRY: a token whose text contains one is a breaker."""
    mirostat: int = 0
    """Mirostat version: ``0`` = off, 1 or 2. When on, ``samplers`` is ignored (as llama.cpp)."""
    mirostat_tau: float = 5.0
    """Mirostat target surprise (bits), >= 0."""
    mirostat_eta: float = 0.1
    """Mirostat learning rate, >= 0."""
    dynatemp_range: float = 0.0
    """Dynamic temperature range (>= 0): t in [temperature - range, temperature + range], clamped at
    0; applies only when temperature > 0 (temperature 0 stays greedy). ``0.0`` = off."""
    dynatemp_exponent: float = 1.0
    """Dynamic temperature exponent on the normalised entropy, >= 0."""
    min_keep: int = 0
    """Minimum candidates kept by top_p, min_p, typ_p and xtc (>= 0). ``0`` = off (at least 1 anyway)."""
    seed: int | None = None
    """Seed in [0, 2**64). ``None`` = fresh random seed (:func:`resolve_seed`); -1 normalises to None."""
    n_probs: int = 0
    """How many top alternatives (token, logprob) to report per token, >= 0. ``0`` = off."""
    logprobs: bool = False
    """Report each sampled token's log-probability; ``n_probs`` > 0 implies it. Off by default, as in
    vLLM and llama.cpp: it costs a log-softmax over the whole vocabulary per token."""
    samplers: tuple[str, ...] = field(default=DEFAULT_SAMPLERS, metadata={"also_accepts": str})
    """Stage order: names from :data:`SAMPLER_STAGES`, a list or a ';'-separated string, or
    llama.cpp letters ("edskypmxt"). Repeats apply again; omitted stages are skipped."""

    def __post_init__(self) -> None:
        put = object.__setattr__
        floats = {f.name for f in dataclasses.fields(self) if f.type == "float"}
        for name in floats:
            put(self, name, _as_float(name, getattr(self, name)))
        for name in ("top_k", "repeat_last_n", "dry_allowed_length", "dry_penalty_last_n"):
            put(self, name, _as_int(name, getattr(self, name)))
        for name in ("mirostat", "min_keep", "n_probs"):
            put(self, name, _as_int(name, getattr(self, name)))
        if not isinstance(self.logprobs, bool):
            raise SamplingParamsError(
                "logprobs", self.logprobs, f"logprobs must be true or false, got {self.logprobs!r}."
            )
        put(self, "logprobs", self.logprobs or self.n_probs > 0)

        put(self, "temperature", max(self.temperature, 0.0))
        put(self, "top_k", max(self.top_k, 0))
        _in_range("top_p", self.top_p, 0.0, 1.0, True, False)
        _in_range("min_p", self.min_p, 0.0, 1.0, False, False)
        _in_range("typical_p", self.typical_p, 0.0, 1.0, True, False)
        if self.top_n_sigma <= 0.0:
            put(self, "top_n_sigma", -1.0)
        _in_range("repeat_penalty", self.repeat_penalty, 0.0, math.inf, True, True)
        _in_range("repeat_last_n", self.repeat_last_n, -1, math.inf, False, True)
        _in_range("presence_penalty", self.presence_penalty, -2.0, 2.0, False, False)
        _in_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0, False, False)
        put(self, "logit_bias", _parse_logit_bias(self.logit_bias))
        _in_range("xtc_probability", self.xtc_probability, 0.0, 1.0, False, False)
        _in_range("xtc_threshold", self.xtc_threshold, 0.0, 1.0, False, False)
        _in_range("dry_multiplier", self.dry_multiplier, 0.0, math.inf, False, True)
        _in_range("dry_base", self.dry_base, 1.0, math.inf, False, True)
        _in_range("dry_allowed_length", self.dry_allowed_length, 1, math.inf, False, True)
        _in_range("dry_penalty_last_n", self.dry_penalty_last_n, -1, math.inf, False, True)
        breakers = self.dry_sequence_breakers
        if not isinstance(breakers, (list, tuple)) or not all(isinstance(b, str) and b for b in breakers):
            raise _err("dry_sequence_breakers", breakers, "must be a list of non-empty strings")
        put(self, "dry_sequence_breakers", tuple(breakers))
        if self.mirostat not in (0, 1, 2):
            raise _err("mirostat", self.mirostat, "must be 0 (off), 1 or 2")
        _in_range("mirostat_tau", self.mirostat_tau, 0.0, math.inf, False, True)
        _in_range("mirostat_eta", self.mirostat_eta, 0.0, math.inf, False, True)
        _in_range("dynatemp_range", self.dynatemp_range, 0.0, math.inf, False, True)
        _in_range("dynatemp_exponent", self.dynatemp_exponent, 0.0, math.inf, False, True)
        _in_range("min_keep", self.min_keep, 0, math.inf, False, True)
        _in_range("n_probs", self.n_probs, 0, math.inf, False, True)
        if self.seed is not None:
            seed = _as_int("seed", self.seed)
            if seed == -1:
                put(self, "seed", None)
            else:
                if not 0 <= seed < _SEED_LIMIT:
                    raise _err("seed", self.seed, "must be in [0, 2**64) or None (random)")
                put(self, "seed", seed)
        put(self, "samplers", _parse_samplers(self.samplers))

    @property
    def is_greedy(self) -> bool:
        """True when sampling is a deterministic argmax (``temperature <= 0``)."""
        return self.temperature <= 0.0

    @property
    def is_plain_greedy(self) -> bool:
        """True when the token is the argmax of the raw logits: greedy with no logit_bias, no active
        penalties or DRY, no mirostat state and no logprobs to report. The engine takes such rows'
        argmax for the whole batch at once."""
        return (
            self.is_greedy
            and not self.logit_bias
            and not self.penalties_active
            and not self.dry_active
            and self.mirostat == 0
            and not self.logprobs
        )

    @property
    def penalties_active(self) -> bool:
        """Whether the repetition/frequency/presence penalties change any logit."""
        return self.repeat_last_n != 0 and (
            self.repeat_penalty != 1.0 or self.frequency_penalty != 0.0 or self.presence_penalty != 0.0
        )

    @property
    def dry_active(self) -> bool:
        """Whether DRY changes any logit."""
        return self.dry_multiplier > 0.0 and self.dry_penalty_last_n != 0

    def replace(self, **changes: Any) -> SamplingParams:
        """A validated copy with ``changes`` applied."""
        names = set(self.field_names())
        for key in changes:
            if key not in names:
                raise SamplingParamsError(key, changes[key], f"{key} is not a sampling parameter.")
        return dataclasses.replace(self, **changes)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """All field names, in declaration order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def field_input_types(cls) -> dict[str, Any]:
        """Each field's type as a caller may give it: its annotation (``tuple[str, ...]`` and all),
        widened by what the field also parses (``samplers`` also takes one ';'-separated string).
        The profile schema and the API body are derived from this."""
        hints = typing.get_type_hints(cls)
        types: dict[str, Any] = {}
        for spec in dataclasses.fields(cls):
            extra = spec.metadata.get("also_accepts")
            types[spec.name] = hints[spec.name] if extra is None else hints[spec.name] | extra
        return types

    @classmethod
    def field_defaults(cls) -> dict[str, Any]:
        """Each field's default value (a fresh one for fields with a default factory)."""
        return {
            spec.name: spec.default if spec.default is not dataclasses.MISSING else spec.default_factory()
            for spec in dataclasses.fields(cls)
        }

    @classmethod
    def field_docs(cls) -> dict[str, str]:
        """Each field's docstring, as one line of plain text: the single description that profiles,
        ``--help`` and the API schema show."""
        return dict(_field_docs(cls))

    def check_vocab(self, vocab_size: int) -> None:
        """Raise :class:`SamplingParamsError` if ``logit_bias`` names a token outside the vocabulary."""
        bad = [t for t in self.logit_bias if t >= vocab_size]
        if bad:
            raise SamplingParamsError(
                "logit_bias",
                dict(self.logit_bias),
                f"logit_bias token ids must be < vocab size {vocab_size}, got {bad[:5]}.",
            )


def resolve_seed(seed: int | None) -> int:
    """``seed`` itself, or for ``None`` a fresh random 63-bit seed to report back for reruns."""
    if seed is None:
        return secrets.randbits(63)
    return int(seed)


@functools.cache
def _field_docs(cls: type) -> tuple[tuple[str, str], ...]:
    """(field, docstring) pairs read from the class source: the string literal under each field."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs = []
    for node, after in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(after, ast.Expr)
            and isinstance(after.value, ast.Constant)
            and isinstance(after.value.value, str)
        ):
            text = " ".join(after.value.value.replace("``", "").split())
            docs.append((node.target.id, text.replace(":class:", "")))
    return tuple(docs)
