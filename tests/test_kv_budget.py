"""The KV memory budget (`kv_cache_memory`): a sequence is admitted only when the positions it may
reach fit beside the running ones; the rest wait (first come, first served) and then run with the
same tokens; a request that could never fit is refused before it queues; kept prefixes are evicted
to make room; and 64 streams of 200 tokens on the default model fit in 1 GiB."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.request import Request, RequestError
from infer.engine.sampling import SamplingParams
from infer.profiles.schema import memory_bytes

pytest_plugins = ["conftest_synthetic"]


def _requests(n: int, tokens: int = 6) -> list[Request]:
    return [
        Request(
            prompt_ids=(5, 9 + i, 17),
            sampling=SamplingParams(temperature=0.9),
            max_tokens=tokens,
            seed=i,
            ignore_eos=True,
        )
        for i in range(n)
    ]


def test_sequences_wait_for_room_and_keep_their_tokens(tiny_gguf: Path) -> None:
    free = load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=4))
    expected = [s.result().done.token_ids for s in [free.submit(r) for r in _requests(4)]]
    probe = load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=4))
    per_sequence = probe.kv_budget.bytes_for(3 + 6)
    engine = load_engine(
        tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=4, kv_cache_bytes=2 * per_sequence)
    )
    streams = [engine.submit(r) for r in _requests(4)]
    most = 0
    while engine.scheduler.has_work or engine.waiting_sequences:
        engine.step()
        most = max(most, len(engine.scheduler.running))
        assert engine.scheduler.reserved_bytes <= 2 * per_sequence
    assert most == 2
    assert [s.result().done.token_ids for s in streams] == expected


def test_a_request_that_can_never_fit_is_refused(tiny_gguf: Path) -> None:
    engine = load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=4, kv_cache_bytes=1))
    with pytest.raises(RequestError, match="kv_cache_memory") as caught:
        engine.submit(_requests(1)[0])
    assert caught.value.parameter == "max_tokens"
    unbounded = Request(prompt_ids=(5, 9), max_tokens=None)  # until the context end: 64 positions
    budget = load_engine(
        tiny_gguf, EngineConfig(ctx_size=64, kv_cache_bytes=32 * engine.kv_budget.position_bytes)
    )
    with pytest.raises(RequestError, match="lower max_tokens or raise it"):
        budget.submit(unbounded)


def test_kept_prefixes_are_evicted_for_room(tiny_gguf: Path) -> None:
    probe = load_engine(tiny_gguf, EngineConfig(ctx_size=64))
    position = probe.kv_budget.position_bytes
    config = EngineConfig(
        ctx_size=64, max_num_seqs=4, batch_size=8, prefix_caching=True, kv_cache_bytes=40 * position
    )
    engine = load_engine(tiny_gguf, config)
    long_prompt = tuple(range(3, 3 + 20))
    engine.generate(Request(prompt_ids=long_prompt, max_tokens=4, ignore_eos=True))
    prefixes = engine.scheduler.prefix_cache
    assert prefixes is not None and prefixes.kept_positions == 16
    done = engine.generate(Request(prompt_ids=(7, 8, 9), max_tokens=30, ignore_eos=True)).done  # 33 + 16 > 40
    assert len(done.token_ids) == 30 and prefixes.kept_positions == 0


@pytest.mark.real_model
def test_64_streams_of_200_tokens_fit_in_one_gib(default_model_path: Path) -> None:
    """All 64 are admitted at once under a 1 GiB budget (their prompts and 200 tokens each)."""
    engine = load_engine(
        default_model_path, EngineConfig(ctx_size=4096, max_num_seqs=64, kv_cache_bytes=memory_bytes("1GiB"))
    )
    prompt = tuple(engine.tokenizer.encode("Write a long story about the sea and a lighthouse keeper."))
    streams = [
        engine.submit(Request(prompt_ids=prompt, max_tokens=200, seed=i, ignore_eos=True)) for i in range(64)
    ]
    engine.step()
    assert len(engine.scheduler.running) == 64 and not engine.scheduler.waiting
    assert engine.scheduler.reserved_bytes <= memory_bytes("1GiB")
    for stream in streams:
        stream.cancel()
    while engine.scheduler.has_work:
        engine.step()
