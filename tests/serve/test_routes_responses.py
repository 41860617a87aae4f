"""OpenAI's Responses API through the official client's `responses.create`, against the application
in this process on a tiny pair whose template lists tools: its text is the chat route's (the one
decoding), whole and streamed as the API's events; a function-call round trip (the call, its output
sent back as input items, the answer); instructions as the system message; bad input one 4xx line."""

from __future__ import annotations

import json
from typing import Any

import openai
import pytest
from starlette.testclient import TestClient

from tests.serve.conftest import openai_client

pytest.importorskip("llguidance")

WEATHER = {"type": "function", "name": "get_weather", "description": "the weather in a city", "strict": True,
           "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Oslo"]}},
                          "required": ["city"], "additionalProperties": False}}
ASK = "What is the weather in Paris?"
GREEDY: dict[str, Any] = {"model": "anything", "temperature": 0, "max_output_tokens": 24}


@pytest.fixture(scope="module")
def client(http: TestClient) -> openai.OpenAI:
    return openai_client(http)


def test_text_whole_and_streamed_is_the_chats(client: openai.OpenAI) -> None:
    chat = client.chat.completions.create(messages=[{"role": "system", "content": "Be brief."},
                                                    {"role": "user", "content": "hi"}], model="x", max_tokens=24,
                                          temperature=0)
    whole = client.responses.create(input="hi", instructions="Be brief.", **GREEDY)
    assert whole.output_text == chat.choices[0].message.content
    assert (whole.usage.input_tokens, whole.usage.output_tokens) == (chat.usage.prompt_tokens,
                                                                     chat.usage.completion_tokens)
    assert whole.status == ("incomplete" if chat.choices[0].finish_reason == "length" else "completed")
    assert whole.model_extra["specedge"]["drafter"] != "none"  # speculation's stats reach the route
    events = list(client.responses.create(input="hi", instructions="Be brief.", stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == whole.output_text
    assert events[-1].response.output_text == whole.output_text


def test_a_function_call_round_trip(client: openai.OpenAI) -> None:
    first = client.responses.create(input=ASK, tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                    **{**GREEDY, "max_output_tokens": 60})
    calls = [item for item in first.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather" and calls[0].call_id.startswith("call_")
    assert json.loads(calls[0].arguments)["city"] in ("Paris", "Oslo")
    streamed = list(client.responses.create(input=ASK, tools=[WEATHER], tool_choice="required", stream=True,
                                            parallel_tool_calls=False, **{**GREEDY, "max_output_tokens": 60}))
    done = [e for e in streamed if e.type == "response.function_call_arguments.done"]
    assert [json.loads(e.arguments) for e in done] == [json.loads(calls[0].arguments)]
    history = [{"role": "user", "content": ASK}, calls[0].model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": calls[0].call_id, "output": "18 degrees, sunny"}]
    answer = client.responses.create(input=history, tools=[WEATHER], **GREEDY)
    # the call and its output reach the prompt as the chat's assistant tool_calls and tool message do
    chat_tool = {"type": "function", "function": {k: v for k, v in WEATHER.items() if k != "type"}}
    chat = client.chat.completions.create(model="x", max_tokens=1, tools=[chat_tool], messages=[
        {"role": "user", "content": ASK},
        {"role": "assistant", "content": None, "tool_calls": [{"id": calls[0].call_id, "type": "function", "function": {
            "name": "get_weather", "arguments": calls[0].arguments}}]},
        {"role": "tool", "tool_call_id": calls[0].call_id, "content": "18 degrees, sunny"}])
    assert answer.usage.input_tokens == chat.usage.prompt_tokens > first.usage.input_tokens


def test_json_schema_text_format(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    r = client.responses.create(input="ok?", text={"format": {"type": "json_schema", "name": "answer", "schema": schema,
                                                              "strict": True}}, **{**GREEDY, "max_output_tokens": 20})
    assert isinstance(json.loads(r.output_text)["ok"], bool)


def test_reasoning_effort_on_a_model_that_does_not_think_is_a_stated_no_op(client: openai.OpenAI) -> None:
    r = client.responses.create(input="hi", reasoning={"effort": "none"}, **GREEDY)
    assert r.model_extra["specedge"]["ignored"] == {"reasoning.effort": "the model 'tiny' does not think"}
    assert r.output_text == client.responses.create(input="hi", **GREEDY).output_text


@pytest.mark.parametrize(("body", "status", "param"), [
    ({"input": "hi", "previous_response_id": "resp_1"}, 400, "previous_response_id"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, 422, "tools[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, 422,
     "input[0].content[0]"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, 400, "input[0].call_id"),
    ({"input": []}, 400, "input"),
    ({"input": "hi", "temperature": 3}, 400, "temperature"),
    ({"input": "hi", "reasoning": {"effort": "max"}}, 400, "reasoning.effort"),
    ({"input": "hi", "max_output_tokens": 0}, 400, "max_output_tokens"),  # the Responses API's names, not chat's
    ({"input": "hi", "text": {"format": {"type": "json_schema", "schema": 5}}}, 400, "text.format"),
])
def test_bad_input_is_one_4xx_line(http: TestClient, body: dict[str, Any], status: int, param: str) -> None:
    r = http.post("/v1/responses", json={"model": "m", **body})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["param"] == param and error["message"] and "\n" not in error["message"]
    assert status != 400 or f"'{param}'" in error["message"]  # the field as this API names it
