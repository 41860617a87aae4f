"""The other protocols' routes that decode (llama-server's /completion and /infill, OpenAI's
/v1/responses, Anthropic's /v1/messages, ollama's /api/chat and /api/generate) are bounded as
/v1/chat/completions is: each needs the API key, takes a place in the queue before its request is
read (a full queue refuses it before any work), queues its job with the key as its owner and the
decoding deadline, and a client that leaves while its job waits gives the place back at once. The
application is called directly, with no worker thread, so every job stays queued; what a running
job does when its client leaves is the same Job's (tests/serve/test_bounds.py)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx
import pytest

from specedge.runtime import Generator, SpecConfig
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from specedge.serve.worker import Job

KEYS = ("first-key", "second-key")
DEADLINE = 30.0
ASK = [{"role": "user", "content": "hi"}]
ROUTES: dict[str, dict[str, Any]] = {
    "/completion": {"prompt": "ab", "n_predict": 4},
    "/infill": {"input_prefix": "def f(", "input_suffix": ")\n", "n_predict": 4},
    "/v1/responses": {"input": "hi", "max_output_tokens": 4},
    "/v1/messages": {"messages": ASK, "max_tokens": 4},
    "/api/chat": {"messages": ASK, "options": {"num_predict": 4}},
    "/api/generate": {"prompt": "ab", "options": {"num_predict": 4}},
}
BAD = {"/completion": {"prompt": "ab", "temperature": "hot"},
       "/api/generate": {"prompt": "ab", "options": {"temperature": "hot"}}}


@pytest.fixture(scope="module")
def app(protocol_pair: tuple[Path, Path]):  # type: ignore[no-untyped-def]
    gen = Generator.load(protocol_pair[0], single_steps=True, config=SpecConfig(gamma=0))
    return create_app(gen, ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000),
                                         queue_size=0, api_key=KEYS, decode_timeout=DEADLINE))


def headers(path: str, key: str | None) -> list[tuple[bytes, bytes]]:
    sent = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    if key is not None:  # Anthropic's clients send x-api-key, the others a bearer token
        sent.append((b"x-api-key", key.encode()) if path == "/v1/messages" else
                    (b"authorization", f"Bearer {key}".encode()))
    return sent


def client(app) -> httpx.AsyncClient:  # type: ignore[no-untyped-def]
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:8000")


@pytest.mark.parametrize("path", list(ROUTES))
def test_every_decoding_route_needs_the_key(app, path: str) -> None:  # type: ignore[no-untyped-def]
    async def go() -> list[httpx.Response]:
        async with client(app) as http:
            return [await http.post(path, json=ROUTES[path], headers=dict((k.decode(), v.decode()) for k, v in h))
                    for h in (headers(path, None), headers(path, "wrong-key"))]

    for r in asyncio.run(go()):
        assert r.status_code == 401, r.text


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("path", list(ROUTES))
def test_a_routes_job_is_the_chats_queued_job_and_its_client_leaving_gives_the_place_back(
        app, path: str, stream: bool, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    server = app.state.server
    jobs: list[Job] = []
    prepared: list[str] = []
    submit, prepare = server.worker.submit, server.prepare
    monkeypatch.setattr(server.worker, "submit", lambda job, admission=None: jobs.append(job) or submit(job, admission))
    monkeypatch.setattr(server, "prepare", lambda read: prepared.append(path) or prepare(read))
    body = json.dumps({**ROUTES[path], "stream": stream}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "POST", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": b"", "root_path": "",
             "headers": [*headers(path, KEYS[1]), (b"content-length", str(len(body)).encode())],
             "server": ("127.0.0.1", 8000), "client": ("127.0.0.1", 50000)}

    async def go() -> None:
        leave, sent = asyncio.Event(), []
        request = [{"type": "http.request", "body": body, "more_body": False}]

        async def receive() -> dict[str, Any]:
            if request:
                return request.pop()
            await leave.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        task = asyncio.create_task(app(scope, receive, send))
        for _ in range(500):
            if jobs or task.done():
                break
            await asyncio.sleep(0.01)
        assert jobs, sent  # queued, not refused
        job = jobs[0]
        assert job.owner == 1 and job.timeout == DEADLINE and job.admission is not None
        assert server.worker.waiting == 1 and prepared == [path]
        # the queue's one place is taken: a request is refused before it is read (a bad one too)
        other = "/api/generate" if path != "/api/generate" else "/completion"
        async with client(app) as http:
            r = await http.post(other, json=BAD[other], headers={"Authorization": f"Bearer {KEYS[0]}"})
            assert r.status_code == 503 and "busy" in r.text and prepared == [path], r.text
            leave.set()  # the client leaves while its job waits
            await asyncio.wait_for(task, 10)
            assert job.cancelled.is_set() and server.worker.waiting == 0
            r = await http.post(other, json=BAD[other], headers={"Authorization": f"Bearer {KEYS[0]}"})
            assert r.status_code == 400, r.text  # the place is back: read now, and refused for what it is

    asyncio.run(go())


def test_a_request_that_sets_no_limit_runs_to_the_context_as_its_protocol_does(pair_gen: Generator) -> None:
    """llama-server's n_predict, ollama's num_predict and the Responses API's max_output_tokens left out
    mean no limit but the context: the server's --max-tokens (here 4) is not theirs."""
    from starlette.testclient import TestClient

    from specedge.serve.app import ServeSettings, create_app
    from specedge.serve.guard import Origins
    from tests.serve.conftest import HERE

    settings = ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000), max_tokens=4)
    greedy = {"temperature": 0}
    with TestClient(create_app(pair_gen, settings), base_url=HERE) as client:
        llama = client.post("/completion", json={"prompt": "abcab", **greedy}).json()
        ollama = client.post("/api/generate", json={"prompt": "abcab", "stream": False, "options": greedy}).json()
        responses = client.post("/v1/responses", json={"input": "abcab", **greedy}).json()
        chat = client.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "abcab"}],
                                                         **greedy}).json()
    assert llama["tokens_predicted"] > 4 and ollama["eval_count"] > 4, (llama, ollama)
    assert responses["usage"]["output_tokens"] > 4, responses
    assert chat["usage"]["completion_tokens"] == 4  # OpenAI's route keeps the server's --max-tokens


def test_the_guards_refusals_and_unknown_paths_speak_each_protocols_error(pair_gen: Generator) -> None:
    """A missing key (401) and a path that is not there (404) answer in the error object of the
    protocol the path belongs to: Anthropic's under /v1/messages, ollama's under /api/, else OpenAI's."""
    from starlette.testclient import TestClient

    from specedge.serve.app import ServeSettings, create_app
    from specedge.serve.guard import Origins, RequestGuard
    from tests.serve.conftest import HERE

    app = create_app(pair_gen, ServeSettings(model_id="tiny", origins=Origins.of_listener("127.0.0.1", 8000)))
    guarded = RequestGuard(app, Origins.of_listener("127.0.0.1", 8000), api_key="sekret")
    with TestClient(guarded, base_url=HERE) as client:
        anthropic = client.post("/v1/messages", json={})
        ollama = client.post("/api/chat", json={})
        openai = client.post("/v1/chat/completions", json={})
        missing = client.get("/api/nothing", headers={"Authorization": "Bearer sekret"})
    assert anthropic.status_code == ollama.status_code == openai.status_code == 401
    assert anthropic.json()["type"] == "error" and anthropic.json()["error"]["type"] == "authentication_error"
    assert isinstance(ollama.json()["error"], str) and isinstance(openai.json()["error"], dict)
    assert missing.status_code == 404 and isinstance(missing.json()["error"], str)
