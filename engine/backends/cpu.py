"""The numpy backend: float32 everywhere, matmuls through BLAS."""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from types import ModuleType
from typing import ClassVar

import numpy as np

from infer.engine.backends import cpu_setup
from infer.engine.backends.attention import AttentionPlan, PrefillRun, causal_mask
from infer.engine.backends.base import BackendOptions, Capabilities, RowDecoder, RowLayer, RowShape
from infer.engine.backends.cpu_kernels.registry import Quantize, QuantKernels, quantize_once
from infer.engine.backends.cpu_memory import (
    adjacent_rows,
    anonymous_array,
    available_memory,
    give_back_pages,
    l2_cache_bytes,
    read_only,
    read_only_file_map,
    release_clean_library_pages,
    trim_heap,
)
from infer.engine.backends.errors import BackendError
from infer.engine.backends.kv_cache import KVCache
from infer.engine.backends.weight_copies import WeightCopies

_VOCAB_CHUNK = 4096
"""Rows of the embedding table per vocabulary-projection matmul (see CpuBackend.logits)."""


KERNEL_MODES: tuple[str, ...] = ("exact", "int8", "blas")
"""How the cpu backend multiplies by a GGUF matrix: `exact` (kernels on the blocks, weights dequantized in
registers, float32 accumulation), `int8` (kernels with activations quantized per 32-block, as llama.cpp
does: faster, approximate), `blas` (a float32 copy of every matrix through BLAS)."""

LLVM_LIBRARY = "libllvmlite.so"
"""The shared library holding numba's compiler (LLVM): needed to load kernels, idle once they are."""

COPY_RESERVE = 1 << 30
"""Memory left free when copying weights (`mmap` False): the KV cache, activations, the rest."""

KERNEL_ROWS = 64
"""Rows of x per kernel call. Kernels give each row the same bits whatever the rows beside it, so a
longer x runs as consecutive groups of this many rows with no change to any row's result. Each call
streams the whole matrix: with 64 rows, not 16, a 128-token prefill of the Llama 3.2 1B shape (Q4_K_M,
int8) ran 1.17x faster (2-core Zen 3, best of 3 interleaved). The `exact` mode's count, and the least
of the `int8` mode's (`int8_rows_per_call`)."""

INT8_MAX_ROWS = 512
"""Most rows of x per int8 kernel call."""


def int8_rows_per_call(width: int, l2_bytes: int | None) -> int:
    """Rows of x per int8 kernel call on a matrix `width` columns wide: as many as keep the call's
    quantized activations (a byte an element) within half the L2 cache, in sixteens, from KERNEL_ROWS
    to INT8_MAX_ROWS (KERNEL_ROWS where the L2 size is unknown). A tiled kernel unpacks every weight
    tile again in each call and reads all of the call's packed activations for each tile, so the count
    is a trade between the two: on the 2-core Intel VM (2 MB L2) a 256-token prefill of the 1B shape ran
    1.07x (Q4_K_M) and 1.12x (Q5_K_M) faster with these counts (512 rows a call at 2,048 columns, 128 at
    8,192) than with 64 (five alternating rounds, medians)."""
    if l2_bytes is None:
        return KERNEL_ROWS
    rows = l2_bytes // 2 // max(1, width) // 16 * 16
    return max(KERNEL_ROWS, min(INT8_MAX_ROWS, rows))


ROW_ATTENTION_ROWS = 128
"""Longest run of one sequence whose rows attend through the row kernel in the kernel modes; longer
prefill runs attend in causal blocks on a thread pool (cpu_kernels/prefill_attention.py). Measured on
2 cores: the blocks' fixed cost (~100 us a run) loses below 128 rows (17 rows: 127 us against 10), the
row kernel's square work loses above (256 rows: 1.4 ms against 0.8). Every decode and verify row is
far below it, so they always take the row kernel."""


@dataclass(frozen=True)
class DenseWeight:
    """A float32 weight held as one contiguous numpy array."""

    data: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the weight."""
        return tuple(self.data.shape)


@dataclass(frozen=True)
class BlockWeight:
    """A GGUF matrix kept in its blocks (uint8 [out, row_bytes], memory-mapped), with its type's kernels."""

    blocks: np.ndarray
    kernels: QuantKernels
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", read_only(self.blocks))


@dataclass(frozen=True)
class ExpertBlocks:
    """A mixture of experts' matrices of one projection in one uint8 [experts, out, row_bytes] array
    (a view of a GGUF expert stack, or one copy of matrices that were apart), with their kernels."""

    blocks: np.ndarray
    kernels: QuantKernels
    shape: tuple[int, ...]
    """[experts, out, in]."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", read_only(self.blocks))


@dataclass(frozen=True)
class StackedWeight:
    """Several matrices whose rows stack into one weight (q, k and v; gate and up): each part keeps its
    own blocks and type, and writes its own columns of the product."""

    parts: tuple[BlockWeight, ...]
    shape: tuple[int, ...]


def _softcap_(scores: np.ndarray, cap: float) -> np.ndarray:
    """cap * tanh(scores / cap) in place, float32, in transformers' order (Gemma 2's attention
    soft-capping: divide, tanh, multiply)."""
    c = np.float32(cap)
    scores /= c
    np.tanh(scores, out=scores)
    scores *= c
    return scores


def _kernel_view(cache_array: np.ndarray) -> np.ndarray:
    """A KV cache array as the numba kernels take it: float32 as is, a half cache as its bits (numba
    has no float16 on the CPU; the kernels widen each element as they load it, kv_storage.py)."""
    return cache_array.view(np.uint16) if cache_array.dtype == np.float16 else cache_array


class _CpuRowDecoder:
    """RowDecoder over cpu_kernels/decode_row.py's packed layers."""

    def __init__(self, layers: object) -> None:
        self._layers = layers

    def run(
        self,
        hidden: np.ndarray,
        cache: KVCache,
        slot: int,
        position: int,
        q_rotations: np.ndarray,
        k_rotations: np.ndarray,
    ) -> np.ndarray:
        """See RowDecoder.run (in place on `hidden` when it is float32 and contiguous)."""
        hidden = np.ascontiguousarray(hidden, dtype=np.float32)
        self._layers.run(  # type: ignore[attr-defined]
            hidden,
            _kernel_view(cache.keys),
            _kernel_view(cache.values),
            slot,
            position,
            np.ascontiguousarray(q_rotations, dtype=np.complex64),
            np.ascontiguousarray(k_rotations, dtype=np.complex64),
        )
        return hidden


class CpuBackend(cpu_setup.CpuSetup):
    """Numpy implementation of the Backend protocol (float32), with numba kernels on GGUF blocks."""

    name: ClassVar[str] = "cpu"
    capabilities: ClassVar[Capabilities] = Capabilities(dtypes=("float32",), kernel_modes=KERNEL_MODES)
    implemented: ClassVar[bool] = True

    def __init__(
        self,
        dtype: str = "float32",
        kernels: str = "blas",
        kernel_table: Mapping[str, QuantKernels] | None = None,
        *,
        threads: int | None = None,
        mmap: bool = True,
    ) -> None:
        if dtype not in self.capabilities.dtypes:
            raise BackendError(
                f"the cpu backend computes in float32 only, got dtype {dtype!r}; use dtype float32"
            )
        if kernels not in KERNEL_MODES:
            raise BackendError(f"cpu kernels must be one of {', '.join(KERNEL_MODES)}, got {kernels!r}")
        self.dtype = dtype
        self.kernel_mode = kernels
        """exact, int8 or blas (see KERNEL_MODES)."""
        self._rowops: ModuleType | None = None
        """The numba row ops (cpu_kernels/rowops.py) in the kernel modes; None with `blas`, which
        imports no numba and keeps the numpy formulas."""
        self._quantize: Quantize | None = None
        """quantize_activations (Q8_0) in the `int8` mode, else None: the quantizer of the int8 kernels
        that register none of their own (QuantKernels.quantize)."""
        self._l2_bytes = l2_cache_bytes() if kernels == "int8" else None
        """The L2 cache's size, which sets the rows of an int8 kernel call (`int8_rows_per_call`)."""
        if kernels == "blas":
            kernel_table = {}
        else:
            from infer.engine.backends.cpu_kernels import attention, prefill_attention, rowops

            self._rowops = rowops
            self._row_attention = attention.window_row_attention
            self._run_attention = prefill_attention.run_attention
            if kernels == "int8":
                from infer.engine.backends.cpu_kernels import quantize_activations

                self._quantize = quantize_activations
            if kernel_table is None:
                from infer.engine.backends.cpu_kernels import KERNELS

                kernel_table = KERNELS
        self._kernels: Mapping[str, QuantKernels] = kernel_table
        self._ones: dict[int, np.ndarray] = {}
        """float32 ones per width: the RMSNorm kernel's weight when a norm has none (x * 1 == x)."""
        self._pools: dict[int, ThreadPoolExecutor] = {}
        """Thread pools for prefill attention blocks, by thread count (kernel modes)."""
        self.step_threads = cpu_setup.StepThreads(BackendOptions(self.name, dtype, kernels, threads, mmap))
        """The kernels' thread count in the step threads (see BackendOptions.threads)."""
        self.mmap = mmap
        """Compute on the file map's blocks (True) or on copies in anonymous memory (see `_resident`)."""
        self._weight_copies = WeightCopies(available_memory() - COPY_RESERVE if not mmap else 0, self.discard)
        """The blocks' copies in anonymous memory (`mmap` False; see `_resident` and `loading`)."""

    @property
    def mapped_bytes(self) -> int:
        """Block bytes left memory-mapped although `mmap` is False (the copy budget ran out)."""
        return self._weight_copies.mapped_bytes

    @property
    def kv_cache_dtypes(self) -> tuple[str, ...]:
        """KV cache storage dtypes (`kv_cache_dtype`) in this mode: f32, and f16 with the kernels,
        which widen each half as they load it (`blas` multiplies by the cache in place: f32 only)."""
        return ("f32",) if self.kernel_mode == "blas" else ("f32", "f16")

    @property
    def block_formats(self) -> frozenset[str]:
        """GGUF types this backend computes on as blocks (none in `blas` mode): others come as floats."""
        return frozenset(self._kernels)

    @staticmethod
    def probe() -> str | None:
        """None when numpy runs a tiny op correctly, else the reason."""
        result = (np.arange(4, dtype=np.float32) * 2).sum()
        return None if float(result) == 12.0 else f"tiny op failed: numpy returned {result}"

    def weight(
        self, array: np.ndarray, *, quant: str | None = None, shape: tuple[int, ...] | None = None
    ) -> DenseWeight | BlockWeight:
        """A contiguous float32 copy of a dense array (no copy when it already is one), or a GGUF
        matrix's blocks as they are (`quant` one of `block_formats`; `shape` its [out, in])."""
        if quant is None:
            if not self.mmap and read_only_file_map(array):
                # copied like the blocks: read from the map at run time, every fault also maps the
                # file's neighbouring pages (fault-around, large page-cache folios), and the norms of
                # the Llama 3.2 1B shape brought 52 MB of the matrices around them back into RSS
                return DenseWeight(np.array(array, dtype=np.float32))
            return DenseWeight(np.ascontiguousarray(array, dtype=np.float32))
        kernels = self._kernels.get(quant)
        if kernels is None or shape is None or len(shape) != 2:
            raise BackendError(
                f"the cpu backend ({self.kernel_mode} kernels) computes on no {quant} blocks of shape "
                f"{shape}; pass it as floats"
            )
        return BlockWeight(self._resident(array), kernels, tuple(shape))

    def _resident(self, blocks: np.ndarray) -> np.ndarray:
        """With `mmap` False, a file map's blocks as a copy in anonymous memory, the file pages given back.
        Decode at size streams every weight byte once a token: large anonymous arrays sit on transparent
        huge pages, which the kernel gives no file's page cache, and the same rows read 15-30 % faster
        there (fewer TLB misses; the hardware prefetchers stop at every 4 KB page). Copied while the
        memory available at start-up minus COPY_RESERVE allows; past that the blocks stay mapped.
        Inside `loading` the copy is a placeholder, filled as the block ends."""
        if self.mmap or not read_only_file_map(blocks):
            return blocks
        return self._weight_copies.resident(blocks)

    @contextmanager
    def loading(self) -> Iterator[None]:
        """Builds and warm-ups inside compute on placeholders of the weights' copies (`mmap` False: see
        weight_copies.py); at the end, once numba has loaded every kernel the warm-up called, LLVM's
        code pages and the heap's free pages are given back and then the copies are made, so the
        peak RSS holds weights or that code, not both."""

        def release_compiler_code() -> None:
            if self._rowops is not None:  # numba ran: its compiler's code is resident
                release_clean_library_pages(LLVM_LIBRARY)
            # the copies go to maps of their own and would reuse none of the heap the tokenizer's
            # build and the file's metadata freed (12 MiB less at the peak on the 1B shape)
            trim_heap()

        with self._weight_copies.deferred(before_copying=release_compiler_code):
            yield

    def stack(
        self, weights: Sequence[DenseWeight | BlockWeight]
    ) -> DenseWeight | BlockWeight | StackedWeight:
        """One weight whose rows are `weights`' rows in order: dense ones concatenated; blocks of one
        type as one block matrix, so a product is one kernel call (a view when they lie back to back
        in one buffer, as gate and up do in llama.cpp's files; else a copy, whose read-only file pages
        are given back so memory holds the blocks once); blocks of several types kept as parts."""
        if all(isinstance(w, DenseWeight) for w in weights):
            return DenseWeight(np.concatenate([w.data for w in weights]))  # type: ignore[union-attr]
        if not all(isinstance(w, BlockWeight) for w in weights):
            raise BackendError("cannot stack dense and block weights into one")
        parts: tuple[BlockWeight, ...] = tuple(weights)  # type: ignore[arg-type]
        shape = (sum(p.shape[0] for p in parts), parts[0].shape[1])
        if len({p.kernels for p in parts}) > 1 or len({p.blocks.shape[1:] for p in parts}) > 1:
            return StackedWeight(parts, shape)
        joined = self._joined_blocks(parts)
        return BlockWeight(joined, parts[0].kernels, shape)

    def _joined_blocks(self, parts: Sequence[BlockWeight]) -> np.ndarray:
        """The parts' blocks as one [rows, row_bytes] array: a view when they lie back to back in one
        buffer, else a copy, whose read-only file pages are given back so memory holds them once."""
        joined = adjacent_rows([p.blocks for p in parts])
        if joined is None:
            joined = self._weight_copies.joined([p.blocks for p in parts])
        if joined is None:
            joined = np.concatenate([p.blocks for p in parts])
            for part in parts:
                if read_only_file_map(part.blocks):
                    self.discard(part.blocks)
        return joined

    def expert_stack(self, weights: Sequence[DenseWeight | BlockWeight]) -> ExpertBlocks | None:
        """Block matrices of one type and shape whose type has segment kernels in this mode, as one
        [experts, out, row_bytes] array (a view when they lie back to back, as a GGUF expert stack's
        do; else one copy, the file pages under the parts given back); None otherwise (dense experts,
        mixed types, `blas`): the model then multiplies expert by expert."""
        if not weights or not all(isinstance(w, BlockWeight) for w in weights):
            return None
        parts: list[BlockWeight] = list(weights)  # type: ignore[arg-type]
        kernels = parts[0].kernels
        if any(p.kernels != kernels or p.blocks.shape != parts[0].blocks.shape for p in parts):
            return None
        segments = kernels.segments_int8 if self._quantize is not None else kernels.segments_exact
        if segments is None:
            return None
        rows, row_bytes = parts[0].blocks.shape
        joined = self._joined_blocks(parts)
        shape = (len(parts), *parts[0].shape)
        return ExpertBlocks(joined.reshape(len(parts), rows, row_bytes), kernels, shape)

    def expert_linear(
        self, x: np.ndarray, stack: ExpertBlocks, experts: np.ndarray, starts: np.ndarray
    ) -> np.ndarray:
        """Every segment's product in one kernel call (the type's segment kernel): rows starts[s] ..
        starts[s + 1] - 1 of x times expert experts[s]; a row gets the bits `linear` gives it alone."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty((x.shape[0], stack.shape[1]), dtype=np.float32)
        experts = np.ascontiguousarray(experts, dtype=np.int64)
        starts = np.ascontiguousarray(starts, dtype=np.int64)
        kernels = stack.kernels
        if self._quantize is not None and kernels.segments_int8 is not None:
            acts = (kernels.quantize or self._quantize)(x)
            kernels.segments_int8(stack.blocks, experts, starts, *acts, out)
        elif kernels.segments_exact is not None:
            kernels.segments_exact(stack.blocks, experts, starts, x, out)
        else:
            raise BackendError(f"no {kernels.type_name} segment kernel in the {self.kernel_mode} mode")
        return out

    def _block_product(self, x: np.ndarray, weight: BlockWeight | StackedWeight) -> np.ndarray:
        """x @ W.T for blocks: every KERNEL_ROWS rows of x (int8 kernels: `int8_rows_per_call`) in one
        kernel call per part; each row's result is the same bits whatever rows run beside it. A part
        writes its columns in place when they are contiguous (one row), else through a temporary."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows = x.shape[0]
        if rows <= KERNEL_ROWS and isinstance(weight, BlockWeight):
            # The decode and verify case, one kernel call: this path runs ~120 times a token, where
            # the general loop's bookkeeping cost a few percent of a batch-1 step.
            out = np.empty((rows, weight.shape[0]), dtype=np.float32)
            kernels = weight.kernels
            if self._quantize is not None and kernels.matmul_int8 is not None:
                kernels.matmul_int8(weight.blocks, *(kernels.quantize or self._quantize)(x), out)
            else:
                kernels.matmul_exact(weight.blocks, x, out)
            return out
        parts = weight.parts if isinstance(weight, StackedWeight) else (weight,)
        out = np.empty((rows, weight.shape[0]), dtype=np.float32)
        acts = None
        if self._quantize is not None:
            acts = quantize_once(x, [p.kernels for p in parts], self._quantize)
        step = KERNEL_ROWS if acts is None else int8_rows_per_call(x.shape[1], self._l2_bytes)
        for lo in range(0, rows, step):
            hi = min(lo + step, rows)
            column = 0
            for part in parts:
                width = part.shape[0]
                if len(parts) == 1:
                    target = out[lo:hi]
                elif hi - lo == 1:
                    target = out[lo:hi, column : column + width]
                else:
                    target = np.empty((hi - lo, width), dtype=np.float32)
                if acts is not None:
                    rows_of = (a[lo:hi] for a in acts[part.kernels.quantize or self._quantize])
                    part.kernels.matmul_int8(part.blocks, *rows_of, target)  # type: ignore[misc]
                else:
                    part.kernels.matmul_exact(part.blocks, x[lo:hi], target)
                if len(parts) > 1 and hi - lo > 1:
                    out[lo:hi, column : column + width] = target
                column += width
        return out

    def row_decoder(self, layers: Sequence[RowLayer], shape: RowShape) -> RowDecoder | None:
        """In the `int8` mode, dense decoder layers whose matrices are all block types with int8 kernels
        (cpu_kernels/decode_row.py: Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, Q4_K, Q5_K, Q6_K) packed to run one decode
        row in one compiled call, the same kernels on the same data as op by op; None otherwise."""
        if self._quantize is None:
            return None
        from infer.engine.backends.cpu_kernels import decode_row
        from infer.engine.backends.cpu_kernels.activations import quantize_activations, quantize_activations_k

        def parts(weight: object) -> list[decode_row.MatrixPart] | None:
            pieces = weight.parts if isinstance(weight, StackedWeight) else (weight,)
            found, column = [], 0
            for piece in pieces:
                if not isinstance(piece, BlockWeight):
                    return None
                kernels = piece.kernels
                code = decode_row.part_code(kernels.matmul_int8)
                legacy = code is not None and code < len(decode_row.LEGACY_TYPES)
                expected = quantize_activations if legacy else quantize_activations_k
                if code is None or (kernels.quantize or self._quantize) is not expected:
                    return None
                found.append(decode_row.MatrixPart(piece.blocks, kernels.matmul_int8, column))
                column += piece.shape[0]
            return found

        packed = []
        for layer in layers:
            roles = [parts(w) for w in (layer.qkv, layer.out, layer.gate_up, layer.down)]
            if any(r is None for r in roles):
                return None
            packed.append(roles)
        vectors = []
        for name in decode_row.NORMS:
            weights = [getattr(layer, name) for layer in layers]
            if all(w is None for w in weights):
                vectors.append(np.zeros((len(layers), 0), np.float32))
            elif all(isinstance(w, DenseWeight) for w in weights):
                vectors.append(np.stack([w.data for w in weights]))  # type: ignore[union-attr]
            else:
                return None
        return _CpuRowDecoder(decode_row.DecodeLayers(packed, vectors, shape))  # type: ignore[arg-type]

    def asarray(self, host: np.ndarray) -> np.ndarray:
        """Host data is already where the cpu backend computes."""
        return np.asarray(host)

    def to_host(self, array: np.ndarray) -> np.ndarray:
        """Already on the host."""
        return array

    @property
    def sampling_module(self) -> None:
        """None: the logits are on the host already, where the sampler chain runs."""
        return None

    def softcap(self, x: np.ndarray, cap: float) -> np.ndarray:
        """cap * tanh(x / cap) in float32 (on a copy; `_softcap_`, which attention scores use too)."""
        return _softcap_(np.array(x, dtype=np.float32), cap)

    def zeros(self, shape: tuple[int, ...], dtype: str = "float32") -> np.ndarray:
        """Zeros (float32, or `dtype`: float16 for a half KV cache) in fresh anonymous pages, committed only
        as they are written, so untouched cache memory costs no RSS. Page-aligned, so rows start on a
        cache line (with malloc's 16-byte alignment a 256-byte key row straddles 5 lines instead of 4:
        decode attention reads 5 % slower). Transparent huge pages are declined: numpy asks for them on
        large arrays, and with 2 MB pages the first position written in each (layer, slot, head) run
        commits 2 MB, so a short generation on a 4096-position cache held ~360 MB of zeros."""
        return anonymous_array(shape, dtype, huge_pages=False)

    def discard(self, array: np.ndarray) -> None:
        """Give the whole pages under `array` (a view into a `zeros` array, or of a read-only file map)
        back to the kernel with madvise(MADV_DONTNEED); they read as zeros (a file's contents)
        afterwards and cost no RSS until touched again.
        Each contiguous run of the view is handled separately; partial pages at a run's ends stay."""
        give_back_pages(array)

    def embed(self, table: DenseWeight | BlockWeight, ids: np.ndarray) -> np.ndarray:
        """Rows `ids` of the table. With BLAS the residual stream is kept column-major, the layout
        `linear` returns there, so the two residual adds per layer run over contiguous memory; the
        kernels return row-major, and so does this then."""
        if isinstance(table, BlockWeight):
            out = np.empty((len(ids), table.shape[1]), dtype=np.float32)
            table.kernels.dequantize_rows(np.ascontiguousarray(table.blocks[ids]), 0, len(ids), out)
            return out
        return np.asfortranarray(table.data[ids])

    def linear(
        self,
        x: np.ndarray,
        weight: DenseWeight | BlockWeight | StackedWeight,
        bias: DenseWeight | None = None,
    ) -> np.ndarray:
        """x @ weight.T (+ bias) for weight [out, in], computed as (weight @ x.T).T.

        OpenBLAS's sgemm is markedly faster for a few-row x in this orientation (weight as the
        large left operand); the result is a transposed view, which the elementwise ops take as is.
        """
        if not isinstance(weight, DenseWeight):
            out = self._block_product(x, weight)
        else:
            out = (weight.data @ x.T).T
        if bias is not None:
            out += bias.data
        return out

    def logits(self, x: np.ndarray, weight: DenseWeight | BlockWeight) -> np.ndarray:
        """x @ table.T for the vocabulary projection (table [vocab, hidden]), as a C-ordered array.

        The product runs in slices of `_VOCAB_CHUNK` rows of the table, which keeps OpenBLAS's packed
        panels in cache: 15-30% faster than one call for 4-64 rows. Few rows take the
        (table @ x.T) orientation plus one transposing copy; many rows write straight into place.
        """
        if isinstance(weight, BlockWeight):
            return self._block_product(x, weight)
        table = weight.data
        rows, vocab = x.shape[0], table.shape[0]
        if rows == 1:
            return x @ table.T
        if rows <= 32:
            columns = np.empty((vocab, rows), dtype=np.float32)
            for start in range(0, vocab, _VOCAB_CHUNK):
                np.matmul(table[start : start + _VOCAB_CHUNK], x.T, out=columns[start : start + _VOCAB_CHUNK])
            return np.ascontiguousarray(columns.T)
        out = np.empty((rows, vocab), dtype=np.float32)
        for start in range(0, vocab, _VOCAB_CHUNK):
            np.matmul(x, table[start : start + _VOCAB_CHUNK].T, out=out[:, start : start + _VOCAB_CHUNK])
        return out

    def rms_norm(self, x: np.ndarray, weight: DenseWeight | None, eps: float) -> np.ndarray:
        """x / sqrt(mean(x^2) + eps) (* weight), in float32 as Hugging Face computes it (one kernel
        call in the kernel modes, the same bits as the numpy formula)."""
        if self._rowops is not None:
            x = np.ascontiguousarray(x, dtype=np.float32)
            width = x.shape[-1]
            if weight is None:
                scale = self._ones.get(width)
                if scale is None:
                    scale = self._ones.setdefault(width, np.ones(width, dtype=np.float32))
            else:
                scale = weight.data
            rows = x.reshape(-1, width)  # the kernel takes [rows, width]
            out = np.empty_like(rows)
            self._rowops.rms_norm_rows(rows, scale, np.float32(eps), out)
            return out.reshape(x.shape)
        mean_square = np.einsum("ij,ij->i", x, x) / np.float32(x.shape[-1])
        scale = 1.0 / np.sqrt(mean_square + np.float32(eps))
        out = x * scale[:, None]
        if weight is not None:
            out *= weight.data
        return out

    def rope(self, x: np.ndarray, rotations: np.ndarray) -> np.ndarray:
        """Rotate adjacent pairs of every head as complex numbers: one multiply instead of six ops
        (in the kernel modes one kernel call, in place on a contiguous x, with the same bits)."""
        if self._rowops is not None:
            x = np.ascontiguousarray(x, dtype=np.float32)
            self._rowops.rope_rows(x, rotations)
            return x
        pairs = np.ascontiguousarray(x).view(np.complex64)
        pairs *= rotations[:, None, :]
        return pairs.view(np.float32)

    def silu_mul(self, gate_up: np.ndarray, width: int) -> np.ndarray:
        """silu(gate) * up, computed in place in `gate_up` (which it overwrites): four passes, no
        temporaries. silu(g) * u = g * u / (1 + exp(-g)); exp(-g) overflowing to inf gives the right 0.
        The kernel modes make it one kernel call into a new array (with a vectorised exp of their own,
        so the last bit may differ from numpy's)."""
        if self._rowops is not None:
            gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
            out = np.empty((gate_up.shape[0], width), dtype=np.float32)
            self._rowops.silu_mul_rows(gate_up, width, out)
            return out
        gate = gate_up[:, :width]
        up = gate_up[:, width:]
        np.multiply(gate, up, out=up)
        np.negative(gate, out=gate)
        with np.errstate(over="ignore"):
            np.exp(gate, out=gate)
        gate += 1.0
        np.divide(up, gate, out=gate)
        return gate

    def gelu_mul(self, gate_up: np.ndarray, width: int) -> np.ndarray:
        """GeGLU: gelu(gate) * up with the tanh approximation (PyTorch's gelu(approximate="tanh")),
        0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))) * u, in float32; overwrites `gate_up` (the
        kernel modes: one kernel call into a new array)."""
        if self._rowops is not None:
            gate_up = np.ascontiguousarray(gate_up, dtype=np.float32)
            out = np.empty((gate_up.shape[0], width), dtype=np.float32)
            self._rowops.gelu_mul_rows(gate_up, width, out)
            return out
        gate = gate_up[:, :width]
        up = gate_up[:, width:]
        inner = gate * gate
        inner *= np.float32(0.044715)
        inner += np.float32(1.0)
        inner *= gate
        inner *= np.float32(math.sqrt(2.0 / math.pi))
        np.tanh(inner, out=inner)
        inner += np.float32(1.0)
        inner *= np.float32(0.5)
        np.multiply(gate, up, out=up)
        np.multiply(inner, up, out=gate)
        return gate

    def exp_rows(self, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """exp without the usual row-max pass (the slowest part of a small softmax), since attention
        scores rarely leave [-69, 69]. A row keeps the unshifted exp when its sum lies in
        [1e-30, 1e30]: then what underflows is below 1e-15 of the sum, and weights @ values cannot
        overflow float32 for any |value| below 3e8. Rows outside that range are redone shifted by
        their maxima; the choice is per row, so a row's result never depends on its batch."""
        width = scores.shape[-1]
        with np.errstate(over="ignore", under="ignore"):
            weights = np.exp(scores)
        # One matrix-vector product sums every short row: 8x faster than a reduction over the last axis.
        sums = (weights.reshape(-1, width) @ np.ones(width, dtype=np.float32)).reshape(*scores.shape[:-1], 1)
        flat_weights, flat_sums = weights.reshape(-1, width), sums.reshape(-1)
        redo = ~((flat_sums >= 1e-30) & (flat_sums <= 1e30))  # NaN fails both comparisons
        if not redo.any():
            return weights, sums
        shifted = scores.reshape(-1, width)[redo]
        shifted -= shifted.max(axis=-1, keepdims=True)
        np.exp(shifted, out=shifted)
        flat_weights[redo] = shifted
        flat_sums[redo] = shifted.sum(axis=-1)
        return weights, sums

    def softmax_(self, scores: np.ndarray) -> np.ndarray:
        """In-place softmax over the last axis."""
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        return scores

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(
        self,
        cache: KVCache,
        layer: int,
        slots: np.ndarray,
        positions: np.ndarray,
        k: np.ndarray,
        v: np.ndarray,
    ) -> None:
        """Scatter each row's keys/values to its (slot, position) in place (a half cache: each value
        rounded to the nearest half, ties to even)."""
        if self._rowops is not None:
            self._rowops.write_kv_rows(
                _kernel_view(cache.keys),
                _kernel_view(cache.values),
                layer,
                slots,
                positions,
                np.ascontiguousarray(k),
                np.ascontiguousarray(v),
            )
            return
        layer_keys, layer_values = cache.keys[layer], cache.values[layer]
        layer_keys[slots, :, positions, :] = k
        layer_values[slots, :, positions, :] = v

    def attention(self, q: np.ndarray, cache: KVCache, layer: int, plan: AttentionPlan) -> np.ndarray:
        """Grouped-query attention of every row against its own sequence's cached keys/values.

        With BLAS: decode rows in one batched matmul, each prefill run on its own. With kernels: every
        row of a sequence bringing at most ROW_ATTENTION_ROWS rows (decode, verifying drafts, short
        prefill runs) through the row kernel, whose result never depends on the batch; longer prefill
        runs in causal blocks, each on its own (chunk boundaries are fixed, so a prompt's cache is the
        same under any load)."""
        keys, values = cache.keys[layer], cache.values[layer]
        if self.kernel_mode != "blas":
            return self._kernel_attention(q, keys, values, plan)
        # blas reads the cache as float32 (kv_cache_dtypes: a half cache is refused when allocated)
        rows, heads, head_dim = q.shape
        if plan.aligned and plan.decode_rows.size == rows:
            return self._decode_attention(q, keys, values, plan).reshape(rows, heads, head_dim)
        out = np.empty_like(q)
        if plan.decode_rows.size:
            dense_out = self._decode_attention(q, keys, values, plan)
            if plan.aligned:
                out[: plan.decode_rows.size] = dense_out.reshape(-1, heads, head_dim)
            else:
                picked = dense_out[plan.decode_slots - plan.slot_lo]
                out[plan.decode_rows] = picked.reshape(-1, heads, head_dim)
        for run in plan.prefill:
            self._prefill_attention(q, keys, values, run, out, plan.window, plan.softcap)
        return out

    def _kernel_attention(
        self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, plan: AttentionPlan
    ) -> np.ndarray:
        q = np.ascontiguousarray(q)
        out = np.empty_like(q)
        short = plan.short_rows(ROW_ATTENTION_ROWS)
        if short.rows.size:
            self._row_attention(
                q,
                _kernel_view(keys),
                _kernel_view(values),
                short.rows,
                short.slots,
                short.first,
                short.visible,
                out,
                plan.softcap or 0.0,
            )
        for run in plan.prefill:
            if run.length > ROW_ATTENTION_ROWS:
                rows = slice(run.row, run.row + run.length)
                self._run_attention(
                    q[rows],
                    keys[run.slot],
                    values[run.slot],
                    run.start,
                    plan.window,
                    out[rows],
                    self._block_pool(),
                    plan.softcap,
                )
        return out

    def _block_pool(self) -> ThreadPoolExecutor | None:
        """The threads that share a long prefill run's attention blocks: as many as numba's kernels
        use now (the adaptive thread count may lower it under load); None for one."""
        import numba

        count = numba.get_num_threads()
        if count <= 1:
            return None
        pool = self._pools.get(count)
        if pool is None:
            pool = self._pools[count] = ThreadPoolExecutor(count, thread_name_prefix="infer-attention")
        return pool

    def _prefill_attention(
        self,
        q: np.ndarray,
        keys: np.ndarray,
        values: np.ndarray,
        run: PrefillRun,
        out: np.ndarray,
        window: int | None = None,
        softcap: float | None = None,
    ) -> None:
        """The rows of one prefill run against their sequence's positions, causally (and within the
        sliding `window` when given: positions before the run's first row's window are not read),
        scores soft-capped when `softcap` is given, into `out`."""
        _, heads, head_dim = q.shape
        kv_heads = keys.shape[1]
        group = heads // kv_heads
        row, length, total = run.row, run.length, run.start + run.length
        first = 0 if window is None else max(0, run.start + 1 - window)
        seg_q = q[row : row + length].reshape(length, kv_heads, group, head_dim).transpose(1, 2, 0, 3)
        scores = seg_q @ keys[run.slot, :, first:total].transpose(0, 2, 1)[:, None]
        if softcap is not None:
            scores = _softcap_(scores, softcap)
        scores += causal_mask(run.start, length, window, first)
        self.softmax_(scores)
        seg_out = scores @ values[run.slot, :, first:total][:, None]
        out[row : row + length] = seg_out.transpose(2, 0, 1, 3).reshape(length, heads, head_dim)

    def _decode_attention(
        self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, plan: AttentionPlan
    ) -> np.ndarray:
        """Single-token rows of many sequences: one batched matmul over the dense run of slots
        [lo, hi); returns [hi - lo, kv_heads, group, head_dim] (slot-major)."""
        kv_heads, head_dim = keys.shape[1], q.shape[2]
        group = q.shape[1] // kv_heads
        lo, hi, width = plan.slot_lo, plan.slot_hi, plan.decode_width
        count = plan.decode_rows.size
        if plan.aligned:  # rows 0..n-1 hold slots lo..lo+n-1 in order: no gather, no scatter
            dense_q = q[:count].reshape(count, kv_heads, group, head_dim)
        else:
            dense_q = np.zeros((hi - lo, kv_heads, group, head_dim), dtype=q.dtype)
            dense_q[plan.decode_slots - lo] = q[plan.decode_rows].reshape(-1, kv_heads, group, head_dim)
        offset = plan.decode_offset  # > 0 only when every row's sliding window starts past it
        scores = dense_q @ keys[lo:hi, :, offset:width].transpose(0, 1, 3, 2)
        if plan.softcap is not None:
            scores = _softcap_(scores, plan.softcap)
        if plan.decode_mask is not None:
            scores += plan.decode_mask
        # Normalising the [.., group, head_dim] output instead of the scores saves a pass over them.
        weights, sums = self.exp_rows(scores)
        out = weights @ values[lo:hi, :, offset:width]
        out /= sums
        return out
