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

from infer.engine.sampling.field_text import parse_text
from infer.engine.sampling.list_caps import (
    MAX_SAMPLER_STAGES,
    SamplingParamsError,
    parse_breakers,
    too_many,
)


class NoFiniteLogitsError(RuntimeError):
    """No token can be drawn: the model gave NaN/+inf logits, or every allowed token is at -inf, or a
    stage's arithmetic left no finite logit. ``parameter`` names the setting responsible, when one is
    (``logit_bias``, ``repeat_penalty``, ``temperature``, ...); None for the model's own logits."""

    def __init__(self, message: str, parameter: str | None = None) -> None:
        super().__init__(message)
        self.parameter = parameter


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

MIN_TEMPERATURE = 1e-5
"""The smallest temperature that samples; a temperature below it is greedy (normalised to 0), as
vLLM's ``_SAMPLING_EPS``. Dividing the logits by less could overflow float32, and the distribution
it describes is the argmax anyway."""

LOGIT_BIAS_LIMIT = 1e4
"""A finite ``logit_bias`` value must lie in [-1e4, 1e4] (``-inf`` bans a token); a bias beyond it is
refused rather than clamped. 1e4 already outweighs any logit a model produces, and keeps
``logit + bias`` far from float32 overflow."""

MAX_LOGIT_BIAS_ENTRIES = 1 << 18
"""The most ``logit_bias`` entries one request may give (262,144: the largest vocabulary of the supported
families). A request's entries are also bounded by its model's vocabulary (ids are unique and < vocab)."""


@dataclass(frozen=True)
class Interval:
    """The accepted range of a numeric field; ``lo_open``/``hi_open`` exclude the end."""

    lo: float
    hi: float
    lo_open: bool = False
    hi_open: bool = False

    def __contains__(self, v: float) -> bool:
        return not (
            (v <= self.lo if self.lo_open else v < self.lo) or (v >= self.hi if self.hi_open else v > self.hi)
        )

    def __str__(self) -> str:
        lo_s, hi_s = _number(self.lo), _number(self.hi)
        return f"{'(' if self.lo_open else '['}{lo_s}, {hi_s}{')' if self.hi_open else ']'}"


def _number(v: float) -> str:
    """``1e-06`` -> ``1e-6``, ``10000.0`` -> ``10000``, ``inf`` -> ``inf``."""
    return re.sub(r"e([+-])0*(\d)", lambda m: f"e{'-' if m.group(1) == '-' else ''}{m.group(2)}", f"{v:g}")


_UP = math.inf
FIELD_RANGES: dict[str, Interval] = {
    # Float fields: chosen so that the chain's arithmetic on float32 logits never yields NaN or +inf
    # (a penalty may still push a logit to -inf, which bans the token). Fields normalised before the
    # check (temperature < 0 -> 0, top_n_sigma <= 0 -> -1) are checked after normalising.
    "temperature": Interval(0.0, 1e4),
    "top_p": Interval(0.0, 1.0, lo_open=True),
    "min_p": Interval(0.0, 1.0),
    "typical_p": Interval(0.0, 1.0, lo_open=True),
    "repeat_penalty": Interval(1e-6, 1e6),
    "presence_penalty": Interval(-2.0, 2.0),
    "frequency_penalty": Interval(-2.0, 2.0),
    "xtc_probability": Interval(0.0, 1.0),
    "xtc_threshold": Interval(0.0, 1.0),
    "dry_multiplier": Interval(0.0, 1e4),
    "dry_base": Interval(1.0, _UP, hi_open=True),
    "mirostat_tau": Interval(0.0, 1e4),
    "mirostat_eta": Interval(0.0, 1e4),
    "dynatemp_range": Interval(0.0, 1e4),
    "dynatemp_exponent": Interval(0.0, 1e4),
    # integer fields
    "repeat_last_n": Interval(-1, _UP, hi_open=True),
    "dry_allowed_length": Interval(1, _UP, hi_open=True),
    "dry_penalty_last_n": Interval(-1, _UP, hi_open=True),
    "min_keep": Interval(0, _UP, hi_open=True),
    "n_probs": Interval(0, _UP, hi_open=True),
}
"""The accepted range of each bounded numeric field (after normalisation); the API schema's
``minimum``/``maximum`` come from here."""


class FrozenLogitBias(Mapping[int, float]):
    """An immutable, hashable ``{token_id: bias}`` mapping (iterates in token-id order).

    Held as two read-only arrays, :attr:`ids` (int64, ascending) and :attr:`biases` (float64), so the
    sampler adds every bias in one vectorised step and a lookup is a binary search.
    """

    __slots__ = ("_biases", "_ids")

    def __init__(self, items: Sequence[tuple[int, float]] = ()) -> None:
        pairs = sorted(items)
        ids = np.fromiter((int(t) for t, _ in pairs), dtype=np.int64, count=len(pairs))
        biases = np.fromiter((float(b) for _, b in pairs), dtype=np.float64, count=len(pairs))
        self._init(ids, biases)

    def _init(self, ids: np.ndarray, biases: np.ndarray) -> None:
        ids.flags.writeable = False
        biases.flags.writeable = False
        self._ids = ids
        self._biases = biases

    @classmethod
    def from_arrays(cls, ids: np.ndarray, biases: np.ndarray) -> FrozenLogitBias:
        """From unique token ids and their biases (any order); the arrays are copied."""
        order = np.argsort(ids, kind="stable")
        out = cls.__new__(cls)
        out._init(np.asarray(ids, dtype=np.int64)[order], np.asarray(biases, dtype=np.float64)[order])
        return out

    @property
    def ids(self) -> np.ndarray:
        """Token ids, ascending (read-only int64)."""
        return self._ids

    @property
    def biases(self) -> np.ndarray:
        """The bias of each of :attr:`ids` (read-only float64)."""
        return self._biases

    def __getitem__(self, key: int) -> float:
        i = int(np.searchsorted(self._ids, key)) if isinstance(key, (int, np.integer)) else -1
        if 0 <= i < self._ids.shape[0] and self._ids[i] == key:
            return float(self._biases[i])
        raise KeyError(key)

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids.tolist())

    def __len__(self) -> int:
        return int(self._ids.shape[0])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, FrozenLogitBias):
            return np.array_equal(self._ids, other._ids) and np.array_equal(self._biases, other._biases)
        return Mapping.__eq__(self, other)

    def __hash__(self) -> int:
        return hash((self._ids.tobytes(), self._biases.tobytes()))

    def __repr__(self) -> str:
        return f"FrozenLogitBias({dict(zip(self._ids.tolist(), self._biases.tolist(), strict=True))!r})"


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


def _in_range(name: str, v: float) -> None:
    interval = FIELD_RANGES[name]
    if v not in interval:
        raise _err(name, v, f"must be in {interval}")


def _parse_samplers(value: Any) -> tuple[str, ...]:
    name = "samplers"
    if isinstance(value, (list, tuple)) and len(value) > MAX_SAMPLER_STAGES:
        raise too_many(name, len(value), MAX_SAMPLER_STAGES, "stages")
    if isinstance(value, str) and len(value) > 16 * MAX_SAMPLER_STAGES:  # longer than 32 names
        raise SamplingParamsError(
            name, f"<{len(value)} characters>", f"samplers is {len(value)} characters long; at most "
            f"{MAX_SAMPLER_STAGES} stages are accepted."
        )  # fmt: skip
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
    if len(out) > MAX_SAMPLER_STAGES:
        raise too_many(name, len(out), MAX_SAMPLER_STAGES, "stages")
    return tuple(out)


def _parse_logit_bias(value: Any) -> FrozenLogitBias:
    """Linear in the entries: one pass to check them, then arrays (no per-entry lookups)."""
    name = "logit_bias"
    if value is None:
        return FrozenLogitBias()
    if isinstance(value, FrozenLogitBias):
        return value
    if isinstance(value, Mapping):
        n = len(value)
        pairs: Any = value.items()
    elif isinstance(value, (list, tuple)):
        n = len(value)
        pairs = value
    else:
        raise _err(name, value, "must be a mapping {token_id: bias} or a list of [token_id, bias] pairs")
    if n > MAX_LOGIT_BIAS_ENTRIES:
        raise SamplingParamsError(
            name,
            f"<{n} entries>",
            f"logit_bias has {n} entries; at most {MAX_LOGIT_BIAS_ENTRIES} are accepted.",
        )
    ids = np.empty(n, dtype=np.int64)
    biases = np.empty(n, dtype=np.float64)
    for i, pair in enumerate(pairs):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise _err(name, value, "entries must be [token_id, bias] pairs")
        tok, bias = pair
        if isinstance(tok, str) and tok.strip().isdigit() and len(tok) < 20:
            tok = int(tok)
        if isinstance(tok, bool) or not isinstance(tok, (int, np.integer)) or not 0 <= int(tok) < 1 << 62:
            raise _err(name, value, f"token ids must be integers >= 0 (bad key {tok!r})")
        if isinstance(bias, bool) or not isinstance(bias, (int, float, np.integer, np.floating)):
            raise _err(name, value, f"biases must be numbers (bad bias for token {tok})")
        b = float(bias)
        if b != -math.inf and not -LOGIT_BIAS_LIMIT <= b <= LOGIT_BIAS_LIMIT:
            raise SamplingParamsError(
                name,
                _shown(value),
                f"logit_bias values must be in [-{LOGIT_BIAS_LIMIT:g}, {LOGIT_BIAS_LIMIT:g}] or -inf "
                f"(which bans the token), got {bias!r} for token {tok}.",
            )
        ids[i] = int(tok)
        biases[i] = b
    unique, counts = np.unique(ids, return_counts=True)
    if unique.shape[0] != n:
        raise _err(name, _shown(value), f"lists token {int(unique[np.argmax(counts > 1)])} more than once")
    return FrozenLogitBias.from_arrays(ids, biases)


def _shown(value: Any) -> Any:
    """``value`` itself, or a short stand-in for a large one (an error message repeats it)."""
    return value if len(value) <= 8 else f"<{len(value)} entries>"


@dataclass(frozen=True)
class SamplingParams:
    """Validated sampling settings for one request (llama.cpp names, defaults and "off" values).

    Construction normalises and validates every field eagerly; a bad field raises
    :class:`SamplingParamsError` naming the field, the value and the allowed range. NaN and +-inf are
    rejected in every float field (``-inf`` is allowed only as a ``logit_bias`` value, where it bans
    the token). Each float field's range (:data:`FIELD_RANGES`) keeps the chain's float32 arithmetic
    free of NaN and +inf for the logits models produce (a stage that still overflows, on logits near
    float32's limit, ends the step with :class:`NoFiniteLogitsError` naming its setting). Each field's
    "off" value is given in its docstring; there is exactly one.
    """

    temperature: float = 0.8
    """Softmax temperature, at most 1e4. ``0`` = greedy argmax (off); values below 1e-5 (negative ones
    too) are normalised to 0."""
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
    """Repetition penalty in [1e-6, 1e6] on tokens in the last ``repeat_last_n``. ``1.0`` = off."""
    repeat_last_n: int = 64
    """Window (tokens, prompt included) for the three penalties. ``0`` = off; ``-1`` = whole history."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of every token in the window, in [-2, 2] as OpenAI allows
    (negative encourages repetition). ``0.0`` = off."""
    frequency_penalty: float = 0.0
    """Subtracted count-times from the logit of every token in the window, in [-2, 2] as OpenAI
    allows. ``0.0`` = off."""
    logit_bias: Mapping[int, float] = field(default_factory=FrozenLogitBias)
    """``{token_id: bias}`` added to the raw logits: each bias in [-1e4, 1e4], or ``-inf`` to ban the
    token (a larger bias is refused, not clamped); at most 262,144 entries. A list of pairs is
    accepted; a token listed twice is an error. Stored as an immutable :class:`FrozenLogitBias`.
    ``{}`` = off."""
    xtc_probability: float = 0.0
    """Chance in [0, 1] that XTC removes the top choices at a step. ``0.0`` = off."""
    xtc_threshold: float = 0.1
    """XTC probability threshold in [0, 1]; values > 0.5 make XTC a no-op (as llama.cpp)."""
    dry_multiplier: float = 0.0
    """DRY penalty multiplier in [0, 1e4]. ``0.0`` = off."""
    dry_base: float = 1.75
    """DRY exponential base, >= 1."""
    dry_allowed_length: int = 2
    """Repetitions longer than this (>= 1 tokens) are penalised by DRY."""
    dry_penalty_last_n: int = -1
    """DRY scan window in tokens (prompt included). ``-1`` = whole history; ``0`` = off."""
    dry_sequence_breakers: tuple[str, ...] = ("\n", ":", '"', "*")
    """Strings that end a repetition for DRY: a token whose text contains one is a breaker. At most
    64 strings of at most 40 characters each."""
    mirostat: int = 0
    """Mirostat version: ``0`` = off, 1 or 2. When on, ``samplers`` is ignored (as llama.cpp)."""
    mirostat_tau: float = 5.0
    """Mirostat target surprise (bits), in [0, 1e4]."""
    mirostat_eta: float = 0.1
    """Mirostat learning rate, in [0, 1e4]."""
    dynatemp_range: float = 0.0
    """Dynamic temperature range in [0, 1e4]: t in [temperature - range, temperature + range], clamped at
    0; applies only when temperature > 0 (temperature 0 stays greedy). ``0.0`` = off."""
    dynatemp_exponent: float = 1.0
    """Dynamic temperature exponent on the normalised entropy, in [0, 1e4]."""
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
    llama.cpp letters ("edskypmxt"). Repeats apply again; omitted stages are skipped. At most 32
    stages."""

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

        # below MIN_TEMPERATURE the draw is the argmax: greedy, without the float32 overflow
        put(self, "temperature", 0.0 if self.temperature < MIN_TEMPERATURE else self.temperature)
        put(self, "top_k", max(self.top_k, 0))
        if self.top_n_sigma <= 0.0:
            put(self, "top_n_sigma", -1.0)
        for name in FIELD_RANGES:
            _in_range(name, getattr(self, name))
        put(self, "logit_bias", _parse_logit_bias(self.logit_bias))
        put(self, "dry_sequence_breakers", parse_breakers(self.dry_sequence_breakers))
        if self.mirostat not in (0, 1, 2):
            raise _err("mirostat", self.mirostat, "must be 0 (off), 1 or 2")
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

    @classmethod
    def parse(cls, values: Mapping[str, Any]) -> SamplingParams:
        """Validated params from values as a caller found them: text (a flag's or an environment
        variable's) is parsed here, by the field's own type ("0.5" -> 0.5, "none" -> None for the
        seed, a JSON array or ';'-separated items for a list; ``samplers`` parses its own text), and
        anything else is taken as it is; then every field is checked as construction always does.
        Raises :class:`SamplingParamsError` naming the field."""
        hints = typing.get_type_hints(cls)
        parsed: dict[str, Any] = {}
        for name, value in values.items():
            try:
                hint = hints.get(name)  # an unknown name fails in the constructor, as always
                parsed[name] = value if name == "samplers" or hint is None else parse_text(value, hint)
            except ValueError as exc:
                raise _err(name, value, str(exc)) from None
        return cls(**parsed)

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
        ids = self.logit_bias.ids if isinstance(self.logit_bias, FrozenLogitBias) else np.zeros(0, np.int64)
        bad = ids[ids >= vocab_size][:5].tolist()
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
