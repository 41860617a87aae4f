"""`specedge serve` as clients see it: the official openai package and plain HTTP against a real
server process with SmolLM2 (fp32 target, int4 draft). Greedy output equals the library's and the
CLI's; disconnecting stops a generation; a full queue answers 503; bad requests get error objects."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from specedge.runtime.generator import GenerationResult, Generator
from tests.serve.conftest import MODEL, ServerProcess

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
SPECEDGE_KEYS = {"drafter", "gamma", "gamma_auto", "acceptance_rate", "tokens_per_target_pass", "bytes_per_token",
                 "tokens_per_s", "prompt_tokens_reused", "time_to_first_token_s", "queued_s", "stop_reason"}


@pytest.fixture(scope="module")
def reference(smollm2: dict[str, Path]) -> Generator:
    """The library in this process, plain decoding of the same target: what the speculative server
    must answer, token for token (greedy, or sampled with a seed)."""
    return Generator.load(smollm2["fp32"])


@pytest.fixture(scope="module")
def greedy_answer(reference: Generator) -> GenerationResult:
    return reference.generate(QUESTION, max_new_tokens=10)


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60)


def sse_events(response: httpx.Response) -> Iterator[str]:
    for line in response.iter_lines():
        if line.startswith("data: "):
            yield line[len("data: "):]


def test_models_and_health(client: openai.OpenAI, server: ServerProcess) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]
    assert client.models.retrieve(MODEL).id == MODEL
    health = httpx.get(f"{server.url}/health").json()
    assert health["status"] == "ok" and health["model"] == MODEL and health["queue_size"] == 1


def test_chat_greedy_equals_library(client: openai.OpenAI, reference: Generator,
                                    greedy_answer: GenerationResult) -> None:
    expected = greedy_answer
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0)
    assert reply.object == "chat.completion" and reply.id.startswith("chatcmpl-") and reply.created > 0
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.finish_reason == {"eos": "stop", "max_new_tokens": "length"}[expected.stats.stop_reason]
    assert reply.usage is not None
    assert reply.usage.prompt_tokens == len(reference.encode(QUESTION))
    assert reply.usage.completion_tokens == expected.stats.n_tokens
    stats = reply.model_extra["specedge"]
    assert stats.keys() >= SPECEDGE_KEYS
    assert stats["drafter"] == "draft-model" and stats["gamma_auto"] is True
    assert 0 <= stats["acceptance_rate"] <= 1 and stats["tokens_per_target_pass"] >= 1
    assert stats["bytes_per_token"] > 0


def test_chat_stream_equals_whole(client: openai.OpenAI, greedy_answer: GenerationResult) -> None:
    expected = greedy_answer
    stream = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0,
                                            stream=True, stream_options={"include_usage": True})
    chunks = list(stream)
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"  # the role once, as OpenAI streams it: the first delta
    assert all(c.choices[0].delta.role is None for c in chunks[1:] if c.choices)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == expected.text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].model_extra["specedge"].keys() >= SPECEDGE_KEYS
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == expected.stats.n_tokens


def test_sampling_with_seed_is_the_library_s(client: openai.OpenAI, reference: Generator) -> None:
    from specedge.kernels.sampling import SamplingParams

    expected = reference.generate(QUESTION, max_new_tokens=8, seed=7, sampling=SamplingParams(0.9, 0, 0.95))
    texts = [client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=8, temperature=0.9,
                                            top_p=0.95, seed=7).choices[0].message.content for _ in range(2)]
    assert texts == [expected.text] * 2


def test_stop_string(client: openai.OpenAI, reference: Generator) -> None:
    expected = reference.generate(QUESTION, max_new_tokens=10, stop_strings=(" Paris",))
    assert expected.stats.stop_reason == "stop_string"
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0,
                                           stop=[" Paris"])
    assert reply.choices[0].message.content == expected.text and reply.choices[0].finish_reason == "stop"


def test_completions_plain_http_stream_equals_specedge_generate(server: ServerProcess,
                                                                smollm2: dict[str, Path]) -> None:
    prompt = "def fibonacci(n):"
    cli = subprocess.run([sys.executable, "-m", "specedge", "generate", "--target", str(smollm2["fp32"]),
                          "--no-draft", "--prompt", prompt, "--max-new-tokens", "12", "--json"],
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 0, cli.stderr
    expected = json.loads(cli.stdout)
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 12, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = list(sse_events(r))
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert all(c["object"] == "text_completion" for c in chunks)
    assert "".join(c["choices"][0]["text"] for c in chunks) == expected["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length" == {"max_new_tokens": "length"}.get(
        expected["stop_reason"])
    # the same request whole, over plain HTTP
    whole = httpx.post(f"{server.url}/v1/completions", json={**body, "stream": False}, timeout=60).json()
    assert whole["choices"][0]["text"] == expected["text"] and whole["usage"]["completion_tokens"] == 12


def test_next_turn_reuses_the_kv_cache(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=12, temperature=0)
    turn = [*QUESTION, {"role": "assistant", "content": first.choices[0].message.content},
            {"role": "user", "content": "And of Italy?"}]
    second = client.chat.completions.create(model=MODEL, messages=turn, max_tokens=4, temperature=0)
    assert second.usage is not None and second.usage.prompt_tokens_details is not None
    reused = second.usage.prompt_tokens_details.cached_tokens
    assert reused == second.model_extra["specedge"]["prompt_tokens_reused"]
    assert first.usage.prompt_tokens <= reused < second.usage.prompt_tokens  # the first prompt, and more
    other = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Name a colour."}],
                                           max_tokens=2, temperature=0)
    assert other.usage.prompt_tokens_details.cached_tokens < reused  # only the template's common start


def test_disconnect_stops_the_generation(server: ServerProcess) -> None:
    body = {"model": MODEL, "messages": QUESTION, "max_tokens": 400, "ignore_eos": True, "stream": True,
            "temperature": 0}
    with httpx.stream("POST", f"{server.url}/v1/chat/completions", json=body, timeout=60) as r:
        events = sse_events(r)
        first = json.loads(next(events))
        next(events)
        health = httpx.get(f"{server.url}/health", timeout=30).json()  # answered while the worker decodes
        assert health["busy"] is True
    # the client has gone: the next request is served, and the log says the first stopped early
    reply = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                       timeout=60)
    assert reply.status_code == 200
    line = server.log_line(first["id"])
    assert "stop: interrupted (client gone)" in line
    tokens = int(line.split(" tokens, ")[0].rsplit(" ", 1)[1])
    assert tokens < 100, line
    # a client that gives up on a whole (non-streamed) answer stops it too
    gone = sum("(client gone)" in line for line in server.log)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.url}/v1/chat/completions", json={**body, "stream": False}, timeout=1.5)
    reply = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 2},
                       timeout=60)
    assert reply.status_code == 200
    server.log_line("(client gone)", after=gone)  # the abandoned answer stopped too


def test_queue_full_answers_503_and_keeps_arrival_order(server: ServerProcess) -> None:
    """A decodes for as long as the test holds its stream (a gate, not a race against the CPU's
    speed), B waits behind it, C finds the queue (1 place on this server) full; B is answered
    after A ends."""
    order: list[str] = []
    results: dict[str, dict[str, object]] = {}
    started, release = threading.Event(), threading.Event()

    def long_stream() -> None:
        body = {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", f"{server.url}/v1/completions", json=body, timeout=120) as r:
            for _ in sse_events(r):
                started.set()
                if release.is_set():
                    break  # the client goes: its job ends at the next round
        order.append("a")

    def queued() -> None:
        body = {"model": MODEL, "prompt": "Hello", "max_tokens": 2}
        results["b"] = httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).json()
        order.append("b")

    a = threading.Thread(target=long_stream)
    a.start()
    assert started.wait(60)
    b = threading.Thread(target=queued)
    b.start()
    while httpx.get(f"{server.url}/health", timeout=30).json()["waiting"] < 1:  # B is queued: a state, polled
        assert b.is_alive() and a.is_alive()
    full = httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": "x", "max_tokens": 1})
    assert full.status_code == 503 and int(full.headers["retry-after"]) >= 1
    assert full.json()["error"]["code"] == "queue_full"
    release.set()
    a.join(120)
    b.join(120)
    assert order == ["a", "b"]
    assert results["b"]["specedge"]["queued_s"] > 0  # type: ignore[index]


LONG = "word " * 600


@pytest.mark.parametrize(("path", "body", "status", "code"), [
    ("/v1/chat/completions", {"model": 4, "messages": QUESTION}, 400, "invalid_value"),
    ("/v1/chat/completions", b'{"model": "x", "messages": [', 400, "invalid_json"),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "n": 2}, 422, "unsupported_parameter"),
    ("/v1/chat/completions", {"model": MODEL, "messages": QUESTION, "temperature": -1}, 400, "invalid_value"),
    ("/v1/chat/completions", {"model": MODEL}, 400, "invalid_value"),
    ("/v1/completions", {"model": MODEL, "prompt": LONG}, 413, "context_length_exceeded"),
    ("/v1/completions", {"model": MODEL, "prompt": LONG, "stream": True}, 413, "context_length_exceeded"),
    ("/v1/completions", {"model": MODEL, "prompt": [1, 2, 10**9]}, 400, None),
    ("/v1/completions", {"model": MODEL, "prompt": ["a", "b"]}, 422, "unsupported_parameter"),
    ("/v1/completions", b"x" * (5 << 20), 413, "request_too_large"),
    ("/v1/nothing", {}, 404, "not_found"),
])
def test_bad_requests_get_error_objects(server: ServerProcess, path: str, body: object, status: int,
                                        code: str | None) -> None:
    raw = {"content": body, "headers": {"Content-Type": "application/json"}}
    kwargs = raw if isinstance(body, bytes) else {"json": body}
    r = httpx.post(f"{server.url}{path}", timeout=30, **kwargs)  # type: ignore[arg-type]
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == code and error["type"] == "invalid_request_error"
    assert error["message"] and "\n" not in error["message"] and "Traceback" not in error["message"]
    assert httpx.get(f"{server.url}/health").status_code == 200


def test_any_model_name_is_the_served_model(client: openai.OpenAI) -> None:
    """One model is served: a client's own name for it (gpt-4o, an ollama tag) answers, as llama-server's."""
    asked = {"messages": QUESTION, "max_tokens": 3, "temperature": 0}
    named = client.chat.completions.create(model="gpt-4o", **asked)
    assert named.model == MODEL and named.choices[0].message.content == client.chat.completions.create(
        model=MODEL, **asked).choices[0].message.content
    assert [m.id for m in client.models.list()] == [MODEL]
    with pytest.raises(openai.UnprocessableEntityError, match="n > 1"):
        client.chat.completions.create(model=MODEL, messages=QUESTION, n=3)


def test_logprobs_spell_the_answer(client: openai.OpenAI, reference: Generator,
                                   greedy_answer: GenerationResult) -> None:
    """SmolLM2's byte-level BPE tokens: their bytes join into the answer, their log-probabilities
    are the plain library's."""
    reply = client.chat.completions.create(model=MODEL, messages=QUESTION, max_tokens=10, temperature=0,
                                           logprobs=True, top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert b"".join(bytes(e.bytes) for e in content).decode() == reply.choices[0].message.content == greedy_answer.text
    assert [e.token for e in content] == [bytes(e.bytes).decode() for e in content]
    expected = reference.generate(QUESTION, max_new_tokens=10, logprobs=3).logprobs
    assert [e.logprob for e in content] == pytest.approx([lp.logprob for lp in expected], abs=1e-4)
    assert [[t.logprob for t in e.top_logprobs] for e in content] == [
        pytest.approx([p for _, p in lp.top], abs=1e-4) for lp in expected]


def test_log_lines_carry_their_time_and_level(server: ServerProcess, client: openai.OpenAI) -> None:
    import re

    before = len([line for line in server.log if "tok/s" in line])
    client.completions.create(model=MODEL, prompt="Hello", max_tokens=2, temperature=0)
    line = server.log_line("tok/s", after=before)
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d INFO specedge serve: ", line), line


def test_the_log_level_keeps_the_less_severe_lines_out() -> None:
    import logging

    from specedge.serve.command import setup_logging

    log = logging.getLogger("specedge.serve")
    level, handlers, propagate = log.level, list(log.handlers), log.propagate
    try:
        setup_logging("warning")
        assert not log.isEnabledFor(logging.INFO) and log.isEnabledFor(logging.WARNING)
    finally:
        log.setLevel(level)
        log.handlers[:] = handlers
        log.propagate = propagate
