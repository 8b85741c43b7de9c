"""One decode row through every layer of a dense decoder in one compiled call (the `int8` mode).

A batch-1 decode step of the 135M default model makes about 330 backend calls (120 of them matrix
products), each a trip from Python through numba's dispatcher plus the numpy glue around it; together
that was a quarter of the step (7.3 ms a forward on the Zen 3 VM, 5.8 ms with the layers in one call).
`_decode_layers` runs the same kernels in the same order on the same data from compiled code: the
RMSNorms (`rowops._rms_norm_serial`: before and after each branch, of q and k per head or over the
projection, as a family has them), each product's activation quantization and int8 kernel, the qkv
bias, RoPE, the KV write, row attention (`attention.window_row_attention`, with a family's soft cap and
sliding window), SwiGLU/GeGLU, the residual multiplier and adds. So a row's bits are those the
op-by-op path gives it, alone or batched (tests/test_decode_row.py compares them on every type it
takes and on every family's reference model).

The matrix kernels are reached through first-class function values (numba's FunctionType, typed by
signature): the legacy types' int8 kernels on the host's path and the K-quants' row kernel. Linking
them statically would compile every type's kernels on every path into this function (100 s cold on the
Zen 3 VM) for a model that reads one or two types; through a function value only the types a model
has compile, and the compiled function caches (its signature names no particular kernel).

`_decode_layers` links rowops.py, attention.py and activations.py statically; its cache entry is
dropped when any kernel module changes (cache_freshness.py).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import njit, typed, types
from numba.core.errors import NumbaExperimentalFeatureWarning

from infer.engine.backends.base import RowShape

from . import kquants_int8, legacy_int8
from .activations import _quantize, _quantize_k
from .attention import window_row_attention
from .rowops import _gated_serial, _rms_norm_serial, rope_rows, write_kv_rows

BLOCKS = types.Array(types.uint8, 2, "C", readonly=True)
"""A matrix's blocks as the backend holds them (read-only [out, row_bytes])."""
_I8, _I32, _F32 = (types.Array(t, 2, "C") for t in (types.int8, types.int32, types.float32))

LEGACY_PRODUCT = types.FunctionType(types.void(BLOCKS, _I8, _F32, _F32))
"""A legacy type's int8 kernel (blocks, xq, xs, out): legacy_int8's on the host's path."""
KQUANT_PRODUCT = types.FunctionType(types.void(BLOCKS, _I8, _F32, _I32, _F32, types.int64, types.int64))
"""The K-quants' int8 row kernel (blocks, xq, xd, xb, out, kind, path): kquants_int8._int8_matmul."""

LEGACY_TYPES = ("Q4_0", "Q4_1", "Q8_0", "Q5_0", "Q5_1")
"""Codes 0-4 of a matrix part: these types' int8 kernels, activations quantized per 32 (Q8_0)."""
KQUANT_TYPES = ("Q4_K", "Q5_K", "Q6_K")
"""Codes 5-7: these, activations quantized per 256 (Q8_K)."""

ROLES = 4
"""A layer's products in order: qkv, out, gate_up, down."""


@njit(cache=True)
def _unused_legacy(blocks, xq, xs, out):
    """Fills the slots of the legacy types a model does not have (never called)."""


@njit(cache=True)
def _unused_kquant(blocks, xq, xd, xb, out, kind, path):
    """Stands for the K-quant kernel in a model without K-quants (never called)."""


@njit(inline="always", cache=True)
def _product(x, role, part_starts, blocks, codes, columns, out, legacy, kquant, path):
    """out = x @ W.T for one role's matrix, part by part (a stack of types writes its own columns),
    with x quantized once per quantizer the parts read, as the op-by-op path does."""
    lo, hi = part_starts[role], part_starts[role + 1]
    width = x.shape[1]
    needs_legacy = False
    needs_k = False
    for p in range(lo, hi):
        if codes[p] < len(LEGACY_TYPES):
            needs_legacy = True
        else:
            needs_k = True
    xq = np.empty((1, width), np.int8)
    xs = np.empty((1, width // 32), np.float32)
    if needs_legacy:
        _quantize(x, xq, xs)
    kq = np.empty((1, width), np.int8)
    xd = np.empty((1, width // 256), np.float32)
    xb = np.empty((1, width // 16), np.int32)
    if needs_k:
        _quantize_k(x, kq, xd, xb)
    for p in range(lo, hi):
        target = out if hi - lo == 1 else np.empty((1, blocks[p].shape[0]), np.float32)
        code = codes[p]
        if code < len(LEGACY_TYPES):
            legacy[code](blocks[p], xq, xs, target)
        else:
            kquant[0](blocks[p], kq, xd, xb, target, code - len(LEGACY_TYPES), path)
        if hi - lo > 1:
            out[0, columns[p] : columns[p] + target.shape[1]] = target[0]


@njit(inline="always", cache=True)
def _normed(x, weights, layer, eps, out):
    """x RMS-normalised by row `layer` of `weights` into out, or x itself where the model has no such
    norm (`weights` zero wide)."""
    if weights.shape[1] == 0:
        return x
    _rms_norm_serial(x, weights[layer], eps, out)
    return out


@njit(inline="always", cache=True)
def _add_branch(hidden, branch, norms, layer, eps, multiplier, normed):
    """hidden += the branch as the residual stream takes it: its post-norm, its multiplier."""
    out = _normed(branch, norms, layer, eps, normed)
    if multiplier.shape[0]:
        out = out * multiplier[0]
    hidden += out


@njit(inline="always", cache=True)
def _norm_rows(width, norm_width):
    """Where a q or k projection `width` wide is normalised: rows of `norm_width` (a head, or the
    whole projection); a placeholder where the model has no such norm."""
    if norm_width == 0:
        return np.empty((1, 1), np.float32)
    return np.empty((width // norm_width, norm_width), np.float32)


def _decode_layers(
    hidden,
    norms,
    multiplier,
    blocks,
    codes,
    columns,
    part_starts,
    rope_of,
    sliding,
    q_rots,
    k_rots,
    keys,
    values,
    slot,
    position,
    eps,
    softcap,
    shape,
    legacy,
    kquant,
    path,
):
    """Every layer for one row: hidden [1, width] (the embedding in, the residual stream out) is updated
    in place; the row's keys and values land at (slot, position) of keys, values [layers, slots, kv_heads,
    capacity, head_dim].

    norms: float32 [layers, n] each, n = 0 where the model has none: the pre-attention, pre-MLP,
    post-attention and post-MLP RMSNorms (width), the q and k norms (head_dim: per head, or the
    projection's width: over all of it) and the qkv bias. multiplier: the residual multiplier, or
    empty. sliding: 1 for a layer that attends within the window. softcap: attention scores' soft cap,
    0 for none. shape = (heads, kv_heads, head_dim, intermediate, window or 0, 1 for GeGLU)."""
    attn_norms, mlp_norms, post_attn_norms, post_mlp_norms, q_norms, k_norms, biases = norms
    heads, kv_heads, head_dim, inter, window, gelu = shape
    q_width, kv_width = heads * head_dim, kv_heads * head_dim
    width = hidden.shape[1]
    x = np.empty((1, width), np.float32)
    normed = np.empty((1, width), np.float32)
    qkv = np.empty((1, q_width + 2 * kv_width), np.float32)
    q_normed = _norm_rows(q_width, q_norms.shape[1])
    k_normed = _norm_rows(kv_width, k_norms.shape[1])
    branch = np.empty((1, width), np.float32)
    gate_up = np.empty((1, 2 * inter), np.float32)
    gated = np.empty((1, inter), np.float32)
    attended = np.empty((1, heads, head_dim), np.float32)
    rows = np.zeros(1, np.int64)
    slots = np.full(1, slot, np.int64)
    first = np.zeros(1, np.int64)
    visible = np.full(1, position + 1, np.int64)
    positions = np.full(1, position, np.int64)
    for layer in range(rope_of.shape[0]):
        role = ROLES * layer
        source = _normed(hidden, attn_norms, layer, eps, x)
        _product(source, role, part_starts, blocks, codes, columns, qkv, legacy, kquant, path)
        if biases.shape[1]:
            qkv += biases[layer : layer + 1]
        q_flat = qkv[:, :q_width].copy()
        k_flat = qkv[:, q_width : q_width + kv_width].copy()
        v = qkv[:, q_width + kv_width :].copy().reshape(1, kv_heads, head_dim)
        if q_norms.shape[1]:  # per head (rows of head_dim) or over the whole projection (one row)
            q_flat = _normed(q_flat.reshape(q_normed.shape), q_norms, layer, eps, q_normed).reshape(
                1, q_width
            )
            k_flat = _normed(k_flat.reshape(k_normed.shape), k_norms, layer, eps, k_normed).reshape(
                1, kv_width
            )
        q = q_flat.reshape(1, heads, head_dim)  # its own array: rope_rows rotates it in place
        k = k_flat.reshape(1, kv_heads, head_dim)
        kind = rope_of[layer]
        rope_rows(q, q_rots[kind : kind + 1])
        rope_rows(k, k_rots[kind : kind + 1])
        write_kv_rows(keys, values, layer, slots, positions, k, v)
        first[0] = max(position + 1 - window, 0) if sliding[layer] else 0
        window_row_attention(q, keys[layer], values[layer], rows, slots, first, visible, attended, softcap)
        heads_out = attended.reshape(1, q_width)
        _product(heads_out, role + 1, part_starts, blocks, codes, columns, branch, legacy, kquant, path)
        _add_branch(hidden, branch, post_attn_norms, layer, eps, multiplier, normed)
        source = _normed(hidden, mlp_norms, layer, eps, x)
        _product(source, role + 2, part_starts, blocks, codes, columns, gate_up, legacy, kquant, path)
        _gated_serial(gate_up, inter, gated, gelu == 1)
        _product(gated, role + 3, part_starts, blocks, codes, columns, branch, legacy, kquant, path)
        _add_branch(hidden, branch, post_mlp_norms, layer, eps, multiplier, normed)


def _signature(cache_element: types.Type) -> types.Type:
    ints = types.Array(types.int64, 1, "C")
    rotations = types.Array(types.complex64, 2, "C")
    cache = types.Array(cache_element, 5, "C")
    return types.void(
        _F32,  # hidden
        types.UniTuple(_F32, 7),  # norms and bias
        types.Array(types.float32, 1, "C"),  # multiplier
        types.ListType(BLOCKS),
        ints,  # codes
        ints,  # columns
        ints,  # part_starts
        ints,  # rope_of
        ints,  # sliding
        rotations,
        rotations,
        cache,
        cache,
        types.int64,  # slot
        types.int64,  # position
        types.float32,  # eps
        types.float64,  # softcap
        types.UniTuple(types.int64, 6),  # shape
        types.ListType(LEGACY_PRODUCT),
        types.ListType(KQUANT_PRODUCT),
        types.int64,  # path
    )


@contextlib.contextmanager
def _function_values() -> Iterator[None]:
    """A block that makes or types function values, without numba's warning that the feature is
    experimental (what it runs here is covered by tests/test_decode_row.py)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", NumbaExperimentalFeatureWarning)
        yield


@functools.cache
def _compiled(cache_dtype: str) -> Callable[..., None]:
    """`_decode_layers` compiled (or loaded from numba's cache) for a float32 or half cache, on first use."""
    element = types.float32 if cache_dtype == "float32" else types.uint16
    with _function_values():
        return njit(_signature(element), cache=True)(_decode_layers)


# The lists `_decode_layers` reads are made and filled by compiled functions, which numba caches: typed.List
# from Python compiles its methods for each element type in every process (2.4 s of start-up for these).
@njit(cache=True)
def _blocks_list():
    return typed.List.empty_list(BLOCKS)


@njit(cache=True)
def _append_blocks(blocks, item):
    blocks.append(item)


def _legacy_list():
    return typed.List.empty_list(LEGACY_PRODUCT)


def _kquant_list():
    return typed.List.empty_list(KQUANT_PRODUCT)


def _append(items, item):
    items.append(item)


@dataclass(frozen=True)
class _ListMakers:
    legacy_list: Callable[[], Any]
    append_legacy: Callable[[Any, Any], None]
    kquant_list: Callable[[], Any]
    append_kquant: Callable[[Any, Any], None]


@functools.cache
def _list_makers() -> _ListMakers:
    """The compiled makers of the kernels' function-value lists (explicit signatures: a function value
    is typed by its signature, so they cache; compiled or loaded on first use)."""
    legacy, kquant = types.ListType(LEGACY_PRODUCT), types.ListType(KQUANT_PRODUCT)
    with _function_values():
        return _ListMakers(
            njit(legacy(), cache=True)(_legacy_list),
            njit(types.void(legacy, LEGACY_PRODUCT), cache=True)(_append),
            njit(kquant(), cache=True)(_kquant_list),
            njit(types.void(kquant, KQUANT_PRODUCT), cache=True)(_append),
        )


@functools.cache
def _kernel_codes() -> dict[Callable[..., None], int]:
    """The public int8 matmul of each type this module runs, to its code."""
    legacy = (
        legacy_int8.q4_0_matmul_int8,
        legacy_int8.q4_1_matmul_int8,
        legacy_int8.q8_0_matmul_int8,
        legacy_int8.q5_0_matmul_int8,
        legacy_int8.q5_1_matmul_int8,
    )
    kquant = (kquants_int8.q4_k_matmul_int8, kquants_int8.q5_k_matmul_int8, kquants_int8.q6_k_matmul_int8)
    return {fn: code for code, fn in enumerate(legacy + kquant)}


@dataclass(frozen=True)
class MatrixPart:
    """One part of a layer's product: blocks of one type that write `width` columns from `column`."""

    blocks: np.ndarray
    matmul_int8: Callable[..., None]
    column: int


def part_code(matmul_int8: Callable[..., None] | None) -> int | None:
    """The code `_decode_layers` runs a part with, from its type's int8 matmul; None for a kernel it
    does not run (then the model keeps the op-by-op path)."""
    return None if matmul_int8 is None else _kernel_codes().get(matmul_int8)


NORMS = ("attn_norm", "mlp_norm", "post_attn_norm", "post_mlp_norm", "q_norm", "k_norm", "qkv_bias")
"""The per-layer vectors `DecodeLayers` takes, in the order `_decode_layers` reads them."""


class DecodeLayers:
    """A model's layers packed for `_decode_layers`: each role's parts in order, each part's type code,
    the per-layer vectors stacked, and the kernels as function values."""

    def __init__(
        self,
        layers: Sequence[Sequence[Sequence[MatrixPart]]],
        vectors: Sequence[np.ndarray],
        shape: RowShape,
    ) -> None:
        """`layers`: each layer's four roles (qkv, out, gate_up, down), each a list of parts; `vectors`:
        NORMS in order, each float32 [layers, n] (n = 0 for one the model has not); `shape`: the rest
        of what the layers compute (the model's RowShape)."""
        codes_of = _kernel_codes()
        parts = [part for roles in layers for role in roles for part in role]
        starts = [0]
        for roles in layers:
            for role in roles:
                starts.append(starts[-1] + len(role))
        self._blocks = _blocks_list()
        for part in parts:
            _append_blocks(self._blocks, part.blocks)
        self._codes = np.array([codes_of[part.matmul_int8] for part in parts], dtype=np.int64)
        self._columns = np.array([part.column for part in parts], dtype=np.int64)
        self._part_starts = np.array(starts, dtype=np.int64)
        self._vectors = tuple(np.ascontiguousarray(v, dtype=np.float32) for v in vectors)
        s = shape
        self._multiplier = np.array(
            [] if s.residual_multiplier is None else [s.residual_multiplier], np.float32
        )
        self._rope_of = np.asarray(s.rope_of, dtype=np.int64)
        self._sliding = np.asarray(s.sliding, dtype=np.int64)
        self._eps = np.float32(s.eps)
        self._softcap = float(s.softcap or 0.0)
        self._shape = (s.heads, s.kv_heads, s.head_dim, s.intermediate, s.window or 0, int(s.gelu))
        # The kernels as function values, converted once here (converting them on each call cost
        # ~0.1 ms a kernel): a list a legacy type's slot, and one for the K-quants' row kernel.
        used = set(self._codes.tolist())
        legacy_host = legacy_int8.host_int8_kernels()
        has_k = any(code >= len(LEGACY_TYPES) for code in used)
        make = _list_makers()
        self._legacy = make.legacy_list()
        for code, name in enumerate(LEGACY_TYPES):
            make.append_legacy(self._legacy, legacy_host[name] if code in used else _unused_legacy)
        self._kquant = make.kquant_list()
        make.append_kquant(self._kquant, kquants_int8.row_kernel() if has_k else _unused_kquant)

    def run(
        self,
        hidden: np.ndarray,
        keys: np.ndarray,
        values: np.ndarray,
        slot: int,
        position: int,
        q_rots: np.ndarray,
        k_rots: np.ndarray,
    ) -> None:
        """Every layer for the one row `hidden` [1, width] (float32, updated in place), its keys and
        values written at (slot, position) of the cache arrays (float32, or half bits as uint16);
        q_rots, k_rots: complex64 [rope kinds, pairs], the row's rotations of each kind of layer."""
        compiled = _compiled("float32" if keys.dtype == np.float32 else "float16")
        compiled(
            hidden,
            self._vectors,
            self._multiplier,
            self._blocks,
            self._codes,
            self._columns,
            self._part_starts,
            self._rope_of,
            self._sliding,
            q_rots,
            k_rots,
            keys,
            values,
            slot,
            position,
            self._eps,
            self._softcap,
            self._shape,
            self._legacy,
            self._kquant,
            kquants_int8.INT8_PATH,
        )
