"""Every way a coder's tool attaches to a local model, against `specedge serve` on the default pair
(Qwen2.5-Coder 1.5B + 0.5B draft, n-gram lookup too), by the real client library or the exact
request an editor sends: llama.vscode's /infill, Continue's /completion, the openai client's
`responses.create`, the anthropic client's `messages.create` (the key as x-api-key), the ollama
client's chat, generate and list - each streamed and not, tool calls round-tripped where the
protocol has them, and speculation's stats on every answer."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.serve.conftest import ServerProcess, start_server, stop_server
from tests.serve.test_routes_llama import CONTINUE_STOPS, VSCODE_INFILL

pytestmark = pytest.mark.slow
pytest.importorskip("llguidance")
anthropic = pytest.importorskip("anthropic")
ollama = pytest.importorskip("ollama")

KEY = "a-key-for-the-tests"
AUTH = {"Authorization": f"Bearer {KEY}"}
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
ASK = "What is the weather in Paris?"
RESULT = '{"temperature_c": 18, "sky": "sunny"}'


@pytest.fixture(scope="module")
def server(default_pair: dict[str, Path]) -> Iterator[ServerProcess]:
    """A fixed γ: γ auto may rightly decode a short answer plain where this machine's measured
    costs say drafting does not pay (its choices are tests/runtime/round/test_gamma.py's); here
    every answer must carry drafts and say so."""
    srv = start_server(default_pair["int4"], default_pair["draft"], "--ngram", "--parallel", "1", "--gamma", "4",
                       "--model-name", "qwen2.5-coder", "--api-key", KEY)
    yield srv
    assert stop_server(srv) == 0, "\n".join(srv.log)


def post(server: ServerProcess, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=AUTH, timeout=300)


def speculated(stats: dict[str, Any]) -> None:
    """The answer was decoded speculatively, and says so."""
    assert stats["drafter"] != "none" and stats["drafted"] > 0 and stats["tokens_per_target_pass"] >= 1


def test_llama_vscode_infill(server: ServerProcess) -> None:
    """Its request as it builds it: the cursor after `    return ` in perimeter(w, h)."""
    body = {**VSCODE_INFILL, "n_predict": 24, "temperature": 0}
    whole = post(server, "/infill", body)
    assert whole.status_code == 200, whole.text
    answer = whole.json()
    line = answer["content"].split("\n")[0]
    assert "w" in line and "h" in line and ("2" in line or "+" in line), answer["content"]  # 2 * (w + h)
    assert answer["timings"]["draft_n"] > 0 and answer["timings"]["predicted_n"] > 0
    speculated(answer["specedge"])
    streamed = post(server, "/infill", {**body, "stream": True})
    chunks = [json.loads(x[6:]) for x in streamed.text.splitlines() if x.startswith("data: ")]
    assert "".join(c["content"] for c in chunks) == answer["content"] and chunks[-1]["stop"] is True
    assert chunks[-1]["timings"]["cache_n"] > 0  # the same prompt again: its cache kept


def test_continue_completion(server: ServerProcess) -> None:
    body = {"prompt": "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n\nprint(add(2, 3))\n<|fim_middle|>",
            "stream": True, "n_predict": 32, "temperature": 0, "stop": CONTINUE_STOPS, "top_k": 40, "top_p": 0.95}
    r = post(server, "/completion", body)
    chunks = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: ")]
    text = "".join(c["content"] for c in chunks)
    assert "return a + b" in text and chunks[-1]["stop"] is True, text
    speculated(chunks[-1]["specedge"])
    whole = post(server, "/completion", {**body, "stream": False}).json()
    assert whole["content"] == text


def test_openai_responses_with_a_function_call_round_trip(server: ServerProcess) -> None:
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0, timeout=300)
    tools = [{"type": "function", "name": "get_weather", "description": "Get the current weather in a city",
              "parameters": {**WEATHER_SCHEMA, "additionalProperties": False}, "strict": True}]
    first = client.responses.create(model="gpt-5", input=ASK, tools=tools, tool_choice="required", temperature=0,
                                    max_output_tokens=120)
    (call,) = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and json.loads(call.arguments) == {"city": "Paris"}
    speculated(first.model_extra["specedge"])
    history = [{"role": "user", "content": ASK}, call.model_dump(exclude_none=True),
               {"type": "function_call_output", "call_id": call.call_id, "output": RESULT}]
    # the agent has what it needs: no tools (with them listed, the 1.5B model calls again, on any route)
    answer = client.responses.create(model="gpt-5", input=history, temperature=0, max_output_tokens=120)
    assert "18" in answer.output_text and answer.status == "completed", answer.output_text
    events = list(client.responses.create(model="gpt-5", input=history, temperature=0, stream=True,
                                          max_output_tokens=120))
    assert events[-1].type == "response.completed" and events[-1].response.output_text == answer.output_text
    text = client.responses.create(model="gpt-5", input="Reverse a string in Python, in one line of code.",
                                   temperature=0, max_output_tokens=80)
    assert "[::-1]" in text.output_text


def test_anthropic_messages_with_a_tool_use_round_trip(server: ServerProcess) -> None:
    """The key as Claude Code sends it: x-api-key (the client's own Authorization is a wrong key here)."""
    client = anthropic.Anthropic(base_url=server.url, api_key="not-the-key", default_headers={"x-api-key": KEY},
                                 max_retries=0, timeout=300)
    greedy = {"model": "claude-sonnet-4-5", "max_tokens": 160, "extra_body": {"temperature": 0}}
    tools = [{"name": "get_weather", "description": "Get the current weather in a city",
              "input_schema": WEATHER_SCHEMA}]
    ask = [{"role": "user", "content": ASK}]
    first = client.messages.create(messages=ask, tools=tools, tool_choice={"type": "any"}, **greedy)
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert first.stop_reason == "tool_use" and (use.name, use.input) == ("get_weather", {"city": "Paris"})
    speculated(first.model_extra["specedge"])
    history = [*ask, {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": RESULT}]}]
    answer = client.messages.create(messages=history, **greedy)  # no tools: as above
    text = "".join(b.text for b in answer.content if b.type == "text")
    assert answer.stop_reason == "end_turn" and "18" in text, text
    with client.messages.stream(messages=history, system="Answer in one sentence.", **greedy) as stream:
        streamed = stream.get_final_message()
    assert streamed.stop_reason == "end_turn" and "18" in streamed.content[0].text


def test_ollama_chat_generate_and_list(server: ServerProcess) -> None:
    client = ollama.Client(host=server.url, headers=AUTH, timeout=300)
    (model,) = client.list().models
    assert model.model == "qwen2.5-coder:latest" and model.details.family == "qwen2"
    assert {"completion", "tools", "insert"} <= set(client.show("qwen2.5-coder").capabilities)
    options = {"temperature": 0, "num_predict": 80}
    ask = [{"role": "user", "content": "Reverse a string in Python, in one line of code."}]
    whole = client.chat(model="qwen2.5-coder", messages=ask, options=options)
    assert "[::-1]" in whole.message.content and whole.done and whole.eval_count > 0
    parts = list(client.chat(model="qwen2.5-coder", messages=ask, options=options, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    generated = client.generate(model="qwen2.5-coder", prompt="def fib(n):", raw=True, options=options)
    assert "fib(n - 1)" in generated.response or "fib(n-1)" in generated.response, generated.response
    pieces = list(client.generate(model="qwen2.5-coder", prompt="def fib(n):", raw=True, options=options,
                                  stream=True))
    assert "".join(p.response for p in pieces) == generated.response
    raw = httpx.post(f"{server.url}/api/chat", headers=AUTH, timeout=300,
                     json={"model": "qwen2.5-coder", "messages": ask, "stream": False, "options": options}).json()
    speculated(raw["specedge"])
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Get the current weather in "
                                               "a city", "parameters": WEATHER_SCHEMA}}]
    called = client.chat(model="qwen2.5-coder", messages=[{"role": "user", "content": ASK}], tools=tools,
                         options=options)
    (call,) = called.message.tool_calls
    assert (call.function.name, dict(call.function.arguments)) == ("get_weather", {"city": "Paris"})
    history = [{"role": "user", "content": ASK}, {"role": "assistant", "content": "", "tool_calls": [call]},
               {"role": "tool", "content": RESULT, "tool_name": "get_weather"}]
    answer = client.chat(model="qwen2.5-coder", messages=history, options=options)
    assert "18" in answer.message.content, answer.message.content
