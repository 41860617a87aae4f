"""Tool calls on the models specedge ships by default (Qwen2.5-Coder 1.5B + 0.5B draft, n-gram
lookup too), through the official openai client, as a local agent uses them: a request with
tools, the model's call, the tool's result sent back, the answer - for tool_choice auto, required
and a named function, whole and streamed. Qwen2.5 spells `<tool_call>` as one token of its own,
so a grammar that forces the marker's text fails on it (tests/serve/test_structured.py covers
both spellings on tiny models)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from specedge.runtime import Generator, SpecConfig
from tests.serve.conftest import openai_client, served_here

pytestmark = pytest.mark.slow
pytest.importorskip("llguidance")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}
CLOCK = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: dict[str, Any] = {"model": "qwen2.5-coder", "temperature": 0, "max_tokens": 120}
CHOICES = {"auto": "auto", "required": "required", "named": {"type": "function", "function": {"name": "get_weather"}}}


@pytest.fixture(scope="module")
def client(default_pair: dict[str, Path]) -> Iterator[openai.OpenAI]:
    gen = Generator.load(default_pair["int4"], draft=default_pair["draft"], ngram=True,
                         config=SpecConfig(gamma=4, auto_gamma=True))
    with served_here(gen, model="qwen2.5-coder") as http:
        yield openai_client(http)


def weather_call(message: Any) -> Any:
    (call,) = message.tool_calls
    assert call.type == "function" and call.id.startswith("call_")
    assert (call.function.name, json.loads(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    return call


@pytest.mark.parametrize("choice", list(CHOICES))
def test_a_tool_call_round_trip(client: openai.OpenAI, choice: str) -> None:
    """Request, the model's call, the tool's result, the answer that uses it."""
    first = client.chat.completions.create(messages=ASK, tools=[WEATHER, CLOCK], tool_choice=CHOICES[choice], **GREEDY)
    assert first.choices[0].finish_reason == "tool_calls" and not first.choices[0].message.content
    call = weather_call(first.choices[0].message)
    history = [*ASK, first.choices[0].message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 18, "sky": "sunny"}'}]
    answer = client.chat.completions.create(messages=history, **GREEDY)  # the agent has what it needs: no tools
    text = answer.choices[0].message.content
    assert answer.choices[0].finish_reason == "stop" and "18" in text and "Paris" in text  # the result, used


@pytest.mark.parametrize("choice", list(CHOICES))
def test_a_streamed_call_is_assembled_by_the_client(client: openai.OpenAI, choice: str) -> None:
    with client.chat.completions.stream(messages=ASK, tools=[WEATHER, CLOCK], tool_choice=CHOICES[choice],
                                        **GREEDY) as stream:
        for _ in stream:
            pass
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    weather_call(final.choices[0].message)


def test_strict_tools_under_auto_and_one_call_at_most(client: openai.OpenAI) -> None:
    """A strict tool under auto (the lazy grammar) and parallel_tool_calls false: still one valid call."""
    closed = {**WEATHER["function"]["parameters"], "additionalProperties": False}
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True, "parameters": closed}}
    for choice in ("auto", "required"):
        reply = client.chat.completions.create(messages=ASK, tools=[strict, CLOCK], tool_choice=choice,
                                               parallel_tool_calls=False, **GREEDY)
        weather_call(reply.choices[0].message)
