"""What every model family shares: the config, the checkpoint a loader hands over, the family and
model interfaces, and the load error."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

import numpy as np

if TYPE_CHECKING:
    from infer.engine.backends.base import Backend, Weight
    from infer.engine.backends.kv_cache import KVCache
    from infer.engine.batch import ForwardBatch
    from infer.engine.text.tokenizer import Tokenizer


class ModelLoadError(Exception):
    """A model file or folder cannot be loaded; the message names the file or field and the problem."""


RopeLayout = Literal["interleaved", "half"]
"""How RoPE pairs the dimensions of a head.

`interleaved`: (0,1), (2,3), ... -- llama.cpp's "normal" mode; GGUF llama-family q/k weights are
permuted into it by the converter. `half`: (i, i + d/2) -- Hugging Face's rotate_half ("neox")."""


@dataclass(frozen=True)
class ModelConfig:
    """Architecture hyper-parameters, with Hugging Face field names."""

    architecture: str
    """Family name: llama, mistral, qwen2 (smollm2 is llama)."""
    vocab_size: int
    """Rows of the embedding table."""
    hidden_size: int
    """Width of the residual stream."""
    intermediate_size: int
    """Width of the SwiGLU feed-forward layer."""
    num_hidden_layers: int
    """Number of transformer blocks."""
    num_attention_heads: int
    """Query heads per layer."""
    num_key_value_heads: int
    """Key/value heads per layer (grouped-query attention when fewer than query heads)."""
    head_dim: int
    """Width of one attention head."""
    rms_norm_eps: float
    """Epsilon inside RMSNorm."""
    rope_theta: float
    """RoPE base frequency."""
    max_position_embeddings: int
    """Context length the model was trained for."""
    tie_word_embeddings: bool
    """The output projection reuses the embedding table."""
    attention_bias: bool = False
    """q/k/v projections carry a bias (Qwen2)."""
    rope_layout: RopeLayout = "half"
    """Pairing of RoPE dimensions in the stored q/k weights."""
    rope_scaling: dict[str, Any] = field(default_factory=dict)
    """Hugging Face rope_scaling (llama3, linear), empty when none."""


SUPPORTED_ROPE_TYPES = frozenset({"default", "linear", "llama3"})
"""RoPE scaling kinds the models compute (`inverse_frequencies`); any other is refused at load."""


def hf_rope(
    raw: Mapping[str, Any],
    default_theta: float,
    layer_type: str | None = None,
    supported: frozenset[str] = SUPPORTED_ROPE_TYPES,
) -> tuple[float, dict[str, Any]]:
    """The RoPE base and scaling of a Hugging Face config.json, as (rope_theta, rope_scaling).

    Reads both spellings: transformers 4's `rope_theta` + `rope_scaling`, and transformers 5's
    `rope_parameters`, which is either one dict or, for models that mix attention kinds (Gemma 3),
    one dict per layer type (`layer_type`: "full_attention" or "sliding_attention"). A scaling kind
    the models do not compute (yarn, dynamic, longrope, ...; a family that computes more passes its
    `supported` kinds) raises ValueError naming it, so no setting of the file is read and then
    ignored. `rope_scaling` comes back empty for "default".
    """
    params = raw.get("rope_parameters")
    if isinstance(params, Mapping) and layer_type is not None and layer_type in params:
        params = params[layer_type]
    elif isinstance(params, Mapping) and any(isinstance(v, Mapping) for v in params.values()):
        raise ValueError(f"rope_parameters has no entry for {layer_type or 'the model'}: {sorted(params)}")
    if isinstance(params, Mapping):
        theta = float(params.get("rope_theta", raw.get("rope_theta", default_theta)))
        scaling = {k: v for k, v in params.items() if k != "rope_theta"}
    else:
        theta = float(raw.get("rope_theta", default_theta))
        scaling = dict(raw.get("rope_scaling") or {})
    kind = scaling.get("rope_type") or scaling.get("type") or "default"
    if kind not in supported:
        raise ValueError(
            f"RoPE scaling {kind!r} is not supported (supported: {', '.join(sorted(supported))})"
        )
    return theta, ({} if kind == "default" else scaling)


def gguf_rope_scaling(meta: Mapping[str, Any], architecture: str, source: str) -> dict[str, Any]:
    """The RoPE scaling a GGUF's `{arch}.rope.scaling.*` keys ask for, as a Hugging Face
    rope_scaling dict: empty for none, linear with its factor; any other kind (yarn, ...) is a
    ModelLoadError naming it, never silently dropped."""
    kind = meta.get(f"{architecture}.rope.scaling.type")
    if kind in (None, "none"):
        return {}
    if kind != "linear":
        raise ModelLoadError(
            f"{source}: RoPE scaling {kind!r} ({architecture}.rope.scaling.type) is not supported"
        )
    factor = meta.get(f"{architecture}.rope.scaling.factor")
    if not isinstance(factor, (int, float)) or factor <= 0:
        raise ModelLoadError(f"{source}: {architecture}.rope.scaling.factor must be positive, got {factor!r}")
    return {"rope_type": "linear", "factor": float(factor)}


@dataclass(frozen=True)
class QuantizedTensor:
    """A checkpoint matrix kept as stored: a GGUF tensor's rows of blocks (memory-mapped, never copied).

    `blocks` is uint8 [rows, row_bytes]; `shape` the logical [out, in] (or [count, out, in] for a
    stack of matrices, its rows one after another). `np.asarray(tensor)` dequantizes
    it to float32, so code that wants floats (a dense backend, tests) just asks for an array, while a
    backend with kernels for `type_name` computes on the blocks themselves.
    """

    blocks: np.ndarray
    type_name: str
    """GGUF type name (gguf.GGMLQuantizationType): Q4_1, Q8_0, Q4_K, F16, ..."""
    shape: tuple[int, ...]

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        from gguf import GGMLQuantizationType
        from gguf.quants import dequantize

        dense = dequantize(self.blocks, GGMLQuantizationType[self.type_name]).reshape(self.shape)
        return np.asarray(dense, dtype=np.float32 if dtype is None else dtype)

    def matrix(self, index: int) -> QuantizedTensor:
        """Matrix `index` of a stack [count, out, in] (a mixture-of-experts layer's experts): a view
        of its rows of blocks, no copy."""
        count, out, cols = self.shape
        if not 0 <= index < count:
            raise IndexError(f"matrix {index} of a stack of {count}")
        return QuantizedTensor(self.blocks[index * out : (index + 1) * out], self.type_name, (out, cols))

    def with_rows(self, order: np.ndarray) -> QuantizedTensor:
        """The same tensor with its rows (whole rows of blocks) taken in `order`: itself when that is
        their order already (llama.cpp's llama-family q/k), else a copy. (Gathering in the identity
        order read every page of the file map into a copy the backend then copied again, and those
        file pages stayed resident: 35 MB on the Llama 3.2 1B shape.)"""
        if np.array_equal(order, np.arange(len(self.blocks))):
            return self
        return QuantizedTensor(np.ascontiguousarray(self.blocks[order]), self.type_name, self.shape)


Tensor = np.ndarray | QuantizedTensor
"""A checkpoint tensor: float32 (vectors, F32 matrices, safetensors) or GGUF blocks."""


@dataclass
class Checkpoint:
    """What a loader hands the model: config, named weights (the family's canonical names, Hugging
    Face's for the llama family, [out, in]; float32 arrays or GGUF blocks) and tokenizer."""

    config: ModelConfig
    weights: dict[str, Tensor]
    tokenizer: Tokenizer
    source: str
    """The file or folder it came from (for messages and fingerprints)."""


class Model(Protocol):
    """A model built on a backend: what the step loop calls."""

    config: ModelConfig
    float_copies: set[str]
    """GGUF types of matrices the model holds as float32 copies because its backend computes on blocks
    but has no kernels for them (the CLI says so once); empty when every matrix runs as stored."""

    @property
    def vocab_size(self) -> int:
        """Rows of the output projection (logits per row)."""
        ...

    def make_cache(self, slots: int, capacity: int, dtype: str = "f32") -> KVCache:
        """A KV cache (created by the backend) for `slots` sequences of up to `capacity` tokens,
        stored in `dtype` (a `kv_cache_dtype`: f32 or f16; BackendError when the backend lacks it)."""
        ...

    def forward(self, batch: ForwardBatch, cache: KVCache) -> np.ndarray:
        """Run every row of `batch` (positions from its segments), write its keys/values into `cache`,
        return host float32 logits [len(batch.logit_rows), vocab]."""
        ...

    # Also, for device sampling (the built-in families have it; a host-only family may leave it out,
    # and the engine then samples every row on the host):
    #   backend: Backend
    #   def forward_logits(self, batch, cache) -> Array: `forward` with the logits left on the device.


class ModelFamily(Protocol):
    """One family of architectures: how its checkpoints map onto a ModelConfig and canonical tensor
    names, the shapes those tensors must have, and the model class that runs them.

    Loaders read metadata and tensors and hand them over; nothing about a family lives in a loader.
    """

    architectures: tuple[str, ...]
    """Architecture names (GGUF `general.architecture`, ModelConfig.architecture) this family runs."""
    hf_architectures: Mapping[str, str]
    """config.json `architectures` class names -> architecture name."""

    def gguf_tensor_name(self, name: str) -> str | None:
        """The canonical name of GGUF tensor `name`, or None for a tensor the family does not use."""
        ...

    def config_from_gguf(
        self, meta: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        """The config from GGUF metadata (and which canonical tensors exist); ModelLoadError naming
        `source` and the field on a missing or bad value."""
        ...

    def config_from_hf(
        self, raw: Mapping[str, Any], architecture: str, weights: Mapping[str, np.ndarray], source: str
    ) -> ModelConfig:
        """The config from a Hugging Face config.json (and which tensors exist)."""
        ...

    def check_weights(self, config: ModelConfig, weights: dict[str, np.ndarray], source: str) -> None:
        """ModelLoadError naming the first missing tensor or shape that disagrees with `config`; may
        drop tensors the config makes redundant (a tied output head)."""
        ...

    def build(self, checkpoint: Checkpoint, backend: Backend) -> Model:
        """The model for `checkpoint` on `backend` (takes the checkpoint's weights)."""
        ...


def check_shapes(
    expected: Mapping[str, tuple[int, ...]], weights: Mapping[str, np.ndarray], source: str
) -> None:
    """ModelLoadError for the first name of `expected` missing from `weights` or of another shape."""
    for name, shape in expected.items():
        if name not in weights:
            raise ModelLoadError(f"{source}: missing tensor {name}")
        if tuple(weights[name].shape) != shape:
            raise ModelLoadError(
                f"{source}: tensor {name} has shape {tuple(weights[name].shape)}, the config implies {shape}"
            )


_LAYER_TENSOR = re.compile(r"model\.layers\.(\d+)\.")
_IGNORED_TENSOR_SUFFIXES = ("rotary_emb.inv_freq",)
"""Layer tensors some exporters store that no model reads (older transformers saved RoPE tables)."""


def check_no_stray_layers(
    expected: Mapping[str, tuple[int, ...]], weights: Mapping[str, np.ndarray], num_layers: int, source: str
) -> None:
    """ModelLoadError for the first layer tensor (`model.layers.N.`) that `expected` does not list:
    a layer beyond the config's layer count, or a tensor the family does not know. The other
    direction of :func:`check_shapes`: the config must account for every layer the file holds."""
    for name in sorted(weights):
        match = _LAYER_TENSOR.match(name)
        if match is None or name in expected or name.endswith(_IGNORED_TENSOR_SUFFIXES):
            continue
        layer = int(match.group(1))
        if layer >= num_layers:
            raise ModelLoadError(
                f"{source}: tensor {name} belongs to layer {layer}, but the config has {num_layers} "
                "layers (num_hidden_layers / block_count)"
            )
        raise ModelLoadError(f"{source}: unexpected tensor {name} (this architecture has no such weight)")


def matrix_weight(backend: Backend, float_copies: set[str], tensors: tuple[Tensor, ...]) -> Weight:
    """One weight whose rows are `tensors`' rows in order: kept in their GGUF blocks where `backend`
    computes on that type, else as one float32 matrix. A quantized type the backend has kernels for
    none of is added to `float_copies` (the CLI's notice), so no family writes this twice."""
    if backend.block_formats:  # the backend has kernels: note the types it has none for
        float_copies.update(
            t.type_name
            for t in tensors
            if isinstance(t, QuantizedTensor) and t.type_name not in backend.block_formats
        )
    if all(isinstance(t, QuantizedTensor) and t.type_name in backend.block_formats for t in tensors):
        blocks = [backend.weight(t.blocks, quant=t.type_name, shape=t.shape) for t in tensors]  # type: ignore[union-attr]
        return blocks[0] if len(blocks) == 1 else backend.stack(blocks)
    return backend.weight(
        np.concatenate([np.asarray(t) for t in tensors]) if len(tensors) > 1 else tensors[0]
    )


def gguf_number(
    meta: Mapping[str, Any], full: str, source: str, kind: type, default: Any = None, *, positive: bool = True
) -> Any:
    """GGUF metadata field `full` as `kind` (`default` when absent and a default is given); a missing,
    non-numeric or (with `positive`) non-positive value is a ModelLoadError naming `source`."""
    if full not in meta:
        if default is None:
            raise ModelLoadError(f"{source}: missing metadata field {full}")
        return default
    try:
        value = kind(meta[full])
    except (TypeError, ValueError):
        raise ModelLoadError(
            f"{source}: metadata field {full} must be a number, got {meta[full]!r}"
        ) from None
    if positive and value <= 0:
        raise ModelLoadError(f"{source}: metadata field {full} must be positive, got {value}")
    return value


@contextmanager
def config_fields(source: str) -> Iterator[None]:
    """Turn a missing field (KeyError) or a bad value (TypeError, ValueError) of a config read inside
    the block into a ModelLoadError naming `source`."""
    try:
        yield
    except KeyError as exc:
        raise ModelLoadError(f"{source}: missing field {exc.args[0]}") from None
    except (TypeError, ValueError) as exc:
        raise ModelLoadError(f"{source}: bad value ({exc})") from None


class DecoderModel:
    """What the built-in families' model classes share around their own `forward_logits`: matrices
    from checkpoint tensors, the KV cache, and the host copy of the logits. A family's class sets
    `config`, `backend` and `float_copies` and defines `forward_logits` and `vocab_size`."""

    config: ModelConfig
    backend: Backend
    float_copies: set[str]

    def _matrix(self, *tensors: Tensor) -> Weight:
        """One weight whose rows are `tensors`' rows in order: kept in their GGUF blocks where the
        backend computes on that type, else as one float32 matrix."""
        return matrix_weight(self.backend, self.float_copies, tensors)

    def make_cache(self, slots: int, capacity: int, dtype: str = "f32") -> KVCache:
        """A KV cache for `slots` sequences of up to `capacity` tokens, stored in `dtype`."""
        from infer.engine.backends.kv_cache import KVCache

        c = self.config
        return KVCache.allocate(
            self.backend, c.num_hidden_layers, slots, c.num_key_value_heads, capacity, c.head_dim, dtype
        )

    def forward(self, batch: ForwardBatch, cache: KVCache) -> np.ndarray:
        """Run every row of `batch` (positions from its segments' `start`), write its keys/values
        into `cache`, return logits [logit_rows, vocab] on the host."""
        return self.backend.to_host(self.forward_logits(batch, cache))  # type: ignore[attr-defined]
