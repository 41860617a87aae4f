"""`specedge serve` with several slots (--parallel) on a tiny qwen2 whose passes can be shared:
requests decoded at once answer as each does alone (greedy, seeded, streamed with log-probabilities),
a client gone mid-way frees its slot for the next, the queue holds slots + queue_size requests, a
chat's next turn finds its last turn's slot, a request beside another over the same context starts
from its entries, and a model whose passes cannot be shared keeps 1 slot."""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.kernels import native
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.generator import model_drafter
from specedge.runtime.streams.slots import Streams, parallel_that_pays
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from specedge.serve.worker import MIN_COPIED, GenerationWorker, Job, QueueFull
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS
from tests.serve.conftest import HERE
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                reason=native.missing() or "library absent")
PROMPTS = ("def fib(n):", "abcabcab", "hello world, this is", "x = 1\ny = 2\n")


@pytest.fixture
def pair(tiny_streams_pair: tuple[Path, Path]) -> tuple[Path, Path]:
    return tiny_streams_pair


def generator(pair: tuple[Path, Path]) -> Generator:
    return Generator.load(pair[0], draft=pair[1], ngram=True, config=SpecConfig(gamma=4, auto_gamma=True))


@pytest.fixture
def served(pair: tuple[Path, Path]) -> Iterator[TestClient]:
    settings = ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000), parallel=3)
    with TestClient(create_app(generator(pair), settings), base_url=HERE) as http:
        yield http


def body(prompt: str, **extra: object) -> dict[str, object]:
    return {"model": "tiny", "prompt": prompt, "max_tokens": 20, "temperature": 0, "ignore_eos": True, **extra}


def at_once(http: TestClient, bodies: list[dict[str, object]]) -> list[dict[str, object]]:
    answers: list[dict[str, object]] = [{} for _ in bodies]

    def send(i: int) -> None:
        r = http.post("/v1/completions", json=bodies[i])
        assert r.status_code == 200, r.text
        answers[i] = r.json()

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return answers


def test_requests_at_once_answer_as_each_alone(served: TestClient) -> None:
    """Four requests on three slots (one waits), greedy and seeded, with log-probabilities: the
    same text, tokens and log-probabilities as one after another."""
    bodies = [body(PROMPTS[0], logprobs=2), body(PROMPTS[1], temperature=0.9, seed=4), body(PROMPTS[2]),
              body(PROMPTS[3], temperature=0.8, seed=9, logprobs=1)]
    alone = [served.post("/v1/completions", json=b).json() for b in bodies]
    together = at_once(served, bodies)
    for a, b in zip(alone, together, strict=True):
        assert a["choices"][0]["text"] == b["choices"][0]["text"]
        assert a["choices"][0]["logprobs"] == b["choices"][0]["logprobs"]
        assert a["usage"]["completion_tokens"] == b["usage"]["completion_tokens"] == 20
    health = served.get("/health").json()
    assert health["slots"] == 3 and health["decoding"] == 0 and health["served"] == 8


def test_a_client_gone_mid_stream_frees_its_slot(served: TestClient) -> None:
    want = served.post("/v1/completions", json=body(PROMPTS[1])).json()["choices"][0]["text"]
    with served.stream("POST", "/v1/completions", json=body(PROMPTS[0], stream=True, max_tokens=60)) as r:
        for line in r.iter_lines():
            if line.startswith("data: ") and json.loads(line[6:])["choices"]:
                break  # gone after its first piece
    answers = at_once(served, [body(PROMPTS[1]), body(PROMPTS[1])])
    assert [a["choices"][0]["text"] for a in answers] == [want, want]


def test_the_queue_holds_the_slots_and_queue_size_requests(pair: tuple[Path, Path]) -> None:
    gen = generator(pair)
    worker = GenerationWorker(gen, queue_size=1, streams=Streams(gen, 2))  # not started: nothing is taken
    loop = asyncio.new_event_loop()
    try:
        jobs = [Job(f"j{i}", lambda: [1, 2, 3], {}, loop, stream=False) for i in range(4)]
        for job in jobs[:3]:
            worker.submit(job)
        with pytest.raises(QueueFull):
            worker.submit(jobs[3])
        assert worker.waiting == 3 and worker.slots == 2
    finally:
        loop.close()


def test_the_next_turn_finds_the_slot_of_its_last_turn(pair: tuple[Path, Path]) -> None:
    gen = generator(pair)
    streams = Streams(gen, 3)
    worker = GenerationWorker(gen, queue_size=1, streams=streams)
    first = gen.encode(PROMPTS[0])
    streams.generators[1].generate(first, max_new_tokens=4)
    later = [*first, *streams.generators[1].cache.tokens[len(first):], 7, 8]
    assert worker.take_slot(later) == 1
    assert worker.take_slot(later) in (0, 2)  # slot 1 is taken now


def test_a_request_beside_another_with_its_context_copies_that_prefix_and_decodes_as_alone(
        pair: tuple[Path, Path]) -> None:
    """A request whose prompt shares a long prefix with what a busy slot holds starts with that prefix
    copied into its own slot (target's and draft's cache): the entries bitwise those a prefill of its
    own writes, its tokens the same; never from another owner's slot."""
    import numpy as np

    gen = generator(pair)
    streams = Streams(gen, 3)
    worker = GenerationWorker(gen, queue_size=1, streams=streams)
    context = gen.encode("def fib(n):\n    return fib(n - 1) + fib(n - 2)\n")
    busy = worker.take_slot([*context, 5])
    streams.generators[busy].generate([*context, 5], max_new_tokens=4)  # slot `busy` stays taken
    prompt = [*context, 9, 10]
    slot = worker.take_slot(prompt)
    assert slot != busy and streams.generators[slot].cache.tokens == context
    drafts = [model_drafter(streams.generators[s].drafter) for s in (busy, slot)]
    assert drafts[1] is not None and drafts[1].cache.tokens == drafts[0].cache.tokens[:len(context)]
    assert len(context) >= MIN_COPIED
    got = streams.generators[slot].generate(prompt, max_new_tokens=6).token_ids
    fresh = worker.take_slot(prompt, owner="another key")  # another owner's request: nothing copied
    assert fresh not in (busy, slot) and streams.generators[fresh].cache.tokens == []
    assert streams.generators[fresh].generate(prompt, max_new_tokens=6).token_ids == got
    for a, b in zip(streams.generators[slot].cache.keys + streams.generators[slot].cache.values,
                    streams.generators[fresh].cache.keys + streams.generators[fresh].cache.values, strict=True):
        assert np.array_equal(a[:, :, :16 * (len(context) // 16)], b[:, :, :16 * (len(context) // 16)])


def test_each_owner_drafts_from_a_lookup_memory_of_its_own_answers(pair: tuple[Path, Path]) -> None:
    """The n-gram lookup's memory of earlier answers is one per API key, whichever slot serves it; with
    prefix sharing off there is none (no request's answers draft for another's)."""
    gen = generator(pair)
    streams = Streams(gen, 2)
    worker = GenerationWorker(gen, queue_size=1, streams=streams)
    prompt = gen.encode(PROMPTS[0])
    a = worker.take_slot(prompt, owner="key a")
    memory = worker.generator_of(a).lookup_memory
    streams.generators[a].generate(prompt, max_new_tokens=6)
    assert memory is not None and len(memory) == 7  # the answer and its separator
    b = worker.take_slot(prompt, owner="key b")
    assert worker.generator_of(b).lookup_memory is not memory and len(worker.generator_of(b).lookup_memory or []) == 0
    worker._free.append(a)  # slot a served its request
    assert worker.generator_of(worker.take_slot(prompt, owner="key b")).lookup_memory is not memory
    worker._free[:] = [0, 1]
    assert worker.generator_of(worker.take_slot(prompt, owner="key a")).lookup_memory is memory
    private = GenerationWorker(gen, queue_size=1, streams=streams, share_prefixes=False)
    assert private.generator_of(private.take_slot(prompt, owner="key a")).lookup_memory is None
    none = GenerationWorker(gen, queue_size=1, streams=streams, lookup_memory=0)
    assert none.generator_of(none.take_slot(prompt, owner="key a")).lookup_memory is None
    small = GenerationWorker(gen, queue_size=1, streams=streams, lookup_memory=100)
    kept = small.generator_of(small.take_slot(prompt, owner="key a")).lookup_memory
    assert kept is not None and kept.max_tokens == 100


def test_models_whose_passes_cannot_be_shared_keep_one_slot(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "src", "qwen2", seed=1)
    fused = export_model(src, tmp_path / "fused", ExportSettings(quant="fp32", context=TINY_CONTEXT,
                                                                 widths=TINY_WIDTHS, attention="fused")).path
    choice = parallel_that_pays(Generator.load(fused, config=SpecConfig(gamma=0)))
    assert choice.slots == 1 and "cache per stream" in choice.why and "\n" not in choice.why


def test_auto_measures_how_many_slots_pay(pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Auto takes the most slots whose shared pass makes 1.5x one stream's tokens with each stream at
    half its speed or more, and says what it measured; the real measurement runs on the tiny model."""
    from specedge.runtime.streams import slots as streams

    gen = generator(pair)
    assert "streams took" in parallel_that_pays(gen, repeats=1).why  # measured here, whatever the numbers
    for times, slots in (({1: 1.0, 2: 1.05, 4: 1.1}, 4), ({1: 1.0, 2: 1.2, 4: 3.0}, 2), ({1: 1.0, 2: 1.9, 4: 3.0}, 1)):
        monkeypatch.setattr(streams, "shared_pass_seconds", lambda model, n, repeats, t=times: t[n])
        choice = parallel_that_pays(gen)
        assert choice.slots == slots, (times, choice)
    assert choice.why == "a pass of 4 streams took 3.00x one of 1; a pass of 2 streams took 1.90x one of 1 here"
