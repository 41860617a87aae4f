"""The application in this process, on the tiny model (no server process, no worker thread): what a
refusal writes to the server's log."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from specedge.serve.worker import Job

MODEL = "tiny"
BURST = 50


class Lines(logging.Handler):
    """The server's log as its handler writes it: one string per record, its traceback included."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(logging.Formatter("specedge serve: %(message)s"))  # as serve/command.py's
        self.written: list[str] = []
        self.levels: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.written.append(self.format(record))
        self.levels.append(record.levelname)


@pytest.fixture
def server_log() -> Iterator[Lines]:
    log, lines = logging.getLogger("specedge.serve"), Lines()
    level = log.level
    log.addHandler(lines)
    log.setLevel(logging.INFO)
    yield lines
    log.removeHandler(lines)
    log.setLevel(level)


def test_a_full_queue_is_one_log_line_per_refusal(tiny_llama: tuple[Path, Path, Path], server_log: Lines) -> None:
    """A burst on a full queue: each request gets its 503, and each 503 is one line of the log (the
    old code wrote a 12-line traceback for each)."""
    _, target, _ = tiny_llama
    gen = Generator.load(target, single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, queue_size=0, origins=Origins.of_listener("127.0.0.1", 8000)))
    loop = asyncio.new_event_loop()
    try:
        app.state.server.worker.submit(Job("holding", lambda: [1], {}, loop, stream=False))  # the one place, kept:
        client = TestClient(app, base_url="http://127.0.0.1:8000")  # not entered, so no worker thread runs it
        for _ in range(BURST):
            r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 1})
            assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full", r.text
    finally:
        loop.close()
    assert len(server_log.written) == BURST, server_log.written
    for line in server_log.written:
        assert "\n" not in line and "503 the server is busy" in line, line


class Failing:
    """A Generator whose decoding fails in the middle, as a fault of the server would."""

    def __init__(self, gen: Generator, error: BaseException) -> None:
        self.gen, self.error = gen, error

    def __getattr__(self, name: str) -> object:
        return getattr(self.gen, name)

    def stream(self, *args: object, **kwargs: object):  # type: ignore[no-untyped-def]
        stream = self.gen.stream(*args, **kwargs)
        real = stream._segments
        error = self.error

        def failing():  # type: ignore[no-untyped-def]
            first = next(real, None)
            assert first is not None, "the request decoded nothing: the fault needs a first piece"
            yield first  # a first piece, then the fault
            raise error

        stream._segments = failing()
        return stream


@pytest.mark.parametrize(("error", "status", "code"), [(RuntimeError("boom"), 500, "internal_error"),
                                                        (MemoryError(), 503, "out_of_memory")])
@pytest.mark.parametrize("stream", [False, True])
def test_a_fault_while_decoding_is_an_error_object_and_one_log_entry(tiny_llama: tuple[Path, Path, Path],
                                                                     server_log: Lines, error: BaseException,
                                                                     status: int, code: str, stream: bool) -> None:
    """A non-streamed request gets the OpenAI error object with the status (500: the server's fault;
    503: out of memory, try again); a streamed one, whose headers went out with its first piece, an
    error event and `[DONE]`; the worker lives on and serves the next request."""
    from tests.serve.conftest import HERE

    _, target, _ = tiny_llama
    gen = Generator.load(target, single_steps=True, config=SpecConfig(gamma=0))
    settings = ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000))
    app = create_app(Failing(gen, error), settings)  # type: ignore[arg-type]
    # greedy and past the end-of-text token: a first piece comes whatever the random tiny model's
    # first token is (OpenAI's default temperature 1 sampled an end at once on one run in CI)
    body = {"model": MODEL, "prompt": "hello", "max_tokens": 8, "stream": stream, "temperature": 0,
            "ignore_eos": True}
    with TestClient(app, base_url=HERE) as client:
        r = client.post("/v1/completions", json=body)
        if stream:
            assert r.status_code == 200
            events = [line.removeprefix("data: ") for line in r.text.splitlines() if line.startswith("data: ")]
            assert events[-1] == "[DONE]"
            error = json.loads(events[-2])["error"]
            assert error["code"] == code and "\n" not in error["message"] and len(error["message"]) <= 300
        else:
            assert r.status_code == status and r.json()["error"]["code"] == code, r.text
            assert "\n" not in r.json()["error"]["message"] and len(r.json()["error"]["message"]) <= 300
        app.state.server.generator = gen  # the worker serves the next request
        app.state.server.worker.generator = gen
        assert client.post("/v1/completions", json={**body, "stream": False}).status_code == 200
    faults = [line for line in server_log.written if "failed" in line]
    assert len(faults) == 1 and ("RuntimeError" in faults[0] or "MemoryError" in faults[0])


def test_a_prompt_past_the_context_is_refused_by_its_prefix(tiny_llama: tuple[Path, Path, Path]) -> None:
    """A prompt under the character cap but past the context is refused with 413 once a prefix of
    it shows so (a prefix's tokens named, not all of them counted)."""
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url=HERE) as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "7" * 3000, "max_tokens": 1})
    assert r.status_code == 413 and r.json()["error"]["code"] == "context_length_exceeded"
    assert "has 504 tokens or more" in r.json()["error"]["message"]  # the prefix: 63 x 8 characters


@pytest.mark.parametrize("template", ["", "{{ 1 + 'a' }}"])
def test_a_chat_the_template_cannot_render_names_the_servers_own_way_round(tiny_llama: tuple[Path, Path, Path],
                                                                          template: str) -> None:
    """No template, or one that fails: a 400 on `messages` whose advice is the completions endpoint's
    `prompt` (not the CLI's --chat flag)."""
    import dataclasses

    from specedge.core.manifest import load_manifest
    from specedge.runtime.text.codec import TextCodec
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    gen.codec = TextCodec(tiny_llama[1], dataclasses.replace(load_manifest(tiny_llama[1]), chat_template=template))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url=HERE) as client:
        r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "hi"}]})
    error = r.json()["error"]
    assert r.status_code == 400 and error["param"] == "messages", r.text
    assert "send the text as `prompt` to /v1/completions" in error["message"] and "--chat" not in error["message"]
    assert ("fix the template" in error["message"]) == bool(template)


def test_min_p_reaches_the_sampler(tiny_llama: tuple[Path, Path, Path]) -> None:
    """min_p 1 keeps only the likeliest token: sampling at temperature 1 then gives greedy's tokens,
    under speculation too (the request's min_p is the target's law, not ignored)."""
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], draft=tiny_llama[2], config=SpecConfig(gamma=4))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    body = {"model": MODEL, "prompt": "abcab", "max_tokens": 12, "ignore_eos": True, "seed": 5}
    with TestClient(app, base_url=HERE) as client:
        greedy = client.post("/v1/completions", json={**body, "temperature": 0}).json()
        cut = client.post("/v1/completions", json={**body, "temperature": 1, "min_p": 1.0}).json()
        free = [client.post("/v1/completions", json={**body, "temperature": 1, "seed": s}).json()
                for s in range(4)]
    assert cut["choices"][0]["text"] == greedy["choices"][0]["text"]
    assert any(f["choices"][0]["text"] != greedy["choices"][0]["text"] for f in free)  # without it: not greedy


def test_tokenize_and_detokenize(tiny_llama: tuple[Path, Path, Path]) -> None:
    """llama-server's /tokenize and /detokenize (and vLLM's fields): the ids the model is given."""
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    chat = [{"role": "user", "content": "hi"}]
    with TestClient(app, base_url=HERE) as client:
        plain = client.post("/tokenize", json={"content": "héllo"}).json()
        special = client.post("/tokenize", json={"prompt": "héllo", "add_special": True}).json()
        messages = client.post("/tokenize", json={"model": MODEL, "messages": chat}).json()
        back = client.post("/detokenize", json={"tokens": plain["tokens"]}).json()
        refusals = [client.post("/detokenize", json={"tokens": [10**9]}),
                    client.post("/tokenize", json={"content": 5}),
                    client.post("/tokenize", json={"content": "x", "model": 5})]
        other = client.post("/tokenize", json={"content": "x", "model": "other"})  # any name: one model served
    assert plain["tokens"] == gen.codec.encode("héllo", add_special_tokens=False) and plain["count"] == 6
    assert special["tokens"] == gen.encode("héllo") and plain["max_model_len"] == gen.target.manifest.context
    assert messages["tokens"] == gen.encode(chat)
    assert back == {"content": "héllo"}
    assert [r.status_code for r in refusals] == [400, 400, 400]
    assert other.json()["tokens"] == gen.codec.encode("x", add_special_tokens=False)
    assert all(r.json()["error"]["message"] for r in refusals)


def test_a_stream_waiting_in_the_queue_is_kept_alive_by_pings(tiny_llama: tuple[Path, Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """A streamed request queued behind another gets its headers and SSE comments while it waits,
    then its answer (or, failing once its headers are out, an error event) and [DONE]."""
    import threading

    from specedge.serve import app as app_module
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    server, gate, pinged = app.state.server, threading.Event(), threading.Event()
    encode, ping = server.encode, app_module.EventStream.ping

    def held(req):  # type: ignore[no-untyped-def]
        if req.prompt == "HOLD":  # the request ahead: decoded once the others have been seen waiting
            gate.wait(30)
        return encode(req)

    streams_pinged: set[int] = set()

    async def noted_ping(self, send):  # type: ignore[no-untyped-def]
        await ping(self, send)
        streams_pinged.add(id(self))
        if len(streams_pinged) == 2:  # both waiting streams
            pinged.set()

    monkeypatch.setattr(server, "encode", held)
    monkeypatch.setattr(app_module.EventStream, "ping", noted_ping)
    monkeypatch.setattr(app_module, "PING_S", 0.02)
    body = {"model": MODEL, "max_tokens": 3, "stream": True}
    with TestClient(app, base_url=HERE) as client:
        answers: dict[str, object] = {}
        ahead = threading.Thread(target=lambda: client.post("/v1/completions", json={
            **body, "prompt": "HOLD", "stream": False}))
        ahead.start()
        while not server.worker.busy:  # the request ahead is on the worker (held at its encoding)
            threading.Event().wait(0.01)
        waiters = [threading.Thread(target=lambda p=p: answers.__setitem__(p, client.post(
            "/v1/completions", json={**body, "prompt": p}))) for p in ("ab", "7" * 3000)]
        for t in waiters:
            t.start()
        assert pinged.wait(30)
        gate.set()
        for t in (ahead, *waiters):
            t.join(30)
    ok, failed = answers["ab"], answers["7" * 3000]
    assert ok.status_code == 200 and ok.text.startswith(": ping\n\n") and ok.text.endswith("data: [DONE]\n\n")
    assert '"text"' in ok.text
    assert failed.status_code == 200 and failed.text.startswith(": ping")  # its headers were out when it failed
    assert "context_length_exceeded" in failed.text and failed.text.endswith("data: [DONE]\n\n")


def test_a_prompt_longer_than_the_context_names_the_flag_that_serves_more(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Agents send 10-30K-token prompts: the 413 says how to serve a longer context, in one line."""
    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url="http://127.0.0.1:8000") as client:
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x" * 200}]})
        ids = client.post("/v1/completions", json={"prompt": list(range(70))})
    for answer, tokens in ((r, "tokens"), (ids, "70 tokens")):
        assert answer.status_code == 413, answer.text
        message = answer.json()["error"]["message"]
        assert tokens in message and "served context holds 64 tokens" in message and "\n" not in message
        said, asked = int(message.split(" tokens")[0].split()[-1]), int(message.rsplit("--context ", 1)[1])
        assert asked >= 128 and asked > said and asked & (asked - 1) == 0  # a power of two that holds it
    assert ids.json()["error"]["message"].endswith("specedge serve --context 128")


def test_a_refused_request_is_one_info_line_naming_route_and_status(tiny_llama: tuple[Path, Path, Path],
                                                                    server_log: Lines) -> None:
    """A request refused as the client's fault (400) is one log line at INFO, the route, the status
    and the message, no traceback (`--log-level warning` leaves it out)."""
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url=HERE) as client:
        r = client.post("/v1/completions", json={"model": MODEL, "prompt": "hi", "max_tokens": 0})
    assert r.status_code == 400
    assert server_log.levels == ["INFO"], server_log.written
    line = server_log.written[0]
    assert line.startswith("specedge serve: POST /v1/completions: 400 'max_tokens'") and "\n" not in line


def test_a_chat_past_the_context_is_refused_by_its_prefix(tiny_llama: tuple[Path, Path, Path]) -> None:
    """A chat whose rendered text passes the context is refused (413) once a prefix of it shows so,
    as a prompt is: not tokenized whole."""
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000)))
    with TestClient(app, base_url=HERE) as client:
        r = client.post("/v1/chat/completions", json={"model": MODEL, "max_tokens": 1,
                                                      "messages": [{"role": "user", "content": "7" * 3000}]})
    assert r.status_code == 413 and r.json()["error"]["code"] == "context_length_exceeded"
    tokens = re.search(r"has (\d+) tokens or more", r.json()["error"]["message"])
    assert tokens is not None and 64 <= int(tokens[1]) <= 504, r.text  # a prefix of 63 x 8 characters


def test_a_decoding_deadline_ends_a_request_with_what_it_decoded(tiny_llama: tuple[Path, Path, Path],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """--decode-timeout: a request decodes until its deadline, then ends with its text so far,
    finish_reason length and the stop reason deadline; the slot serves the next one at once."""
    import time as time_module

    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    settings = ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000), decode_timeout=0.5)
    forward = gen.target.forward

    def slow(*args, **kwargs):  # type: ignore[no-untyped-def]
        time_module.sleep(0.05)  # 20 passes a second: a 60-token answer takes 3 s
        return forward(*args, **kwargs)

    monkeypatch.setattr(gen.target, "forward", slow)
    body = {"model": MODEL, "prompt": "abcab", "max_tokens": 60, "ignore_eos": True, "temperature": 0}
    with TestClient(create_app(gen, settings), base_url=HERE) as client:
        started = time_module.monotonic()
        r = client.post("/v1/completions", json=body).json()
        took = time_module.monotonic() - started
        assert r["choices"][0]["finish_reason"] == "length" and r["specedge"]["stop_reason"] == "deadline"
        assert 0 < r["usage"]["completion_tokens"] < 60 and took < 2.0
        r = client.post("/v1/completions", json={**body, "max_tokens": 3}).json()
        assert r["choices"][0]["finish_reason"] == "length" and r["specedge"]["stop_reason"] == "max_new_tokens"


def test_every_request_holds_a_place_in_the_queue_before_its_work(tiny_llama: tuple[Path, Path, Path],
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A full queue refuses a request before its tools are read, its grammar compiled or its text
    tokenized (/tokenize too); a waiting request whose client is gone gives its place back at once;
    /detokenize and /tokenize have a prompt's limits."""
    import threading

    from specedge.serve import app as app_module
    from tests.serve.conftest import HERE

    gen = Generator.load(tiny_llama[1], single_steps=True, config=SpecConfig(gamma=0))
    app = create_app(gen, ServeSettings(model_id=MODEL, origins=Origins.of_listener("127.0.0.1", 8000), queue_size=1))
    server, gate = app.state.server, threading.Event()
    encode, parsed = server.encode, []

    def held(req):  # type: ignore[no-untyped-def]
        gate.wait(30)  # the slot's job, until the test lets it go
        return encode(req)

    real_parse = app_module.parse_output
    monkeypatch.setattr(server, "encode", held)
    monkeypatch.setattr(app_module, "parse_output", lambda body: parsed.append(1) or real_parse(body))
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with TestClient(app, base_url=HERE) as client:
        first = threading.Thread(target=client.post, args=("/v1/completions",),
                                 kwargs={"json": {"prompt": "ab", "max_tokens": 2}})
        first.start()
        while server.worker.active < 1:
            pass
        waiting = app_module.Job("waiting", lambda: [1, 2], {}, None, stream=False)  # type: ignore[arg-type]
        server.worker.submit(waiting)  # the queue's one place
        r = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}], "tools": tools})
        assert r.status_code == 503 and r.json()["error"]["code"] == "queue_full" and parsed == []
        assert client.post("/tokenize", json={"content": "abc"}).status_code == 503
        waiting.cancel()  # its client gone: the place is back at once
        assert server.worker.waiting == 0
        r = client.post("/tokenize", json={"content": "x" * (server.max_prompt_chars + 1)})
        assert r.status_code == 413 and "\n" not in r.json()["error"]["message"]
        r = client.post("/detokenize", json={"tokens": [1] * (app_module.DETOKENIZE_IDS + 1)})
        assert r.status_code == 413 and r.json()["error"]["param"] == "tokens"
        gate.set()
        first.join(30)
        assert client.post("/tokenize", json={"content": "abc"}).json()["count"] == 3
