"""Prefix caching: kept prompt chunks are reused by requests that start with the same tokens, with the
very tokens a fresh prefill gives (greedy and seeded, one after another and at once), counted in
usage; and the kept slots' bookkeeping (whole chunks only, the longest match, copy or take-over,
LRU eviction, memory given back past the prefix)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from infer.engine.backends.cpu import CpuBackend
from infer.engine.backends.kv_cache import KVCache
from infer.engine.runtime.engine import EngineConfig, load_engine
from infer.engine.runtime.prefix_cache import PrefixCache
from infer.engine.runtime.request import Request
from infer.engine.sampling import SamplingParams

CHUNK = 4


def _kv(slots: int = 3) -> KVCache:
    cache = KVCache.allocate(CpuBackend(), 2, slots, 1, 64, 2)
    for slot in range(slots):  # every slot's positions hold their slot number and position
        cache.keys[:, slot] = (slot * 100 + np.arange(64, dtype=np.float32))[None, None, :, None]
        cache.values[:, slot] = -cache.keys[:, slot]
    return cache


def test_only_whole_prompt_chunks_are_kept_and_the_longest_match_is_copied() -> None:
    cache = _kv()
    prefixes = PrefixCache(cache, CHUNK)
    a = cache.acquire()
    assert a == 0
    assert not prefixes.keep(a, (1, 2, 3), computed=3)  # not one whole chunk: nothing kept
    cache.release(a)
    a = cache.acquire()
    prompt = tuple(range(10, 21))  # 11 tokens: two whole chunks
    assert prefixes.keep(a, prompt, computed=15)  # generated tokens past the prompt are not kept
    assert prefixes.kept_slots == 1 and cache.free_slots == 2
    slot, reused = prefixes.acquire((*prompt[:8], 99, 98))
    assert (slot, reused) == (1, 8)
    np.testing.assert_array_equal(cache.keys[:, 1, :, :8], cache.keys[:, a, :, :8])
    np.testing.assert_array_equal(cache.values[:, 1, :, :8], cache.values[:, a, :, :8])
    assert prefixes.kept_slots == 1  # copied: the kept prefix stays for the next request
    slot, reused = prefixes.acquire(prompt[:8])  # a prompt of exactly the kept prefix: one chunk
    assert reused == 4  # (its last token must be computed for its logits)
    assert (prefixes.hits, prefixes.reused_tokens) == (2, 12)


def test_with_no_free_slot_the_kept_slot_is_taken_over_or_evicted() -> None:
    cache = _kv(2)
    prefixes = PrefixCache(cache, CHUNK)
    first, second = cache.acquire(), cache.acquire()
    prefixes.keep(first, tuple(range(8)), 8)
    prefixes.keep(second, tuple(range(50, 58)), 8)
    slot, reused = prefixes.acquire(tuple(range(50, 60)))
    assert (slot, reused) == (second, 8) and prefixes.kept_slots == 1
    slot, reused = prefixes.acquire((7, 7, 7, 7, 7))  # no match, no free slot: the LRU one is evicted
    assert (slot, reused) == (first, 0) and prefixes.kept_slots == 0
    assert prefixes.acquire((1, 2, 3)) == (None, 0)


def test_a_kept_slot_gives_back_its_tail() -> None:
    cache = _kv(1)
    PrefixCache(cache, CHUNK).keep(cache.acquire(), tuple(range(40)), 40)
    assert cache.keys[:, 0, :, 40:].any()  # 64 positions x 2 floats: the tail is under one page
    big = KVCache.allocate(CpuBackend(), 2, 1, 1, 4096, 64)
    slot = big.acquire()
    big.keys[:, slot] = 1.0
    PrefixCache(big, 512).keep(slot, tuple(range(1100)), 1100)
    assert big.keys[:, slot, :, :1024].all() and not big.keys[:, slot, :, 1100:].any()


@pytest.mark.real_model
@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_reused_prefixes_give_the_tokens_of_a_fresh_prefill(
    default_model_path: Path, temperature: float
) -> None:
    """A 600-token shared system part and different endings, one after another and then four at once:
    with prefix caching the tokens equal those without, and the reuse is counted."""
    rng = np.random.default_rng(7)
    shared = tuple(int(t) for t in rng.integers(100, 20000, 600))
    prompts = [(*shared, *(int(t) for t in rng.integers(100, 20000, 5 + i))) for i in range(4)]

    def run(caching: bool) -> list[tuple[tuple[int, ...], int]]:
        engine = load_engine(
            default_model_path,
            EngineConfig(ctx_size=1024, max_num_seqs=4, batch_size=256, prefix_caching=caching),
            cpu_kernels="exact",
        )

        def request(i: int) -> Request:
            return Request(
                prompt_ids=prompts[i],
                sampling=SamplingParams(temperature=temperature),
                max_tokens=8,
                ignore_eos=True,
                seed=3 + i,
            )

        results = [engine.generate(request(i)).done for i in range(2)]
        streams = [engine.submit(request(i)) for i in range(4)]
        results += [s.result().done for s in streams]
        return [(d.token_ids, d.usage.cached_prompt_tokens) for d in results]

    fresh, cached = run(False), run(True)
    assert [ids for ids, _ in cached] == [ids for ids, _ in fresh]
    assert all(n == 0 for _, n in fresh)
    assert [n for _, n in cached[:2]] == [0, 512]  # whole 256-token chunks of the shared part
    assert all(n == 512 for _, n in cached[2:])


@pytest.mark.real_model
@pytest.mark.slow
def test_the_server_reports_cached_prompt_tokens(default_model_path: Path) -> None:
    """`infer serve --prefix-caching`: the second chat sharing a long system message reports its
    reused tokens in usage.prompt_tokens_details.cached_tokens (the official client reads them) and
    in /metrics, and answers exactly as a server without caching does."""
    import httpx
    import openai

    from infer.cli.serve.launch import start_server

    system = " ".join(f"Rule {i}: always answer politely and briefly." for i in range(60))
    asks = ["Name a colour.", "Name a fruit."]

    def chats(extra: list[str]) -> tuple[list[str], list[int], str]:
        process = start_server(
            ["-m", str(default_model_path), "-c", "2048", "-b", "256", "--alias", "m", *extra]
        )
        try:
            client = openai.OpenAI(base_url=f"{process.url}/v1", api_key="x", max_retries=0, timeout=300)
            texts, cached = [], []
            for ask in asks:
                reply = client.chat.completions.create(
                    model="m",
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": ask}],
                    max_tokens=6,
                    temperature=0,
                )
                texts.append(reply.choices[0].message.content or "")
                details = reply.usage.prompt_tokens_details if reply.usage else None
                cached.append(details.cached_tokens or 0 if details else 0)
            metrics = httpx.get(f"{process.url}/metrics").text
        finally:
            assert process.stop() == 0, process.stderr
        return texts, cached, metrics

    plain_texts, plain_cached, _ = chats([])
    texts, cached, metrics = chats(["--prefix-caching"])
    assert texts == plain_texts and plain_cached == [0, 0]
    assert cached[0] == 0 and cached[1] >= 256 and cached[1] % 256 == 0
    hits = [line for line in metrics.splitlines() if line.startswith("infer:prefix_cache_hits_total")]
    assert hits and float(hits[0].split()[-1]) == cached[1]
