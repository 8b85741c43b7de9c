"""The Metal backend: MLX on Apple silicon, and the same code on MLX's Linux CPU build (`mlx[cpu]`).

GGUF Q4_0/Q4_1/Q8_0 matrices run quantized: their blocks become MLX affine groups of 32
(gguf_affine, bit-exact) for `mx.quantized_matmul`. Other types reach `weight` as floats. Norms go
through `mx.fast.rms_norm`, attention through `mx.fast.scaled_dot_product_attention` (GQA without
tiling the keys). MLX's known traps, each handled here: a slice is a copy, so KV writes scatter into
the whole cache array (`cache.keys[layer, slots, :, positions] = k`, never through `keys[layer]`);
indexing takes mx arrays, never numpy ones; `mx.load` turns BF16 into float16, so checkpoints come
through our loader and reach MLX as float32 numpy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from infer.engine.backends.attention import AttentionPlan, causal_mask
from infer.engine.backends.base import Capabilities, HostSetup, device_capabilities
from infer.engine.backends.errors import BackendError
from infer.engine.backends.gguf_affine import GROUP, dequantize_affine, to_affine
from infer.engine.backends.kv_cache import KVCache

QUANT_FORMATS: tuple[str, ...] = ("Q4_0", "Q4_1", "Q8_0")
"""GGUF block types MLX multiplies quantized (affine, group size 32)."""


def _mx() -> Any:
    """mlx.core, imported on first use so the package imports without MLX."""
    import mlx.core as mx

    return mx


@dataclass(frozen=True)
class MlxDense:
    """A weight held as one MLX array in the compute dtype."""

    data: Any

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical shape of the weight."""
        return tuple(self.data.shape)


@dataclass(frozen=True)
class MlxQuant:
    """A GGUF matrix as MLX affine groups of 32 (packed uint32 words, scales, biases)."""

    packed: Any
    scales: Any
    biases: Any
    bits: int
    shape: tuple[int, ...]


@dataclass(frozen=True)
class MlxStacked:
    """Quantized matrices of different bit widths whose rows stack into one weight."""

    parts: tuple[MlxQuant, ...]
    shape: tuple[int, ...]


MlxWeight = MlxDense | MlxQuant | MlxStacked


class MetalBackend(HostSetup):
    """MLX implementation of the Backend protocol (float32, float16 or bfloat16 compute)."""

    name: ClassVar[str] = "metal"
    capabilities: ClassVar[Capabilities] = device_capabilities(QUANT_FORMATS)
    implemented: ClassVar[bool] = True

    def __init__(self, dtype: str = "float32") -> None:
        self.require_dtype(dtype)
        mx = self.require_library(_mx, "mlx", "metal")
        self.dtype = dtype
        self.mx = mx
        """mlx.core (the array module the envelope sampler runs on)."""
        self._dtype = getattr(mx, dtype)
        self.on_gpu = mx.default_device().type == mx.gpu
        """True on Metal; False on MLX's CPU build (or a Mac told to use its CPU)."""
        self.quantized_matmul = dtype == "float32" or self.on_gpu
        """Whether GGUF blocks stay quantized. MLX's CPU quantized matmul in float16/bfloat16 runs
        10-65x slower than float32 (no half-precision SIMD there), so on the CPU those dtypes take
        the blocks dequantized (exactly, see gguf_affine) into dense matrices of the dtype."""

    @property
    def block_formats(self) -> frozenset[str]:
        """GGUF types multiplied as affine groups: Q4_0, Q4_1, Q8_0."""
        return frozenset(QUANT_FORMATS)

    @staticmethod
    def probe() -> str | None:
        """None when MLX imports, multiplies a tiny matrix and picks sampling candidates exactly as
        numpy does; else the reason. MLX without Metal (Linux `mlx[cpu]`) counts as usable: the
        backend's code runs there on the CPU."""
        try:
            mx = _mx()
        except ImportError:
            return "mlx is not installed"
        except Exception as exc:
            return f"mlx failed to import: {type(exc).__name__}: {exc}"
        from infer.engine.backends.probe_ops import check_array_module

        return check_array_module(mx, lambda a: np.array(a), "mlx")

    # -- weights and host data ------------------------------------------------------------------
    def weight(
        self, array: np.ndarray, *, quant: str | None = None, shape: tuple[int, ...] | None = None
    ) -> MlxWeight:
        """A dense array in the compute dtype, or GGUF blocks of `quant` (Q4_0/Q4_1/Q8_0) of logical
        `shape` [out, in] as affine groups (scales and biases in the compute dtype: exact, see
        gguf_affine); dequantized to a dense matrix where `quantized_matmul` is False."""
        mx = self.mx
        if quant is None:
            return self._ready(MlxDense(mx.array(np.asarray(array, dtype=np.float32)).astype(self._dtype)))
        if quant not in QUANT_FORMATS or shape is None or len(shape) != 2 or shape[1] % GROUP:
            raise BackendError(
                f"the metal backend computes on no {quant} blocks of shape {shape}; pass it as floats"
            )
        groups = to_affine(array, quant, (int(shape[0]), int(shape[1])))
        if not self.quantized_matmul:
            return self._ready(MlxDense(mx.array(dequantize_affine(groups)).astype(self._dtype)))
        return self._ready(
            MlxQuant(
                mx.array(groups.packed),
                mx.array(groups.scales).astype(self._dtype),
                mx.array(groups.biases).astype(self._dtype),
                groups.bits,
                (int(shape[0]), int(shape[1])),
            )
        )

    def _ready(self, weight: MlxWeight) -> MlxWeight:
        """`weight` with its arrays evaluated now. An unevaluated MLX array belongs to the stream of the
        thread that made it, and the engine's step loop may run in another thread (the server's)."""
        if isinstance(weight, MlxStacked):
            for part in weight.parts:
                self._ready(part)
        elif isinstance(weight, MlxQuant):
            self.mx.eval(weight.packed, weight.scales, weight.biases)
        else:
            self.mx.eval(weight.data)
        return weight

    def stack(self, weights: Sequence[MlxWeight]) -> MlxWeight:
        """One weight whose rows are `weights`' rows in order: dense or same-width quantized matrices
        are concatenated, others kept as parts."""
        mx = self.mx
        if all(isinstance(w, MlxDense) for w in weights):
            return self._ready(MlxDense(mx.concatenate([w.data for w in weights])))  # type: ignore[union-attr]
        if not all(isinstance(w, MlxQuant) for w in weights):
            raise BackendError("cannot stack dense and quantized weights into one")
        parts: tuple[MlxQuant, ...] = tuple(weights)  # type: ignore[arg-type]
        rows = sum(p.shape[0] for p in parts)
        if len({p.bits for p in parts}) == 1:
            return self._ready(
                MlxQuant(
                    mx.concatenate([p.packed for p in parts]),
                    mx.concatenate([p.scales for p in parts]),
                    mx.concatenate([p.biases for p in parts]),
                    parts[0].bits,
                    (rows, parts[0].shape[1]),
                )
            )
        return MlxStacked(parts, (rows, parts[0].shape[1]))

    def asarray(self, host: np.ndarray) -> Any:
        """Host data as an MLX array of the same dtype (float64 becomes float32: MLX's GPU has none)."""
        host = np.asarray(host)
        if host.dtype == np.float64:
            host = host.astype(np.float32)
        return self.mx.array(host)

    def to_host(self, array: Any) -> np.ndarray:
        """A numpy copy (bfloat16 widened to float32, which numpy lacks)."""
        if array.dtype == self.mx.bfloat16:
            array = array.astype(self.mx.float32)
        return np.array(array)

    @property
    def sampling_module(self) -> Any:
        """mlx.core: requests inside the envelope are drawn from candidates picked on the device."""
        return self.mx

    def softcap(self, x: Any, cap: float) -> Any:
        """cap * tanh(x / cap), in float32."""
        x = x.astype(self.mx.float32)
        return self.mx.tanh(x / cap) * cap

    def zeros(self, shape: tuple[int, ...]) -> Any:
        """Zeros in the compute dtype, evaluated (see `_ready`)."""
        zeros = self.mx.zeros(shape, dtype=self._dtype)
        self.mx.eval(zeros)
        return zeros

    # -- ops on activations ---------------------------------------------------------------------
    def _activation(self, x: Any) -> Any:
        return x if x.dtype == self._dtype else x.astype(self._dtype)

    def embed(self, table: MlxWeight, ids: np.ndarray) -> Any:
        """Rows `ids` of the table (quantized rows dequantized)."""
        mx = self.mx
        index = mx.array(np.asarray(ids, dtype=np.int64).astype(np.int32))
        if isinstance(table, MlxQuant):
            return mx.dequantize(
                table.packed[index],
                table.scales[index],
                table.biases[index],
                group_size=GROUP,
                bits=table.bits,
            )
        if isinstance(table, MlxStacked):
            raise BackendError("an embedding table cannot be a stack of matrices")
        return table.data[index]

    def _product(self, x: Any, weight: MlxWeight) -> Any:
        mx = self.mx
        x = self._activation(x)
        if isinstance(weight, MlxDense):
            return x @ weight.data.T
        if isinstance(weight, MlxStacked):
            return mx.concatenate([self._product(x, p) for p in weight.parts], axis=-1)
        return mx.quantized_matmul(
            x, weight.packed, weight.scales, weight.biases, transpose=True, group_size=GROUP, bits=weight.bits
        )

    def linear(self, x: Any, weight: MlxWeight, bias: MlxDense | None = None) -> Any:
        """x @ weight.T (+ bias), quantized weights through `mx.quantized_matmul`."""
        out = self._product(x, weight)
        return out if bias is None else out + bias.data

    def logits(self, x: Any, table: MlxWeight) -> Any:
        """The vocabulary projection, in float32."""
        return self._product(x, table).astype(self.mx.float32)

    def rms_norm(self, x: Any, weight: MlxDense | None, eps: float) -> Any:
        """`mx.fast.rms_norm` (float32 accumulation whatever the dtype)."""
        mx = self.mx
        x = self._activation(x)
        scale = weight.data if weight is not None else mx.ones((x.shape[-1],), dtype=x.dtype)
        return mx.fast.rms_norm(x, scale, eps)

    def rope(self, x: Any, rotations: Any) -> Any:
        """Rotate adjacent pairs (2i, 2i + 1) by the complex `rotations` [T, d/2], as the cpu backend's
        complex multiply: (a + ib)(c + is) = (ac - bs) + i(as + bc), in float32. The model's rotations
        carry its per-position angles (and q's score scale), so `mx.fast.rope`'s own frequencies
        are not used."""
        mx = self.mx
        rows, heads, dim = x.shape
        pairs = x.astype(mx.float32).reshape(rows, heads, dim // 2, 2)
        even, odd = pairs[..., 0], pairs[..., 1]
        cos = mx.real(rotations)[:, None, :]
        sin = mx.imag(rotations)[:, None, :]
        out = mx.stack([even * cos - odd * sin, even * sin + odd * cos], axis=-1)
        return out.reshape(rows, heads, dim).astype(self._dtype)

    def silu_mul(self, gate_up: Any, width: int) -> Any:
        """silu(gate) * up for gate_up = [gate | up]."""
        mx = self.mx
        gate, up = gate_up[:, :width], gate_up[:, width:]
        return gate * mx.sigmoid(gate) * up

    def gelu_mul(self, gate_up: Any, width: int) -> Any:
        """GeGLU: gelu(gate) * up with the tanh approximation, for gate_up = [gate | up]."""
        mx = self.mx
        gate, up = gate_up[:, :width], gate_up[:, width:]
        inner = math.sqrt(2.0 / math.pi) * (gate + 0.044715 * gate * gate * gate)
        return 0.5 * gate * (1.0 + mx.tanh(inner)) * up

    # -- the KV cache ---------------------------------------------------------------------------
    def write_kv(
        self, cache: KVCache, layer: int, slots: np.ndarray, positions: np.ndarray, k: Any, v: Any
    ) -> None:
        """Scatter each row's keys/values into the whole cache array (a write through `keys[layer]`
        would land in a copy and be lost)."""
        mx = self.mx
        slot_index = mx.array(np.asarray(slots, dtype=np.int32))
        position_index = mx.array(np.asarray(positions, dtype=np.int32))
        # No trailing `:` in the index: MLX 0.32 fails to broadcast the update with one.
        cache.keys[layer, slot_index, :, position_index] = k.astype(cache.keys.dtype)
        cache.values[layer, slot_index, :, position_index] = v.astype(cache.values.dtype)

    def attention(self, q: Any, cache: KVCache, layer: int, plan: AttentionPlan) -> Any:
        """Decode rows through one `scaled_dot_product_attention` over their slots (a boolean mask
        hides each row's positions past its own), each prefill run through one more with a causal
        mask; the scale is 1 (the model folds 1/sqrt(d) into q's rotations)."""
        if plan.softcap is not None:
            raise BackendError(
                "attention soft-capping (Gemma 2) is not implemented on the metal backend yet; "
                "use --profile cpu"
            )
        mx = self.mx
        rows = q.shape[0]
        q = self._activation(q)
        pieces: list[Any] = []
        order: list[np.ndarray] = []
        if plan.decode_rows.size:
            slots = plan.decode_slots
            slot_index = mx.array(slots.astype(np.int32))
            width, offset = plan.decode_width, plan.decode_offset  # offset > 0 only with a window
            keys = cache.keys[layer, slot_index, :, offset:width]
            values = cache.values[layer, slot_index, :, offset:width]
            mask = None
            if plan.decode_mask is not None:
                mask = mx.array(plan.decode_mask[slots - plan.slot_lo] == 0)  # [n, 1, 1, width]: True = seen
            dense_q = q[mx.array(plan.decode_rows.astype(np.int32))][:, :, None, :]
            out = mx.fast.scaled_dot_product_attention(dense_q, keys, values, scale=1.0, mask=mask)
            pieces.append(out[:, :, 0, :])
            order.append(plan.decode_rows)
        for run in plan.prefill:
            total = run.start + run.length
            run_q = q[run.row : run.row + run.length].transpose(1, 0, 2)[None]
            keys = cache.keys[layer, run.slot, :, :total][None]
            values = cache.values[layer, run.slot, :, :total][None]
            mask = mx.array(causal_mask(run.start, run.length, plan.window) == 0)
            out = mx.fast.scaled_dot_product_attention(run_q, keys, values, scale=1.0, mask=mask)
            pieces.append(out[0].transpose(1, 0, 2))
            order.append(np.arange(run.row, run.row + run.length))
        if len(pieces) == 1 and np.array_equal(order[0], np.arange(rows)):
            return pieces[0]
        stacked = mx.concatenate(pieces)
        inverse = np.empty(rows, dtype=np.int32)
        inverse[np.concatenate(order)] = np.arange(rows, dtype=np.int32)
        return stacked[mx.array(inverse)]
