"""The Gemma 3 family on a tiny synthetic GGUF: logits against a float64 numpy forward of Hugging Face's
decoder, past the sliding window, in prefill (BLAS attention) and decode (row kernels and batched BLAS),
and batch invariance of decode rows with windowed layers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from synthetic_gemma3 import TinyGemma3, reference_logits, write_tiny_gemma3

from infer.engine.backends.cpu import CpuBackend
from infer.engine.batch import ForwardBatch, Segment
from infer.engine.loader import load_checkpoint
from infer.engine.models import build_model
from infer.engine.models.gemma3 import FORGET_STRIDE, FULL, SLIDING, Gemma3Config

pytest_plugins = ["conftest_synthetic"]
pytestmark = pytest.mark.usefixtures("single_blas_thread")

PROMPT = [5, 40, 77, 101, 9, 250, 31, 64, 12, 300, 7, 88, 190, 45, 66, 23, 120, 14, 99, 3, 210, 55]
"""22 tokens: past the window of 5 many times over, and past the kernels' row groups (6 rows a group in
the exact kernels) as one prefill run; its attention takes the row kernel, up to ROW_ATTENTION_ROWS."""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> TinyGemma3:
    return write_tiny_gemma3(tmp_path_factory.mktemp("gemma3"))


def _forward(model, cache, segments: list[tuple[int, int, list[int]]]) -> np.ndarray:
    tokens = [t for _, _, ids in segments for t in ids]
    batch = ForwardBatch(
        np.asarray(tokens, dtype=np.int64),
        tuple(Segment(slot, start, len(ids)) for slot, start, ids in segments),
        np.arange(len(tokens), dtype=np.int64),
    )
    return model.forward(batch, cache)


def test_config_from_gguf(tiny: TinyGemma3) -> None:
    config = load_checkpoint(tiny.gguf_path).config
    assert isinstance(config, Gemma3Config)
    assert config.layer_types == (SLIDING, SLIDING, FULL)
    assert (config.sliding_window, config.rope_local_base_freq, config.rope_theta) == (5, 1e4, 1e6)
    assert config.tie_word_embeddings and config.norm_weights_hold_one
    assert config.query_pre_attn_scalar == tiny.head_dim


def test_the_window_changes_the_reference(tiny: TinyGemma3) -> None:
    """Guard for the tests below: with the window off, rows past it come out differently."""
    with_window, without = reference_logits(tiny, PROMPT), reference_logits(tiny, PROMPT, window=False)
    np.testing.assert_allclose(with_window[: tiny.window], without[: tiny.window], atol=1e-9)
    assert np.abs(with_window[tiny.window :] - without[tiny.window :]).max() > 1e-2


@pytest.mark.parametrize("kernels", ["exact", "blas"])
def test_prefill_in_one_run_matches_reference(tiny: TinyGemma3, kernels: str) -> None:
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels=kernels))
    got = _forward(model, model.make_cache(1, 64), [(0, 0, PROMPT)])
    np.testing.assert_allclose(got, reference_logits(tiny, PROMPT), atol=2e-4, rtol=1e-4)


def test_long_prefill_run_attends_in_windowed_blocks(tiny: TinyGemma3) -> None:
    """A run longer than ROW_ATTENTION_ROWS takes the blocked prefill attention (sliding and global
    layers), and still matches the reference."""
    from infer.engine.backends.cpu import ROW_ATTENTION_ROWS

    prompt = [(7 * i + 3) % 300 + 1 for i in range(ROW_ATTENTION_ROWS + 20)]
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="exact"))
    got = _forward(model, model.make_cache(1, len(prompt)), [(0, 0, prompt)])
    np.testing.assert_allclose(got, reference_logits(tiny, prompt), atol=2e-4, rtol=1e-4)


@pytest.mark.parametrize("kernels", ["exact", "blas"])
def test_chunked_prefill_and_decode_match_reference(tiny: TinyGemma3, kernels: str) -> None:
    """A chunk starting past the window, then one token at a time (row kernels or batched BLAS)."""
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels=kernels))
    cache = model.make_cache(2, 64)
    expected = reference_logits(tiny, PROMPT)
    rows = [_forward(model, cache, [(1, 0, PROMPT[:7])]), _forward(model, cache, [(1, 7, PROMPT[7:12])])]
    rows += [_forward(model, cache, [(1, p, [PROMPT[p]])]) for p in range(12, len(PROMPT))]
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=2e-4, rtol=1e-4)


def test_decode_rows_are_bit_identical_in_any_batch(tiny: TinyGemma3) -> None:
    """Windowed and global layers alike: a decode or verify row's logits do not depend on its batch."""
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="exact"))
    slots = 12
    cache = model.make_cache(slots + 1, 64)
    rng = np.random.default_rng(3)
    prompts = [rng.integers(3, model.vocab_size, int(rng.integers(2, 30))).tolist() for _ in range(slots)]
    for slot, prompt in enumerate(prompts):
        _forward(model, cache, [(slot, 0, prompt)])
    nexts = rng.integers(3, model.vocab_size, slots).tolist()
    alone = [_forward(model, cache, [(s, len(prompts[s]), [nexts[s]])])[0] for s in range(slots)]
    for trial in range(6):
        chosen = rng.choice(slots, size=int(rng.integers(2, slots + 1)), replace=False).tolist()
        segments, decode_rows, row = [], [], 0
        for slot in chosen:
            drafts = rng.integers(3, model.vocab_size, int(rng.integers(0, 4))).tolist()
            segments.append((slot, len(prompts[slot]), [nexts[slot], *drafts]))
            decode_rows.append((row, slot))
            row += 1 + len(drafts)
        fresh = rng.integers(3, model.vocab_size, 20).tolist()  # a prefill run rides along at the end
        segments.append((slots, 0, fresh))
        logits = _forward(model, cache, segments)
        for batch_row, slot in decode_rows:
            assert (logits[batch_row] == alone[slot]).all(), (trial, slot)


def test_final_logit_softcapping(tmp_path: Path) -> None:
    tiny = write_tiny_gemma3(tmp_path, softcap=0.5, seed=1)
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="exact"))
    got = _forward(model, model.make_cache(1, 64), [(0, 0, PROMPT[:9])])
    assert np.abs(got).max() <= 0.5
    np.testing.assert_allclose(got, reference_logits(tiny, PROMPT[:9]), atol=1e-4)


CAP = 0.3
"""An attention soft-cap small enough to bite on the tiny model's scores."""


def _capped(tmp_path: Path) -> tuple[TinyGemma3, Path]:
    """The tiny model and a copy of its file whose attention scores are soft-capped at CAP."""
    import gguf

    tiny = write_tiny_gemma3(tmp_path)
    reader = gguf.GGUFReader(tiny.gguf_path)
    writer = gguf.GGUFWriter(str(tmp_path / "capped.gguf"), "gemma3")
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "general.architecture":
            continue
        value = field.contents()
        sub = gguf.GGUFValueType.get_type(value[0]) if isinstance(value, list) and value else None
        writer.add_key_value(key, value, field.types[0], sub_type=sub)
    writer.add_float32("gemma3.attn_logit_softcapping", CAP)
    for tensor in reader.tensors:
        shape = [int(n) for n in reversed(tensor.shape)]
        raw = None if tensor.tensor_type == gguf.GGMLQuantizationType.F32 else tensor.tensor_type
        data = tensor.data if raw is None else np.asarray(tensor.data).reshape(shape[0], -1)
        writer.add_tensor(tensor.name, np.ascontiguousarray(data), raw_dtype=raw)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return tiny, tmp_path / "capped.gguf"


@pytest.mark.parametrize("kernels", ["exact", "blas"])
def test_attention_softcapping_matches_the_reference_in_prefill_and_decode(
    tmp_path: Path, kernels: str
) -> None:
    """Every attention path (the row kernel, blocked prefill, BLAS prefill and batched decode)
    soft-caps the scores as transformers does (Gemma 2's attn_logit_softcapping)."""
    from infer.engine.backends.cpu import ROW_ATTENTION_ROWS

    tiny, path = _capped(tmp_path)
    checkpoint = load_checkpoint(path)
    assert checkpoint.config.attn_logit_softcapping == pytest.approx(CAP)
    model = build_model(checkpoint, CpuBackend(kernels=kernels))
    capped = reference_logits(tiny, PROMPT, attn_softcap=CAP)
    assert np.abs(capped - reference_logits(tiny, PROMPT)).max() > 1e-2  # the cap bites
    got = _forward(model, model.make_cache(1, 64), [(0, 0, PROMPT)])
    np.testing.assert_allclose(got, capped, atol=2e-4, rtol=1e-4)
    cache = model.make_cache(2, 64)  # decode rows of two sequences together, one token at a time
    _forward(model, cache, [(0, 0, PROMPT[:3]), (1, 0, PROMPT[:3])])
    for step in range(3, len(PROMPT)):
        rows = _forward(model, cache, [(0, step, [PROMPT[step]]), (1, step, [PROMPT[step]])])
        np.testing.assert_allclose(rows, np.stack([capped[step]] * 2), atol=2e-4, rtol=1e-4)
    long = [(7 * i + 3) % 300 + 1 for i in range(ROW_ATTENTION_ROWS + 20)]
    got = _forward(model, model.make_cache(1, len(long)), [(0, 0, long)])
    np.testing.assert_allclose(got, reference_logits(tiny, long, attn_softcap=CAP), atol=2e-4, rtol=1e-4)


def test_sliding_layers_give_back_positions_past_every_window(tiny: TinyGemma3) -> None:
    """Past the window by more than a stride, a sliding layer's old positions are given back to the
    system (they read as zeros again) while global layers keep theirs, and the logits still equal
    the reference, in chunked prefill and in decode."""
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="exact"))
    cache = model.make_cache(2, 800)
    prompt = np.random.default_rng(5).integers(3, model.vocab_size, 720).tolist()
    expected = reference_logits(tiny, prompt)
    rows = [_forward(model, cache, [(1, start, prompt[start : start + 300])]) for start in (0, 300)]
    rows += [_forward(model, cache, [(1, p, [prompt[p]])]) for p in range(600, len(prompt))]
    np.testing.assert_allclose(np.concatenate(rows), expected, atol=2e-4, rtol=1e-4)
    stride = FORGET_STRIDE
    assert len(prompt) - 1 - tiny.window > 2 * stride  # two strides fell out of every window
    for index, kind in enumerate(model.config.layer_types):
        old_keys, old_values = cache.keys[index, 1, :, : 2 * stride], cache.values[index, 1, :, : 2 * stride]
        if kind == SLIDING:
            assert not old_keys.any() and not old_values.any(), index
        else:
            assert old_keys.all(axis=-1).any() and old_values.any(), index
        assert cache.keys[index, 1, :, len(prompt) - tiny.window : len(prompt)].any(axis=-1).all(), index
    assert not cache.keys[:, 0].any()  # the other slot was never touched


def test_a_rewinding_cache_keeps_every_position(tiny: TinyGemma3) -> None:
    """A draft model's cache restarts before earlier steps (rewound to what the target kept), so
    nothing of it is given back."""
    model = build_model(load_checkpoint(tiny.gguf_path), CpuBackend(kernels="exact"))
    cache = model.make_cache(1, 800)
    cache.may_rewind = True
    prompt = np.random.default_rng(5).integers(3, model.vocab_size, 700).tolist()
    _forward(model, cache, [(0, 0, prompt[:690])])
    for p in range(690, 700):
        _forward(model, cache, [(0, p, [prompt[p]])])
    assert cache.keys[:, 0, :, :256].any(axis=-1).all()
