"""GGUF matrices reach the cpu backend as blocks and come out of `linear` as the float path would.

The kernels here are numpy stand-ins with the kernel interface (engine/backends/cpu_kernels/registry.py),
so this pins the plumbing (loader -> family -> backend weights, stacking q/k/v, embedding and the
vocabulary projection from blocks, 16-row groups, int8 fallback to exact) apart from the kernels,
which tests/test_cpu_kernels*.py check against the same dequantized reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest
from cli_process import infer_cli
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from infer.engine.backends.cpu import (
    INT8_MAX_ROWS,
    KERNEL_ROWS,
    BlockWeight,
    CpuBackend,
    DenseWeight,
    StackedWeight,
    int8_rows_per_call,
)
from infer.engine.backends.cpu_kernels.registry import QuantKernels
from infer.engine.backends.cpu_memory import (
    clean_library_mappings,
    l2_cache_bytes,
    release_clean_library_pages,
)
from infer.engine.backends.weight_copies import WeightCopies
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.models.base import QuantizedTensor

pytest_plugins = ["conftest_synthetic"]


def reference_kernels(type_name: str, calls: list[tuple[str, int]]) -> QuantKernels:
    """Kernels for `type_name` computed through gguf's dequantizer, recording (kind, rows) per call."""
    qtype = GGMLQuantizationType[type_name]

    def matmul_exact(blocks: np.ndarray, x: np.ndarray, out: np.ndarray) -> None:
        calls.append(("exact", x.shape[0]))
        assert x.flags.c_contiguous and x.dtype == np.float32
        out[...] = (x.astype(np.float64) @ dequantize(blocks, qtype).astype(np.float64).T).astype(np.float32)

    def dequantize_rows(blocks: np.ndarray, start: int, stop: int, out: np.ndarray) -> None:
        out[...] = dequantize(blocks[start:stop], qtype)

    return QuantKernels(type_name, 32, 0, matmul_exact, None, dequantize_rows)


@pytest.fixture
def quantized_pair(tiny_model_factory: Callable[..., object]) -> tuple[object, list[tuple[str, int]]]:
    calls: list[tuple[str, int]] = []
    model = tiny_model_factory(quant="Q8_0", tied=True, kv_heads=2)
    return model, calls


def _logits(backend: CpuBackend, path: object, token_ids: list[int]) -> np.ndarray:
    checkpoint = load_checkpoint(path)  # type: ignore[arg-type]
    model = build_model(checkpoint, backend)
    return _forward(model, token_ids), model  # type: ignore[return-value]


def _forward(model: object, token_ids: list[int]) -> np.ndarray:
    cache = model.make_cache(1, max(64, len(token_ids)))  # type: ignore[attr-defined]
    batch = ForwardBatch(
        np.asarray(token_ids, dtype=np.int64),
        (Segment(0, 0, len(token_ids)),),
        np.arange(len(token_ids), dtype=np.int64),
    )
    return model.forward(batch, cache)  # type: ignore[attr-defined]


def test_gguf_matrices_load_as_blocks(quantized_pair) -> None:
    model, _ = quantized_pair
    checkpoint = load_checkpoint(model.gguf_path)
    q = checkpoint.weights["model.layers.0.self_attn.q_proj.weight"]
    assert isinstance(q, QuantizedTensor) and q.type_name == "Q8_0" and q.blocks.dtype == np.uint8
    assert np.asarray(q).shape == q.shape
    norm = checkpoint.weights["model.layers.0.input_layernorm.weight"]
    assert isinstance(norm, np.ndarray) and norm.dtype == np.float32


def test_block_weights_give_the_float_path_logits(quantized_pair) -> None:
    model, calls = quantized_pair
    tokens = list(range(3, 3 + 2 * KERNEL_ROWS + 5))  # three kernel calls: two full, then 5 rows
    blas_logits, _ = _logits(CpuBackend(kernels="blas"), model.gguf_path, tokens)
    backend = CpuBackend(kernels="exact", kernel_table={"Q8_0": reference_kernels("Q8_0", calls)})
    block_logits, built = _logits(backend, model.gguf_path, tokens)
    layer = built.layers[0]
    assert isinstance(layer.qkv, BlockWeight)  # q, k, v lie back to back in the file: one view of them
    assert isinstance(layer.down, BlockWeight) and isinstance(built.embed, BlockWeight)
    assert isinstance(layer.attn_norm, DenseWeight)
    assert {rows for _, rows in calls} == {KERNEL_ROWS, 5}
    np.testing.assert_allclose(block_logits, blas_logits, rtol=2e-4, atol=2e-4)
    assert (block_logits.argmax(axis=1) == blas_logits.argmax(axis=1)).all()


def test_a_row_gets_the_same_bits_alone_or_in_a_group(quantized_pair) -> None:
    model, calls = quantized_pair
    backend = CpuBackend(kernels="exact", kernel_table={"Q8_0": reference_kernels("Q8_0", calls)})
    built = build_model(load_checkpoint(model.gguf_path), backend)
    x = (
        np.random.default_rng(0)
        .standard_normal((KERNEL_ROWS + 3, built.config.hidden_size))
        .astype(np.float32)
    )
    together = backend.linear(x, built.layers[0].qkv)
    for row in (0, 7, KERNEL_ROWS + 1):
        assert (backend.linear(x[row : row + 1], built.layers[0].qkv)[0] == together[row]).all()


def test_int8_without_an_int8_kernel_uses_exact(quantized_pair) -> None:
    model, calls = quantized_pair
    backend = CpuBackend(kernels="int8", kernel_table={"Q8_0": reference_kernels("Q8_0", calls)})
    built = build_model(load_checkpoint(model.gguf_path), backend)
    backend.linear(np.ones((2, built.config.hidden_size), dtype=np.float32), built.layers[0].qkv)
    assert calls and all(kind == "exact" for kind, _ in calls)


def test_types_without_kernels_come_as_floats(tiny_model_factory) -> None:
    model = tiny_model_factory(quant="Q4_0")
    backend = CpuBackend(kernels="exact", kernel_table={"Q8_0": reference_kernels("Q8_0", [])})
    built = build_model(load_checkpoint(model.gguf_path), backend)
    assert isinstance(built.layers[0].qkv, DenseWeight)
    assert built.float_copies == {"Q4_0"}  # what the CLI's notice names
    assert backend.block_formats == frozenset({"Q8_0"})
    assert CpuBackend(kernels="blas").block_formats == frozenset()


def test_every_type_the_loader_accepts_runs_from_its_blocks(tiny_model_factory) -> None:
    """No GGUF type the loader takes becomes a float32 copy on the cpu backend: each has kernels (the
    quantized ones an int8 kernel too), and a Q5_1 model (the last legacy type to get them) generates
    without the float-copy notice, the same text from its blocks in `exact` as through BLAS's float copy
    in `blas` at temperature 0."""
    from infer.engine.backends.cpu_kernels import KERNELS
    from infer.engine.loader.gguf import SUPPORTED_TYPES

    for qtype in SUPPORTED_TYPES:
        kernels = KERNELS[qtype.name]
        assert (kernels.matmul_int8 is not None) == (qtype.name not in ("F32", "F16", "BF16")), qtype.name
    model = tiny_model_factory(quant="Q5_1")
    built = build_model(load_checkpoint(model.gguf_path), CpuBackend(kernels="int8"))
    assert isinstance(built.layers[0].qkv, BlockWeight) and not built.float_copies
    args = ("generate", "hello", "--raw", "--temp", "0", "-n", "2", "-m", str(model.gguf_path))
    exact = infer_cli(*args, "--cpu-kernels", "exact")
    assert exact.returncode == 0, exact.stderr
    assert "float32 copies" not in exact.stderr
    blas = infer_cli(*args, "--cpu-kernels", "blas")
    assert blas.returncode == 0 and blas.stdout == exact.stdout


def test_unknown_kernel_mode_is_refused() -> None:
    from infer.engine.backends.errors import BackendError

    with pytest.raises(BackendError, match="exact, int8, blas"):
        CpuBackend(kernels="fast")


def _blocks(rng: np.random.Generator, rows: int, row_bytes: int = 34) -> np.ndarray:
    blocks = rng.integers(0, 256, (rows, row_bytes), dtype=np.uint8)
    blocks[:, 0:2] = np.full((rows, 1), 0.01, dtype=np.float16).view(np.uint8)  # small finite scales
    return blocks


def test_stacking_joins_blocks_of_one_type_into_one_matrix_and_keeps_other_types_apart(tmp_path) -> None:
    calls: list[tuple[str, int]] = []
    table = {name: reference_kernels(name, calls) for name in ("Q8_0", "Q4_0")}
    backend = CpuBackend(kernels="exact", kernel_table=table)
    rng = np.random.default_rng(5)
    buffer = _blocks(rng, 24)  # one buffer: rows 0-15 and 16-23 are two matrices back to back
    first = backend.weight(buffer[:16], quant="Q8_0", shape=(16, 32))
    second = backend.weight(buffer[16:], quant="Q8_0", shape=(8, 32))
    joined = backend.stack([first, second])
    assert isinstance(joined, BlockWeight) and joined.shape == (24, 32)
    assert joined.blocks.shape == (24, 34) and np.shares_memory(joined.blocks, buffer)  # a view: no copy
    # Apart in memory (here: a read-only map of a file, whose pages the copy gives back): one copy.
    path = tmp_path / "blocks.bin"
    _blocks(rng, 8).tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(8, 34)
    elsewhere = backend.weight(mapped, quant="Q8_0", shape=(8, 32))
    copied = backend.stack([first, elsewhere])
    assert isinstance(copied, BlockWeight) and copied.shape == (24, 32)
    assert not np.shares_memory(copied.blocks, mapped) and not np.shares_memory(copied.blocks, buffer)
    assert (np.asarray(mapped) == np.fromfile(path, dtype=np.uint8).reshape(8, 34)).all()  # the file's bytes
    other_type = backend.weight(_blocks(rng, 8, 18), quant="Q4_0", shape=(8, 32))
    apart = backend.stack([first, other_type])
    assert isinstance(apart, StackedWeight) and len(apart.parts) == 2
    x = rng.standard_normal((KERNEL_ROWS + 2, 32)).astype(np.float32)
    for stacked, pieces in (
        (joined, (first, second)),
        (copied, (first, elsewhere)),
        (apart, (first, other_type)),
    ):
        together = backend.linear(x, stacked)
        expected = np.concatenate([backend.linear(x, piece) for piece in pieces], axis=1)
        assert (together == expected).all()
        for row in (0, KERNEL_ROWS + 1):  # one row writes each part's columns in place
            assert (backend.linear(x[row : row + 1], stacked)[0] == together[row]).all()


def test_mmap_false_copies_the_blocks_out_of_the_file_once_with_the_same_logits(quantized_pair) -> None:
    """`mmap: false` (the default setting): every block matrix is a copy in anonymous memory (the
    faster pages for decode at size), a tied table used twice is copied once, and the logits are the
    bits of the mapped model's; with no memory to spare the blocks stay mapped and are counted."""
    from infer.engine.backends.cpu_memory import read_only_file_map

    model, _ = quantized_pair
    tokens = list(range(3, 20))
    mapped, mapped_model = _logits(CpuBackend(kernels="int8"), model.gguf_path, tokens)
    copying = CpuBackend(kernels="int8", mmap=False)
    copied, copied_model = _logits(copying, model.gguf_path, tokens)
    assert np.array_equal(mapped, copied)
    assert read_only_file_map(mapped_model.layers[0].down.blocks)
    for weight in (copied_model.layers[0].down, copied_model.layers[0].qkv, copied_model.embed):
        assert not read_only_file_map(weight.blocks) and not weight.blocks.flags.writeable
    assert copied_model.embed.blocks is copied_model.lm_head.blocks
    # the norms too: read from the map, each fault would map the file pages around them back in
    assert read_only_file_map(mapped_model.layers[0].attn_norm.data)
    assert not read_only_file_map(copied_model.layers[0].attn_norm.data)
    assert not read_only_file_map(copied_model.final_norm.data)
    assert copying.mapped_bytes == 0
    short = CpuBackend(kernels="int8", mmap=False)
    short._weight_copies = WeightCopies(0, short.discard)  # no memory to spare
    kept, kept_model = _logits(short, model.gguf_path, tokens)
    assert np.array_equal(kept, mapped) and read_only_file_map(kept_model.layers[0].down.blocks)
    assert short.mapped_bytes > 0


def test_loading_builds_on_untouched_placeholders_and_copies_the_blocks_as_it_ends(quantized_pair) -> None:
    """Inside `loading` (where load_engine builds and warms up) each copy is a placeholder of fresh
    pages that reads zeros, the stacked ones (qkv, gate and up) included; as the block ends every
    placeholder in use is filled from the file, and the logits are the mapped model's bits."""
    from infer.engine.backends.cpu_memory import read_only_file_map

    model, _ = quantized_pair
    tokens = list(range(3, 20))
    mapped, _ = _logits(CpuBackend(kernels="int8"), model.gguf_path, tokens)
    copying = CpuBackend(kernels="int8", mmap=False)
    with copying.loading():
        during, built = _logits(copying, model.gguf_path, tokens)
        layer = built.layers[0]
        for weight in (layer.down, layer.qkv, layer.gate_up, built.embed):
            assert not weight.blocks.any() and not weight.blocks.flags.writeable
    assert not np.array_equal(during, mapped)
    assert np.array_equal(_forward(built, tokens), mapped)
    for weight in (layer.down, layer.qkv, layer.gate_up, built.embed):
        assert (
            weight.blocks.any()
            and not read_only_file_map(weight.blocks)
            and not weight.blocks.flags.writeable
        )
    assert built.embed.blocks is built.lm_head.blocks


def test_weight_copies_fill_the_placeholders_in_use_after_before_copying(tmp_path) -> None:
    """Deferred copies: a source asked for twice is one placeholder; parts joined into one are
    filled from their sources once (the parts, no longer used, are skipped); `before_copying` runs
    while every placeholder is still untouched; each source's pages are given back once copied."""
    path = tmp_path / "blocks.bin"
    rng = np.random.default_rng(3)
    rng.integers(1, 256, (12, 16), dtype=np.uint8).tofile(path)
    mapped = np.memmap(path, dtype=np.uint8, mode="r").reshape(12, 16)
    given_back: list[int] = []
    copies = WeightCopies(1 << 20, lambda array: given_back.append(array.shape[0]))
    seen: list[bool] = []
    with copies.deferred(before_copying=lambda: seen.append(bool(joined.any() or tail.any()))):
        first, second = copies.resident(mapped[:4]), copies.resident(mapped[4:8])
        joined = copies.joined([first, second])
        tail = copies.resident(mapped[8:])
        assert copies.resident(mapped[8:]) is tail
        del first, second
    assert seen == [False]
    assert (joined == mapped[:8]).all() and (tail == mapped[8:]).all()
    assert sorted(given_back) == [4, 4, 4]  # the joined placeholder's two parts and the tail; not the parts
    assert copies.joined([tail]) is None  # outside `deferred` the caller concatenates


def test_clean_library_mappings_leave_out_written_and_writable_ones() -> None:
    """Only a library's mappings that hold no page the process wrote may be given back: its code and
    read-only data, not its relocated read-only data (dirty, anonymous) nor its writable data."""

    def entry(start: int, end: int, perms: str, path: str, written_kb: int) -> str:
        header = f"{start:x}-{end:x} {perms} {start - 0x7F0000000000:08x} fd:01 42   {path}"
        rows = ("Rss: 64 kB", f"Private_Dirty: {written_kb} kB", f"Anonymous: {written_kb} kB")
        return "\n".join((header, *rows))

    library = "/usr/lib/libllvmlite.so"
    smaps = "\n".join(
        [
            entry(0x7F0000000000, 0x7F0000100000, "r--p", library, 0),  # read-only data
            entry(0x7F0000100000, 0x7F0000300000, "r-xp", library, 0),  # code
            entry(0x7F0000300000, 0x7F0000310000, "r--p", library, 64),  # relocated (RELRO)
            entry(0x7F0000310000, 0x7F0000320000, "rw-p", library, 16),  # writable data
            entry(0x7F0000400000, 0x7F0000500000, "r-xp", library + ".bak", 0),  # another file
        ]
    )
    assert clean_library_mappings(smaps, "libllvmlite.so") == [
        (0x7F0000000000, 0x7F0000100000),
        (0x7F0000100000, 0x7F0000300000),
    ]


def test_giving_back_llvm_code_pages_keeps_numba_working() -> None:
    """After the cpu backend gives LLVM's clean pages back, numba still compiles and runs (the pages
    come back from the file as they are used)."""
    import numba

    from infer.engine.backends.cpu import LLVM_LIBRARY

    @numba.njit
    def before(x: float) -> float:
        return x + 1.0

    assert before(1.0) == 2.0
    assert release_clean_library_pages(LLVM_LIBRARY) > 0

    @numba.njit
    def after(x: float) -> float:
        return x * 3.0

    assert after(2.0) == 6.0 and before(2.0) == 3.0


def test_mmap_false_is_refused_by_the_backends_that_copy_to_a_device() -> None:
    from infer.engine.backends import backend_class
    from infer.engine.backends.base import BackendOptions
    from infer.engine.backends.errors import BackendError

    with pytest.raises(BackendError, match="mmap false"):
        backend_class("cuda").from_options(BackendOptions("cuda", mmap=False))


def test_no_mmap_on_the_command_line_is_refused_off_the_cpu() -> None:
    from infer.cli.runtime import cpu_mmap
    from infer.profiles.settings import resolve_settings

    assert cpu_mmap(resolve_settings({}, env={}), "cpu") is False  # the default: copy
    assert cpu_mmap(resolve_settings({"mmap": True}, env={}), "cpu") is True
    assert cpu_mmap(resolve_settings({}, env={}), "cuda") is True  # the default does not reach a GPU
    with pytest.raises(SystemExit):
        cpu_mmap(resolve_settings({"mmap": False}, env={}), "cuda")


def test_rows_in_their_own_order_are_the_tensor_itself_and_others_a_gathered_copy() -> None:
    """llama.cpp's llama-family q/k need no reordering: the tensor comes back as is (no gather that
    reads the whole file map into a copy); another order moves whole rows of blocks."""
    blocks = _blocks(np.random.default_rng(5), 6)
    tensor = QuantizedTensor(blocks, "Q8_0", (6, 32))
    assert tensor.with_rows(np.arange(6)) is tensor
    order = np.array([1, 0, 3, 2, 5, 4])
    swapped = tensor.with_rows(order)
    assert swapped.blocks is not blocks and np.array_equal(swapped.blocks, blocks[order])
    assert swapped.shape == tensor.shape and swapped.type_name == "Q8_0"


def test_int8_calls_take_as_many_rows_as_half_the_l2_cache_holds() -> None:
    """A byte an activation: half of a 2 MB L2 holds 512 rows of 2,048 columns, 128 of 8,192; the count
    stays in sixteens between KERNEL_ROWS and INT8_MAX_ROWS, and is KERNEL_ROWS with no L2 size."""
    assert int8_rows_per_call(2048, 2 << 20) == 512
    assert int8_rows_per_call(8192, 2 << 20) == 128
    assert int8_rows_per_call(8192, 1 << 20) == KERNEL_ROWS
    assert int8_rows_per_call(3000, 2 << 20) == 336  # 349 rows fit: down to sixteens
    assert int8_rows_per_call(64, 1 << 30) == INT8_MAX_ROWS
    assert int8_rows_per_call(2048, None) == KERNEL_ROWS


def test_the_l2_size_comes_from_sysfs(tmp_path) -> None:
    for index, (level, kind, size) in enumerate(
        [
            ("1", "Data", "48K"),
            ("1", "Instruction", "32K"),
            ("2", "Unified", "2048K"),
            ("3", "Unified", "480M"),
        ]
    ):
        entry = tmp_path / f"index{index}"
        entry.mkdir()
        for name, value in (("level", level), ("type", kind), ("size", size)):
            (entry / name).write_text(value + "\n")
    assert l2_cache_bytes(str(tmp_path)) == 2 << 20
    assert l2_cache_bytes(str(tmp_path / "missing")) is None


def test_int8_products_run_in_l2_sized_calls_with_the_bits_of_single_rows() -> None:
    """Rows past KERNEL_ROWS go to the int8 kernel int8_rows_per_call at a time (here 128 of 32
    columns: an L2 of 8 KB), and every row has the bits it has alone."""
    from infer.engine.backends.cpu_kernels import KERNELS

    calls: list[int] = []
    q8 = KERNELS["Q8_0"]
    assert q8.matmul_int8 is not None

    def recording(blocks: np.ndarray, xq: np.ndarray, xs: np.ndarray, out: np.ndarray) -> None:
        calls.append(xq.shape[0])
        q8.matmul_int8(blocks, xq, xs, out)  # type: ignore[misc]

    table = {"Q8_0": replace(q8, matmul_int8=recording)}
    backend = CpuBackend(kernels="int8", kernel_table=table)
    backend._l2_bytes = 2 * 32 * 128
    rng = np.random.default_rng(5)
    weight = backend.weight(_blocks(rng, 24), quant="Q8_0", shape=(24, 32))
    x = rng.standard_normal((300, 32)).astype(np.float32)
    together = backend.linear(x, weight)
    assert calls == [128, 128, 44]
    for row in (0, 127, 128, 299):
        assert (
            backend.linear(x[row : row + 1], weight)[0].view(np.uint32) == together[row].view(np.uint32)
        ).all()
