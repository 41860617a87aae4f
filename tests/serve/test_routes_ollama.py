"""ollama's API through the official `ollama` client, against the application in this process on a
tiny pair whose template lists tools and which fills in the middle: list, show (capabilities), ps,
version; chat and generate, whole and streamed (NDJSON, streaming when the body does not say, as
ollama does), their text the chat route's; options mapped; format as a schema; a tool round trip;
embeddings refused in one line; ollama's error object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from tests.serve.conftest import ollama_client, openai_client

ollama = pytest.importorskip("ollama")
pytest.importorskip("llguidance")

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: dict[str, Any] = {"temperature": 0, "num_predict": 16}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "the weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}}, "required": ["city"],
                   "additionalProperties": False}}}


@pytest.fixture(scope="module")
def client(http: TestClient):  # type: ignore[no-untyped-def]
    return ollama_client(http)


def chat_text(http: TestClient, messages: list[dict[str, str]], **extra: Any) -> str:
    reply = openai_client(http).chat.completions.create(model="x", messages=messages, max_tokens=16, temperature=0,
                                                        **extra)
    return reply.choices[0].message.content or ""


def test_list_show_ps_version(client) -> None:  # type: ignore[no-untyped-def]
    (model,) = client.list().models
    assert model.model == "tiny:latest" and model.details.family == "llama" and model.size > 0
    shown = client.show("tiny")
    assert set(shown.capabilities) == {"completion", "tools", "insert"}
    assert shown.modelinfo["llama.context_length"] == 512 and "<tool_call>" in shown.template
    (running,) = client.ps().models
    assert running.context_length == 512 and running.model == "tiny:latest"
    assert client._request_raw("GET", "/api/version").json()["version"]


def test_chat_whole_and_streamed_is_the_chats(client, http: TestClient) -> None:  # type: ignore[no-untyped-def]
    text = chat_text(http, ASK)
    whole = client.chat(model="qwen2.5-coder:latest", messages=ASK, options=GREEDY)
    assert whole.message.content == text and whole.done and whole.done_reason in ("stop", "length")
    assert whole.model == "qwen2.5-coder:latest" and whole.eval_count > 0 and whole.prompt_eval_count > 0
    raw = http.post("/api/chat", json={"model": "m", "messages": ASK, "options": GREEDY, "stream": False}).json()
    assert raw["specedge"]["drafter"] != "none"  # speculation's stats reach the route (the client drops the field)
    parts = list(client.chat(model="m", messages=ASK, options=GREEDY, stream=True))
    assert "".join(p.message.content for p in parts) == text
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]


def test_generate_raw_chat_and_fill_in_the_middle(client, http: TestClient) -> None:  # type: ignore[no-untyped-def]
    answer = client.generate(model="m", prompt=ASK[0]["content"], system="Be brief.", options=GREEDY)
    assert answer.response == chat_text(http, [{"role": "system", "content": "Be brief."}, *ASK])
    raw = client.generate(model="m", prompt="def f(", raw=True, options=GREEDY)
    plain = openai_client(http).completions.create(model="x", prompt="def f(", max_tokens=16, temperature=0)
    assert raw.response == plain.choices[0].text
    fim = client.generate(model="m", prompt="def f(", suffix="):\n    pass\n", options=GREEDY)
    same = openai_client(http).completions.create(model="x", prompt="def f(", suffix="):\n    pass\n", max_tokens=16,
                                                  temperature=0)
    assert fim.response == same.choices[0].text
    streamed = list(client.generate(model="m", prompt="def f(", raw=True, options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == raw.response and streamed[-1].done


def test_a_body_without_stream_is_streamed_as_ndjson(http: TestClient) -> None:
    r = http.post("/api/chat", json={"model": "m", "messages": ASK, "options": GREEDY})
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(line) for line in r.text.splitlines()]
    assert len(lines) > 1 and lines[-1]["done"] is True and not any(line["done"] for line in lines[:-1])


def test_options_are_mapped(client, http: TestClient) -> None:  # type: ignore[no-untyped-def]
    short = client.chat(model="m", messages=ASK, options={"temperature": 0, "num_predict": 3})
    assert short.eval_count == 3 and short.done_reason == "length"
    full = client.chat(model="m", messages=ASK, options=GREEDY).message.content
    stop = full[4:6]
    assert stop not in full[:5]
    stopped = client.chat(model="m", messages=ASK, options={**GREEDY, "stop": [stop]})
    assert stopped.message.content == full[:4] and stopped.done_reason == "stop"
    seeded = [client.chat(model="m", messages=ASK, options={"seed": 7, "temperature": 1.0, "top_k": 5, "top_p": 0.9,
                                                            "min_p": 0.01, "repeat_penalty": 1.1, "repeat_last_n": 8,
                                                            "presence_penalty": 0.5, "frequency_penalty": 0.5,
                                                            "num_predict": 8}).message.content for _ in range(2)]
    assert seeded[0] == seeded[1]
    penalized = chat_text(http, ASK, seed=7, top_p=0.9, presence_penalty=0.5, frequency_penalty=0.5,
                          extra_body={"top_k": 5, "min_p": 0.01, "repetition_penalty": 1.1, "repeat_last_n": 8,
                                      "max_tokens": 8, "temperature": 1.0})
    assert seeded[0] == penalized  # the same fields, by the other API's names


def test_format_is_a_schema_or_json(client) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.chat(model="m", messages=ASK, format=schema, options={"temperature": 0, "num_predict": 20})
    assert isinstance(json.loads(r.message.content)["ok"], bool)


def test_a_tool_round_trip(client) -> None:  # type: ignore[no-untyped-def]
    first = client.chat(model="m", messages=ASK, tools=[WEATHER], options={"temperature": 0, "num_predict": 60})
    calls = first.message.tool_calls or []
    assert all(c.function.name == "get_weather" for c in calls)  # under auto the tiny model may or may not call
    call = {"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}
    history = [*ASK, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": "18 degrees, sunny", "tool_name": "get_weather"}]
    answer = client.chat(model="m", messages=history, tools=[WEATHER], options=GREEDY)
    assert answer.prompt_eval_count > first.prompt_eval_count and answer.done


def test_a_call_is_an_object_of_arguments(http: TestClient) -> None:
    """What the model calls comes back as ollama carries calls: arguments as an object."""
    r = http.post("/api/chat", json={"model": "m", "messages": ASK, "stream": False, "tools": [WEATHER],
                                     "options": {"temperature": 0, "num_predict": 60},
                                     "specedge": {"acceptance": "rejection"}})
    assert r.status_code == 200, r.text
    assert all(isinstance(c["function"]["arguments"], dict) for c in r.json()["message"].get("tool_calls", []))
    forced = http.post("/v1/chat/completions", json={"model": "m", "messages": ASK, "tools": [WEATHER],
                                                     "tool_choice": "required", "parallel_tool_calls": False,
                                                     "max_tokens": 60, "temperature": 0}).json()
    (call,) = forced["choices"][0]["message"]["tool_calls"]
    from specedge.serve.routes_ollama import tool_call
    assert tool_call(call)["function"]["arguments"] == json.loads(call["function"]["arguments"])


def test_load_requests_and_embeddings(client, http: TestClient) -> None:  # type: ignore[no-untyped-def]
    loaded = http.post("/api/chat", json={"model": "m", "messages": []}).json()
    assert loaded["done"] is True and loaded["done_reason"] == "load"
    assert http.post("/api/generate", json={"model": "m", "keep_alive": 0}).json()["done_reason"] == "unload"
    with pytest.raises(ollama.ResponseError) as info:
        client.embed(model="m", input="hello")
    assert info.value.status_code == 422 and "embedding" in info.value.error and "\n" not in info.value.error
    r = http.post("/v1/embeddings", json={"model": "m", "input": "x"})
    assert r.status_code == 422 and "embedding" in r.json()["error"]["message"]


@pytest.mark.parametrize(("path", "body", "status", "needle"), [
    ("/api/chat", {"messages": ASK, "options": {"mirostat": 2}}, 422, "mirostat"),
    ("/api/chat", {"messages": ASK, "options": {"num_predict": 0}}, 400, "num_predict"),
    ("/api/chat", {"messages": ASK, "format": "yaml"}, 400, "format"),
    ("/api/chat", {"messages": ASK, "think": "very"}, 400, "think"),
    ("/api/chat", {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]}, 422, "images"),
    ("/api/chat", {"messages": ASK, "options": {"stop": ["s"] * 65}}, 400, "'options.stop'"),
    ("/api/chat", {"messages": ASK, "options": {"temperature": -1}}, 400, "'options.temperature'"),
    ("/api/generate", {"prompt": "x", "raw": True, "options": {"top_p": 3}}, 400, "'options.top_p'"),
    ("/api/generate", {"prompt": "x", "context": [1, 2]}, 422, "context"),
    ("/api/generate", {"prompt": "x", "template": "{{ .Prompt }}"}, 422, "template"),
])
def test_bad_input_is_ollamas_error_in_one_line(http: TestClient, path: str, body: dict[str, Any], status: int,
                                                needle: str) -> None:
    r = http.post(path, json={"model": "m", "stream": False, **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and needle in error and "\n" not in error


def test_each_route_is_counted_and_a_prompt_too_long_names_the_flag(http: TestClient) -> None:
    """The metrics count the routes by their paths; a prompt the context cannot hold is one line in
    each protocol's error shape naming --context, streamed or not (the error comes before any text)."""
    long = "x" * 600  # byte tokens: more than the tiny pair's 512
    answers = {
        "/api/chat": http.post("/api/chat", json={"model": "m", "messages": [{"role": "user", "content": long}]}),
        "/v1/messages": http.post("/v1/messages", json={"model": "m", "max_tokens": 5, "stream": True,
                                                        "messages": [{"role": "user", "content": long}]}),
        "/v1/responses": http.post("/v1/responses", json={"model": "m", "input": long, "stream": True}),
        "/completion": http.post("/completion", json={"prompt": long, "stream": True}),
    }
    messages = {"/api/chat": answers["/api/chat"].json()["error"],
                "/v1/messages": answers["/v1/messages"].json()["error"]["message"],
                "/v1/responses": answers["/v1/responses"].json()["error"]["message"],
                "/completion": answers["/completion"].json()["error"]["message"]}
    for path, message in messages.items():
        assert answers[path].status_code == 413, (path, answers[path].text)
        assert "specedge serve --context 1024" in message and "\n" not in message, (path, message)
    assert answers["/v1/messages"].json()["type"] == "error"
    metrics = http.get("/metrics").text
    for path in answers:
        assert f'specedge_requests_total{{route="{path}",status="413"}}' in metrics, path


def test_repeat_last_n_0_turns_every_penalty_off() -> None:
    """ollama's options as llama.cpp's sampler reads them: repeat_last_n 0 turns every penalty off."""
    from specedge.serve.routes_ollama import generate_request

    req = generate_request({"prompt": "ab", "options": {"repeat_penalty": 1.2, "frequency_penalty": 1,
                                                        "presence_penalty": 1, "repeat_last_n": 0}}, 512)
    assert (req.repetition_penalty, req.frequency_penalty, req.presence_penalty) == (1.0, 0.0, 0.0)
