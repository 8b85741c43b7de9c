"""Qwen3-MoE (Qwen3-30B-A3B and kin): Qwen3's attention with a mixture-of-experts feed-forward layer.

A router (a linear layer) scores every expert per token; softmax in float32, the top k are kept and,
with `norm_topk_prob`, renormalised to sum to 1 (llama.cpp always does for this architecture). Each
chosen expert is a SwiGLU layer; their outputs, each times its weight, are summed in expert order (as
transformers' index_add does). Routing runs on the host: which rows go to which expert.

A token's result depends only on its own row: each expert multiplies its rows with the same kernels
that run every row on its own, so the tokens beside it (which pick other experts) never change it.
GGUF files stack each layer's experts (`ffn_{gate,up,down}_exps`, [experts, out, in]); every expert
is a view of its rows of that stack, not a copy. Safetensors folders name them one by one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from infer.engine.backends.base import Array, Backend, Weight
from infer.engine.models.base import (
    Checkpoint,
    ModelConfig,
    ModelLoadError,
    QuantizedTensor,
    Tensor,
)
from infer.engine.models.decoder import (
    LLAMA_GGUF_LAYER_NAMES,
    DecoderConfig,
    DecoderFamily,
    DecoderLayer,
    DecoderStack,
    GgufNumber,
    LayerNames,
)
from infer.engine.models.qwen3 import QWEN3_LAYER_NAMES

_PROJECTIONS = ("gate_proj", "up_proj", "down_proj")
_GGUF_LAYER_NAMES = {
    **LLAMA_GGUF_LAYER_NAMES,
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_gate_exps.weight": "mlp.experts.gate_proj.weight",
    "ffn_up_exps.weight": "mlp.experts.up_proj.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj.weight",
}
"""GGUF's stacked experts under `mlp.experts.<projection>.weight` ([experts, out, in])."""


@dataclass(frozen=True)
class MoeConfig(DecoderConfig):
    """DecoderConfig plus the mixture of experts (Hugging Face names)."""

    num_experts: int = 0
    """Experts per layer."""
    num_experts_per_tok: int = 0
    """Experts each token is routed to."""
    moe_intermediate_size: int = 0
    """Width of one expert's SwiGLU layer."""
    norm_topk_prob: bool = True
    """The chosen experts' weights are renormalised to sum to 1."""
    dense_layers: tuple[int, ...] = ()
    """Layers with a dense feed-forward layer instead (`mlp_only_layers`, `decoder_sparse_step`)."""


@dataclass
class Experts:
    """One layer's router and experts: stacked for the backend's grouped product (`expert_linear`)
    where it has one, else one weight per expert."""

    router: Weight  # [experts, hidden]
    gate_up: list[Weight]  # per expert [2 * moe_intermediate, hidden]; empty when stacked
    down: list[Weight]  # per expert [hidden, moe_intermediate]; empty when stacked
    gate_up_stack: Weight | None = None  # [experts, 2 * moe_intermediate, hidden]
    down_stack: Weight | None = None  # [experts, hidden, moe_intermediate]


def _expert(weights: Mapping[str, Tensor], prefix: str, projection: str, index: int) -> Tensor:
    """Expert `index`'s `projection` matrix: a view of the GGUF stack, or the folder's own tensor."""
    stacked = weights.get(f"{prefix}mlp.experts.{projection}.weight")
    if stacked is None:
        return weights[f"{prefix}mlp.experts.{index}.{projection}.weight"]
    if isinstance(stacked, QuantizedTensor):
        return stacked.matrix(index)
    return np.asarray(stacked)[index]


class Qwen3MoeFamily(DecoderFamily):
    """The Qwen3-MoE family's declaration for the model registry."""

    architectures: tuple[str, ...] = ("qwen3moe",)
    hf_architectures: Mapping[str, str] = {"Qwen3MoeForCausalLM": "qwen3moe"}
    gguf_layer_names: Mapping[str, str] = _GGUF_LAYER_NAMES
    layer_names: LayerNames = QWEN3_LAYER_NAMES
    gguf_rope_layout: Mapping[str, str] = {"qwen3moe": "half"}
    default_rope_theta: float = 1_000_000.0
    config_class: type[DecoderConfig] = MoeConfig

    def gguf_fields(
        self, meta: Mapping[str, Any], number: GgufNumber, base: dict[str, Any]
    ) -> dict[str, Any]:
        """q/k norm per head; the experts' count, how many a token uses, their width (every layer
        sparse, weights renormalised: llama.cpp hard-codes both for qwen3moe)."""
        return {
            "qk_norm": "head",
            "num_experts": number("expert_count", int),
            "num_experts_per_tok": number("expert_used_count", int),
            "moe_intermediate_size": number("expert_feed_forward_length", int),
        }

    def hf_fields(self, raw: Mapping[str, Any], base: dict[str, Any]) -> dict[str, Any]:
        """q/k norm per head; the experts (transformers 5 calls the count num_local_experts)."""
        layers = base["num_hidden_layers"]
        step = int(raw.get("decoder_sparse_step") or 1)
        only = {int(i) for i in raw.get("mlp_only_layers") or ()}
        return {
            "qk_norm": "head",
            "num_experts": int(raw.get("num_local_experts") or raw["num_experts"]),
            "num_experts_per_tok": int(raw["num_experts_per_tok"]),
            "moe_intermediate_size": int(raw["moe_intermediate_size"]),
            "norm_topk_prob": bool(raw.get("norm_topk_prob", True)),
            "dense_layers": tuple(i for i in range(layers) if i in only or (i + 1) % step != 0),
        }

    def expected_shapes(self, config: ModelConfig) -> dict[str, tuple[int, ...]]:
        """The shared shapes, with each sparse layer's router and experts in place of its dense
        feed-forward layer (experts as the stacks GGUF files hold; `check_weights` accepts one by one)."""
        shapes = super().expected_shapes(config)
        if not isinstance(config, MoeConfig):
            return shapes
        hidden, width, count = config.hidden_size, config.moe_intermediate_size, config.num_experts
        for i in range(config.num_hidden_layers):
            if i in config.dense_layers:
                continue
            p = f"model.layers.{i}.mlp."
            for name in _PROJECTIONS:
                del shapes[f"{p}{name}.weight"]
            shapes[p + "gate.weight"] = (count, hidden)
            shapes[p + "experts.gate_proj.weight"] = (count, width, hidden)
            shapes[p + "experts.up_proj.weight"] = (count, width, hidden)
            shapes[p + "experts.down_proj.weight"] = (count, hidden, width)
        return shapes

    def stored_shapes(self, config: ModelConfig, weights: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
        """`expected_shapes`, with an expert stack the checkpoint does not hold expected one tensor
        per expert instead, as a safetensors folder names them."""
        expected = self.expected_shapes(config)
        if not isinstance(config, MoeConfig):
            return expected
        for name in [n for n in expected if ".mlp.experts." in n and n not in weights]:
            prefix, projection = name.split(".mlp.experts.")
            shape = expected.pop(name)
            for e in range(config.num_experts):
                expected[f"{prefix}.mlp.experts.{e}.{projection}"] = shape[1:]
        return expected

    def check_weights(self, config: ModelConfig, weights: dict[str, Any], source: str) -> None:
        """The experts' counts, then the shared checks (experts stacked, or one by one)."""
        if not isinstance(config, MoeConfig) or not 0 < config.num_experts_per_tok <= config.num_experts:
            raise ModelLoadError(f"{source}: a mixture of experts needs 0 < experts per token <= experts")
        super().check_weights(config, weights, source)

    def build(self, checkpoint: Checkpoint, backend: Backend) -> Qwen3MoeModel:
        """A Qwen3MoeModel on `backend`."""
        return Qwen3MoeModel(checkpoint, backend, self.layer_names, self.norm_weight)


QWEN3MOE_FAMILY = Qwen3MoeFamily()
"""The instance the registry holds."""


def route(logits: np.ndarray, top_k: int, renormalise: bool) -> tuple[np.ndarray, np.ndarray]:
    """(experts [rows, k], weights [rows, k] float32) of router logits [rows, experts]: softmax in
    float32, the k largest (ties to the lower index), renormalised to sum to 1 when asked."""
    logits = np.asarray(logits, dtype=np.float32)
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    probs = shifted / shifted.sum(axis=-1, keepdims=True)
    chosen = np.argsort(-probs, axis=-1, kind="stable")[:, :top_k]
    picked = np.take_along_axis(probs, chosen, axis=-1)
    if renormalise:
        picked = picked / picked.sum(axis=-1, keepdims=True)
    return chosen, picked.astype(np.float32)


class Qwen3MoeModel(DecoderStack):
    """The shared block with a mixture of experts in each sparse layer."""

    config: MoeConfig

    def _mlp_weights(self, index: int, weights: dict[str, Tensor], names: LayerNames) -> dict[str, Any]:
        """A dense layer's weights, or the router and experts (views of the file's stacks)."""
        c = self.config
        if index in c.dense_layers:
            return super()._mlp_weights(index, weights, names)
        p = f"model.layers.{index}."
        gate_up, down = [], []
        for e in range(c.num_experts):
            gate, up, proj = (_expert(weights, p, name, e) for name in _PROJECTIONS)
            gate_up.append(self._matrix(gate, up))
            down.append(self._matrix(proj))
        for name in list(weights):
            if name.startswith(p + "mlp.experts."):
                del weights[name]
        router = self._router(weights.pop(p + "mlp.gate.weight"))
        gate_up_stack, down_stack = self.backend.expert_stack(gate_up), self.backend.expert_stack(down)
        if gate_up_stack is None or down_stack is None:
            return {"experts": Experts(router, gate_up, down)}
        return {"experts": Experts(router, [], [], gate_up_stack, down_stack)}

    def _router(self, tensor: Tensor) -> Weight:
        """The router, as float32 blocks where the backend has float32 kernels (GGUF files keep it
        F32): its scores pick a row's experts, so they must be the row's own bits whatever rows run
        beside it, which a BLAS product's are not."""
        if not isinstance(tensor, QuantizedTensor) and "F32" in self.backend.block_formats:
            array = np.ascontiguousarray(tensor, dtype=np.float32)
            return self.backend.weight(array.view(np.uint8), quant="F32", shape=array.shape)
        return self._matrix(tensor)

    def _mlp(self, x: Array, layer: DecoderLayer) -> Array:
        """Dense, or each row through its top-k experts, their outputs weighted and summed in
        expert order."""
        experts: Experts | None = layer.experts
        if experts is None:
            return super()._mlp(x, layer)
        backend, c = self.backend, self.config
        chosen, weights = route(
            backend.to_host(backend.linear(x, experts.router)), c.num_experts_per_tok, c.norm_topk_prob
        )
        if experts.gate_up_stack is not None and experts.down_stack is not None:
            return self._grouped_experts(x, experts, chosen, weights)
        out = backend.zeros((x.shape[0], c.hidden_size))
        for e in np.unique(chosen).tolist():
            rows, slot = np.nonzero(chosen == e)  # each row picks an expert at most once
            index = backend.asarray(rows.astype(np.int64))
            gate_up = backend.linear(x[index], experts.gate_up[e])
            y = backend.linear(backend.silu_mul(gate_up, c.moe_intermediate_size), experts.down[e])
            y = y * backend.asarray(weights[rows, slot][:, None])
            out[index] += y
        return out

    def _grouped_experts(self, x: Array, experts: Experts, chosen: np.ndarray, weights: np.ndarray) -> Array:
        """The experts' SwiGLU layers in two grouped products (every (row, expert) pair, sorted by
        expert, one segment per expert), then each row's outputs weighted and summed in expert order:
        the bits of the expert-by-expert loop, in two kernel launches instead of two per expert."""
        backend, c = self.backend, self.config
        k = chosen.shape[1]
        order = np.argsort(chosen.ravel(), kind="stable")  # by expert, then by row
        pair_rows = order // k
        sorted_experts = chosen.ravel()[order]
        segment_experts, starts = np.unique(sorted_experts, return_index=True)
        starts = np.append(starts, len(order))
        xs = x[backend.asarray(pair_rows.astype(np.int64))]
        gate_up = backend.expert_linear(xs, experts.gate_up_stack, segment_experts, starts)
        h = backend.silu_mul(gate_up, c.moe_intermediate_size)
        y = backend.expert_linear(h, experts.down_stack, segment_experts, starts)
        y = y * backend.asarray(weights.ravel()[order][:, None])
        # where each row's j-th smallest expert landed among the sorted pairs: summing y over j in
        # that order adds a row's experts in expert order, as the loop does (from zero: 0 + y == y)
        position = np.empty(len(order), dtype=np.int64)
        position[order] = np.arange(len(order))
        ranked = np.take_along_axis(position.reshape(chosen.shape), np.argsort(chosen, axis=1), axis=1)
        out = y[backend.asarray(ranked[:, 0])]
        for j in range(1, k):
            out = out + y[backend.asarray(ranked[:, j])]
        return out
