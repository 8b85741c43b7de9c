"""One request builder for every surface: generate, stream, serve, bench and gate make the same Request
for the same settings, build `SamplingParams` once, and resolve the seed once."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from infer.cli import stream as stream_cmd
from infer.cli.bench.command import DEFAULT_SAMPLING_SEED, EngineBench, sampling_seed
from infer.cli.gate.anchors import load_anchors
from infer.cli.gate.check import anchor_prompt_ids, anchor_request
from infer.cli.gate.command import anchor_settings
from infer.cli.generation import prompt_request
from infer.cli.serve.schemas import ChatCompletionRequest, CompletionRequest
from infer.engine.runtime.engine import Engine, EngineConfig, load_engine
from infer.engine.runtime.request import Request, RequestError
from infer.engine.sampling import SamplingParams
from infer.profiles.requests import build_request, max_tokens_for
from infer.profiles.settings import Settings, resolve_settings

pytest_plugins = ["conftest_synthetic"]

PROMPT = "hello the world is"
SAMPLER = {"temperature": 0.7, "seed": 11, "n_probs": 2, "top_k": 5, "repeat_penalty": 1.1}


@pytest.fixture(scope="module")
def engine(tiny_gguf: Path) -> Iterator[Engine]:
    engine = load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=4))
    yield engine
    engine.shutdown()


def settings_for(model: Path, **flags: Any) -> Settings:
    return resolve_settings({"model": str(model), "threads": 1, **flags}, env={})


def serve_requests(
    engine: Engine, settings: Settings, ids: list[int], choices: int = 1, **body: Any
) -> tuple[list[Request], int]:
    parsed = CompletionRequest.model_validate({"prompt": ids, "n": choices, **body})
    return parsed.to_requests(
        [ids],
        settings,
        ctx_size=engine.config.ctx_size,
        vocab_size=engine.model.vocab_size,
        choices=choices,
        id_prefix="cmpl-test",
        prompt_param="prompt",
    )


def gate_request(engine: Engine, tmp_path: Path, model: Path, n_predict: int) -> Request:
    sampler = ", ".join(f"{k}: {v}" for k, v in SAMPLER.items())
    path = tmp_path / "anchors.yaml"
    path.write_text(
        "version: 1\nanchors:\n"
        f"  - name: a\n    prompt: {PROMPT!r}\n    ignore_eos: true\n    n_predict: {n_predict}\n"
        f"    sampler: {{{sampler}}}\n"
    )
    loaded = load_anchors(path)
    (anchor,) = loaded.anchors
    settings = anchor_settings(loaded, anchor, {"model": str(model), "threads": 1})
    return anchor_request(anchor_prompt_ids(engine, anchor), anchor, settings)


def same(request: Request) -> Request:
    """The request with its id blanked (ids are unique per request by design)."""
    return dataclasses.replace(request, request_id="-")


def test_the_five_surfaces_make_the_same_request(engine: Engine, tiny_gguf: Path, tmp_path: Path) -> None:
    settings = settings_for(tiny_gguf, n_predict=8, **SAMPLER)
    generated = prompt_request(engine, settings, prompt=PROMPT, chat=False, ignore_eos=True)
    assert stream_cmd.prompt_request is prompt_request  # `infer stream` builds its request the same way
    ids = list(generated.prompt_ids)
    (served,), seed = serve_requests(engine, settings, ids, ignore_eos=True)
    benched = EngineBench(engine, settings, sampling_seed(settings)).request(tuple(ids), 8)
    gated = gate_request(engine, tmp_path, tiny_gguf, n_predict=8)

    assert generated.max_tokens == 8 and generated.seed == seed == 11 and generated.ignore_eos
    assert generated.sampling == SamplingParams(**SAMPLER)
    for other in (served, benched, gated):
        assert same(other) == same(generated)


def test_n_predict_minus_one_means_until_end_of_sequence_or_context(engine: Engine, tiny_gguf: Path) -> None:
    assert (max_tokens_for(-1), max_tokens_for(0), max_tokens_for(5)) == (None, None, 5)
    for n_predict, expected in ((-1, None), (100, 100)):  # 100 > the context: not clipped, the engine stops
        settings = settings_for(tiny_gguf, n_predict=n_predict, **SAMPLER)
        generated = prompt_request(engine, settings, prompt=PROMPT, chat=False)
        (served,), _ = serve_requests(engine, settings, list(generated.prompt_ids))
        assert generated.max_tokens == served.max_tokens == expected
        assert same(served) == same(generated)
    # an explicit limit (an API body's) wins over the setting
    (limited,), _ = serve_requests(engine, settings, list(generated.prompt_ids), max_tokens=3)
    assert limited.max_tokens == 3


def test_the_seed_is_resolved_once_and_reported(engine: Engine, tiny_gguf: Path) -> None:
    settings = settings_for(tiny_gguf, n_predict=3, temperature=0.9)
    assert settings.seed is None
    request = prompt_request(engine, settings, prompt=PROMPT, chat=False)
    assert isinstance(request.seed, int) and request.sampling.seed is None
    assert engine.generate(request).done.seed == request.seed  # the engine drew with it, no new one
    assert engine.generate(request).done.token_ids == engine.generate(request).done.token_ids
    requests, base = serve_requests(engine, settings, list(request.prompt_ids), choices=3)
    assert [r.seed for r in requests] == [base, base + 1, base + 2]
    assert all(r.sampling is requests[0].sampling for r in requests)  # one sampler for every choice
    done = [engine.generate(r).done for r in requests]
    assert [d.seed for d in done] == [base, base + 1, base + 2]
    # bench: the settings' seed, or a fixed one
    assert sampling_seed(settings) == DEFAULT_SAMPLING_SEED
    assert sampling_seed(settings_for(tiny_gguf, seed=5)) == 5
    # a hand-built Request resolves its own seed; a given one is checked
    assert Request((1, 2), SamplingParams(seed=9)).seed == 9
    assert Request((1, 2), SamplingParams(seed=9), seed=4).seed == 4
    for bad in (-1, 1 << 64, True, 1.5):
        with pytest.raises(RequestError) as info:
            Request((1, 2), seed=bad)  # type: ignore[arg-type]
        assert info.value.parameter == "seed"


def test_sampling_params_are_built_once_per_request(
    engine: Engine, tiny_gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    builds: list[SamplingParams] = []
    post_init = SamplingParams.__post_init__

    def counting(self: SamplingParams) -> None:
        builds.append(self)
        post_init(self)

    monkeypatch.setattr(SamplingParams, "__post_init__", counting)
    settings = settings_for(tiny_gguf, n_predict=4, **SAMPLER)
    assert len(builds) == 1  # resolution builds the settings' sampler, once
    assert settings.sampling_params() is settings.sampling
    request = prompt_request(engine, settings, prompt=PROMPT, chat=False)
    ids = list(request.prompt_ids)
    EngineBench(engine, settings, sampling_seed(settings)).request(tuple(ids), 4)
    serve_requests(engine, settings, ids, choices=3)
    assert len(builds) == 1, "generate, bench and a body without sampler fields reuse the settings' one"
    requests, _ = serve_requests(engine, settings, ids, choices=3, temperature=0.5, logprobs=2)
    assert len(builds) == 2, "a body with sampler fields builds one, for all its choices"
    assert requests[0].sampling.temperature == 0.5 and requests[0].sampling.n_probs == 2
    assert isinstance(requests[0].sampling.samplers, tuple)
    del builds[:]
    gate_request(engine, tmp_path, tiny_gguf, n_predict=4)
    # the anchors file is checked at load (one build, naming file:line), then resolution builds the
    # anchor's sampler once; the request reuses it
    assert len(builds) == 2


def test_a_chat_body_builds_its_requests_the_same_way(engine: Engine, tiny_gguf: Path) -> None:
    settings = settings_for(tiny_gguf, n_predict=6, **SAMPLER)
    body = ChatCompletionRequest.model_validate({"messages": [{"role": "user", "content": "hi"}], "n": 2})
    ids = [1, 2, 3]
    requests, seed = body.to_requests(
        [ids],
        settings,
        ctx_size=engine.config.ctx_size,
        vocab_size=engine.model.vocab_size,
        choices=2,
        id_prefix="chatcmpl-x",
        prompt_param="messages",
    )
    expected = build_request(ids, settings, request_id="chatcmpl-x-0")
    assert requests[0] == expected and seed == 11
    assert requests[1] == dataclasses.replace(expected, request_id="chatcmpl-x-1", seed=12)


def test_a_full_waiting_queue_refuses_the_next_request(tiny_gguf: Path) -> None:
    """max_queue bounds the requests waiting for a slot: one more is refused with EngineBusy (the
    server's 503), nothing already queued is lost, and room comes back as the queue drains."""
    from infer.engine.runtime.request import EngineBusy

    engine = load_engine(tiny_gguf, EngineConfig(ctx_size=64, max_num_seqs=1, max_queue=2))
    try:
        request = Request(prompt_ids=(1, 2, 3), max_tokens=2)
        queued = [engine.submit(request) for _ in range(2)]  # not started: both wait
        assert engine.waiting_sequences == 2
        with pytest.raises(EngineBusy) as refused:
            engine.submit(request)
        assert refused.value.retry_after_s >= 1
        assert [len(stream.result().token_ids) for stream in queued] == [2, 2]
        assert len(engine.submit(request).result().token_ids) == 2
    finally:
        engine.shutdown()
