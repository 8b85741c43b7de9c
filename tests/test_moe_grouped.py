"""A mixture of experts' grouped products (Backend.expert_linear, the K-quant segment kernels): every
(row, expert) pair of a layer in one kernel launch gives each row the bits the expert-by-expert loop
gives it, in the exact and int8 kernel modes, alone and batched."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from test_cpu_kernels_kquants import TYPES, random_blocks

from infer.engine.backends.cpu import BlockWeight, CpuBackend
from infer.engine.models.qwen3moe import Experts, Qwen3MoeModel

# One test worker compiles and runs the CPU kernel tests: beside each other on two workers, a cold
# run (a fresh clone) compiled the same K-quant kernels twice at once (pytest-xdist --dist loadgroup).
pytestmark = pytest.mark.xdist_group("cpu_kernels")

EXPERTS = 6
HIDDEN = 512
WIDTH = 256
"""Small shapes: whole 256-weight super-blocks on both sides of each expert."""


def _weights(backend: CpuBackend, type_name: str, rows: int, cols: int, seed: int) -> list[BlockWeight]:
    return [
        backend.weight(random_blocks(type_name, rows, cols, seed + e), quant=type_name, shape=(rows, cols))
        for e in range(EXPERTS)
    ]


@pytest.mark.parametrize("mode", ["exact", "int8"])
@pytest.mark.parametrize("type_name", TYPES)
def test_segments_give_each_row_its_own_product(mode: str, type_name: str) -> None:
    backend = CpuBackend(kernels=mode)
    experts = _weights(backend, type_name, 45, HIDDEN, seed=3)
    stack = backend.expert_stack(experts)
    assert stack is not None and stack.shape == (EXPERTS, 45, HIDDEN)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((11, HIDDEN)).astype(np.float32)
    segment_experts = np.array([0, 2, 3, 5])
    starts = np.array([0, 1, 6, 6, 11])  # one row, five, none, five
    out = backend.expert_linear(x, stack, segment_experts, starts)
    for s, e in enumerate(segment_experts):
        lo, hi = starts[s], starts[s + 1]
        for r in range(lo, hi):  # each row alone through linear: the same bits
            assert np.array_equal(out[r], backend.linear(x[r : r + 1], experts[e])[0])


def test_expert_stack_declines_what_has_no_segment_kernel() -> None:
    backend = CpuBackend(kernels="exact")
    dense = [backend.weight(np.ones((4, HIDDEN), np.float32)) for _ in range(3)]
    assert backend.expert_stack(dense) is None
    mixed = _weights(backend, "Q4_K", 8, HIDDEN, 1)[:2] + _weights(backend, "Q6_K", 8, HIDDEN, 1)[:1]
    assert backend.expert_stack(mixed) is None
    assert CpuBackend(kernels="blas").expert_stack([]) is None


def _moe(backend: CpuBackend, stacked: bool) -> tuple[Qwen3MoeModel, SimpleNamespace]:
    # the fields the feed-forward layer reads
    config = SimpleNamespace(
        hidden_size=HIDDEN, num_experts_per_tok=3, moe_intermediate_size=WIDTH, norm_topk_prob=True
    )
    model = Qwen3MoeModel.__new__(Qwen3MoeModel)  # only the feed-forward layer is exercised
    model.backend, model.config = backend, config
    router = model._router(np.random.default_rng(7).standard_normal((EXPERTS, HIDDEN)).astype(np.float32))
    gate_up = _weights(backend, "Q4_K", 2 * WIDTH, HIDDEN, 20)
    down = _weights(backend, "Q6_K", HIDDEN, WIDTH, 40)
    if stacked:
        experts = Experts(router, [], [], backend.expert_stack(gate_up), backend.expert_stack(down))
    else:
        experts = Experts(router, gate_up, down)
    return model, SimpleNamespace(experts=experts)


@pytest.mark.parametrize("mode", ["exact", "int8"])
def test_grouped_layer_equals_the_expert_loop_alone_and_batched(mode: str) -> None:
    backend = CpuBackend(kernels=mode)
    (grouped, g_layer), (loop, l_layer) = _moe(backend, True), _moe(backend, False)
    x = np.random.default_rng(1).standard_normal((17, HIDDEN)).astype(np.float32)
    batched = grouped._mlp(x, g_layer)
    assert np.array_equal(batched, loop._mlp(x, l_layer))
    for r in (0, 5, 16):
        assert np.array_equal(grouped._mlp(x[r : r + 1], g_layer)[0], batched[r])
