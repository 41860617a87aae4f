"""Anthropic's Messages API through the official client's `messages.create`, against the application
in this process on a tiny pair whose template lists tools: its text is the chat route's, whole and
streamed as the API's events; a tool_use round trip (tool_choice any, the tool_result sent back);
stop_sequences and stop_reason; count_tokens; `x-api-key` as the key; Anthropic's error object."""

from __future__ import annotations

import json
from typing import Any

import pytest
from starlette.testclient import TestClient

from specedge.runtime import Generator
from specedge.serve.app import ServeSettings, create_app
from specedge.serve.guard import Origins
from tests.serve.conftest import HERE, anthropic_client, openai_client

anthropic = pytest.importorskip("anthropic")
pytest.importorskip("llguidance")

WEATHER = {"name": "get_weather", "description": "the weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                            "required": ["city"], "additionalProperties": False}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
# the client has no temperature argument: greedy decoding is asked for beside its arguments
GREEDY: dict[str, Any] = {"model": "claude-sonnet-4-5", "max_tokens": 24, "extra_body": {"temperature": 0}}


@pytest.fixture(scope="module")
def client(http: TestClient):  # type: ignore[no-untyped-def]
    return anthropic_client(http)


def test_text_whole_and_streamed_is_the_chats(client, http: TestClient) -> None:  # type: ignore[no-untyped-def]
    chat = openai_client(http).chat.completions.create(
        messages=[{"role": "system", "content": "Be brief."}, *ASK], model="x", max_tokens=24, temperature=0)
    whole = client.messages.create(system="Be brief.", messages=ASK, **GREEDY)
    text = chat.choices[0].message.content
    assert [b.type for b in whole.content] == ["text"] and whole.content[0].text == text
    assert whole.stop_reason == {"length": "max_tokens", "stop": "end_turn"}[chat.choices[0].finish_reason]
    use = whole.usage
    assert use.input_tokens + use.cache_read_input_tokens == chat.usage.prompt_tokens
    assert use.output_tokens == chat.usage.completion_tokens
    assert whole.model_extra["specedge"]["drafter"] != "none"
    events = list(client.messages.create(system=[{"type": "text", "text": "Be brief."}], messages=ASK, stream=True,
                                         **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[1] == "content_block_start" and kinds[-2:] == ["message_delta",
                                                                                                "message_stop"]
    assert "".join(e.delta.text for e in events if e.type == "content_block_delta") == text
    opened = events[0].message.usage  # the prompt's count from the start, as a client shows its context
    assert opened.input_tokens + opened.cache_read_input_tokens == chat.usage.prompt_tokens and opened.input_tokens > 0
    assert events[-2].delta.stop_reason == whole.stop_reason and events[-2].usage.output_tokens == use.output_tokens
    with client.messages.stream(system="Be brief.", messages=ASK, **GREEDY) as stream:  # the SDK's accumulator
        final = stream.get_final_message()
    assert final.content[0].text == text and final.stop_reason == whole.stop_reason


def test_a_tool_use_round_trip(client) -> None:  # type: ignore[no-untyped-def]
    first = client.messages.create(messages=ASK, tools=[WEATHER], tool_choice={"type": "any",
                                   "disable_parallel_tool_use": True}, **{**GREEDY, "max_tokens": 60})
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Oslo") and use.id.startswith("toolu_")
    streamed = list(client.messages.create(messages=ASK, tools=[WEATHER], stream=True, tool_choice={
        "type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}, **{**GREEDY, "max_tokens": 60}))
    starts = [e.content_block for e in streamed if e.type == "content_block_start"]
    partial = "".join(e.delta.partial_json for e in streamed if e.type == "content_block_delta")
    assert [b.type for b in starts] == ["tool_use"] and json.loads(partial) == use.input
    assert streamed[-2].delta.stop_reason == "tool_use"
    history = [*ASK, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "18 degrees, sunny"}]}]}]
    answer = client.messages.create(messages=history, tools=[WEATHER], **GREEDY)
    counted = client.messages.count_tokens(model="m", messages=history, tools=[WEATHER])
    assert answer.usage.input_tokens + answer.usage.cache_read_input_tokens == counted.input_tokens
    assert counted.input_tokens > first.usage.input_tokens + first.usage.cache_read_input_tokens


def test_stop_sequences(client) -> None:  # type: ignore[no-untyped-def]
    text = client.messages.create(messages=ASK, **GREEDY).content[0].text
    word = text[2:4]
    assert len(word) == 2 and word not in text[:3]
    stopped = client.messages.create(messages=ASK, stop_sequences=["never there", word], **GREEDY)
    assert (stopped.content[0].text, stopped.stop_reason, stopped.stop_sequence) == (text[:2], "stop_sequence", word)


def test_x_api_key_is_the_key(pair_gen: Generator) -> None:
    app = create_app(pair_gen, ServeSettings(model_id="tiny", api_key="sekret",
                                             origins=Origins.of_listener("127.0.0.1", 8000)))
    body = {"messages": ASK, "max_tokens": 2}
    with TestClient(app, base_url=HERE) as http:
        keyed = http.post("/v1/messages", json=body, headers={"x-api-key": "sekret", "anthropic-version": "2023-06-01"})
        wrong = http.post("/v1/messages", json=body, headers={"x-api-key": "nope"})
        bearer = http.post("/v1/messages", json=body, headers={"Authorization": "Bearer sekret"})
    assert keyed.status_code == 200 and keyed.json()["type"] == "message", keyed.text
    assert wrong.status_code == 401 and "x-api-key" in wrong.json()["error"]["message"]
    assert bearer.status_code == 200


@pytest.mark.parametrize(("body", "status", "needle"), [
    ({"messages": ASK}, 400, "max_tokens"),
    ({"messages": ASK, "max_tokens": 5, "temperature": 1.5}, 400, "temperature"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}], "max_tokens": 5}, 422, "image"),
    ({"messages": ASK, "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, 422,
     "web_search"),
    ({"messages": ASK, "max_tokens": 5, "stop_sequences": ["x" * 513]}, 400, "stop_sequences"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 5}, 400, "role"),
    ({"messages": ASK, "max_tokens": 5, "thinking": {"type": "sometimes"}}, 400, "thinking"),
    ({"messages": [*ASK, {"role": "assistant", "content": "{"}], "max_tokens": 5}, 422, "prefill"),
])
def test_bad_input_is_anthropics_error_in_one_line(http: TestClient, body: dict[str, Any], status: int,
                                                  needle: str) -> None:
    r = http.post("/v1/messages", json={"model": "m", **body})
    assert r.status_code == status, r.text
    error = r.json()
    assert error["type"] == "error" and error["error"]["type"] == "invalid_request_error"
    assert needle in error["error"]["message"] and "\n" not in error["error"]["message"]


def test_the_client_raises_on_a_bad_request(client) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(anthropic.BadRequestError, match="temperature"):
        client.messages.create(messages=ASK, model="m", max_tokens=5, extra_body={"temperature": 1.5})


def test_output_config_format_is_the_schema_and_effort_a_stated_no_op(client) -> None:  # type: ignore[no-untyped-def]
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.messages.create(messages=ASK, output_config={"format": {"type": "json_schema", "schema": schema},
                                                            "effort": "low"}, **GREEDY)
    assert isinstance(json.loads(r.content[0].text)["ok"], bool)
    assert r.model_extra["specedge"]["ignored"] == {"output_config.effort": "the model 'tiny' does not think"}
