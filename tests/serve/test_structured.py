"""Structured output, tool calls and predicted outputs through the server, with the official openai
client against the application in this process: a tiny pair whose chat template lists tools
(Hermes-style markup, as Qwen2.5's), so a required call is constrained into being and parsed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest

from specedge.runtime import Generator, SpecConfig
from tests.serve.conftest import openai_client, served_here
from tests.tiny_models import make_tiny_model

pytest.importorskip("llguidance")

TOOLS_TEMPLATE = (
    "{% if tools %}<|system|>You may call:{% for t in tools %}\n{{ t | tojson }}{% endfor %}{% endif %}"
    "{% for m in messages %}<|{{ m.role }}|>{% if m.content %}{{ m.content }}{% endif %}"
    "{% for c in m.tool_calls or [] %}<tool_call>\n{\"name\": \"{{ c.function.name }}\", \"arguments\": "
    "{{ c.function.arguments | tojson }}}\n</tool_call>{% endfor %}{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                            "parameters": {"type": "object", "properties": {
                                                "city": {"enum": ["Paris", "Oslo", "Lima"]},
                                                "unit": {"enum": ["C", "F"]}},
                                                "required": ["city", "unit"], "additionalProperties": False}}}
CLOCK = {"type": "function", "function": {"name": "get_time", "parameters": {
    "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
    "additionalProperties": False}}}
USER = [{"role": "user", "content": "What is the weather in Paris?"}]
GREEDY: dict[str, object] = {"model": "tiny", "temperature": 0, "max_tokens": 80}
ONE_CALL: dict[str, object] = {**GREEDY, "parallel_tool_calls": False}  # a random model would call on and on


@pytest.fixture(scope="module")
def tool_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny pair (as tests/conftest.py's) whose chat template lists tools, with room for a conversation."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("tools")
    src = make_tiny_model(root / "src", "llama", seed=1)
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.05, seed=2)
    for folder in (src, draft_src):
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOLS_TEMPLATE}))
    settings = ExportSettings(quant="fp32", context=1024, widths=(1, 2, 3, 5, 8))  # a byte a token
    return (export_model(src, root / "target", settings).path,
            export_model(draft_src, root / "draft", dataclasses.replace(settings, attention="fused")).path)


@pytest.fixture(scope="module")
def client(tool_pair: tuple[Path, Path]) -> Iterator[openai.OpenAI]:
    target, draft = tool_pair
    with served_here(Generator.load(target, draft=draft, ngram=True, config=SpecConfig(gamma=4, auto_gamma=True),
                                    )) as http:
        yield openai_client(http)


def test_a_required_tool_call_round_trip(client: openai.OpenAI) -> None:
    """Request with tools, the model's call (constrained to the function's schema), the tool's
    result sent back, and an answer."""
    first = client.chat.completions.create(messages=USER, tools=[WEATHER, CLOCK], tool_choice="required", **ONE_CALL)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    for call in choice.message.tool_calls:  # one or more (parallel calls are allowed)
        arguments = json.loads(call.function.arguments)
        assert call.type == "function" and call.id.startswith("call_")
        if call.function.name == "get_weather":
            assert arguments["city"] in ("Paris", "Oslo", "Lima") and arguments["unit"] in ("C", "F")
        else:
            assert call.function.name == "get_time" and arguments["zone"] in ("UTC", "CET")
    call = choice.message.tool_calls[0]
    assert first.model_extra["specedge"]["forced"] > 5  # the markup, keys and quotes: forced, never drafted
    history = [*USER, choice.message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 degrees, sunny"}]
    answer = client.chat.completions.create(messages=history, tools=[WEATHER, CLOCK], **GREEDY)
    assert answer.choices[0].finish_reason in ("stop", "length") and answer.usage.prompt_tokens > \
        first.usage.prompt_tokens


def test_a_named_tool_is_the_one_called_and_streamed_as_the_whole(client: openai.OpenAI) -> None:
    named = {"type": "function", "function": {"name": "get_time"}}
    whole = client.chat.completions.create(messages=USER, tools=[WEATHER, CLOCK], tool_choice=named, **ONE_CALL)
    calls = whole.choices[0].message.tool_calls
    assert all(c.function.name == "get_time" and json.loads(c.function.arguments)["zone"] in ("UTC", "CET")
               for c in calls)
    chunks = list(client.chat.completions.create(messages=USER, tools=[WEATHER, CLOCK], tool_choice=named,
                                                 stream=True, **ONE_CALL))
    streamed = [c for chunk in chunks if chunk.choices for c in (chunk.choices[0].delta.tool_calls or [])]
    assert [(c.function.name, c.function.arguments) for c in streamed] == \
        [(c.function.name, c.function.arguments) for c in calls]
    assert [c.index for c in streamed] == list(range(len(calls)))
    assert chunks[-1].choices[0].finish_reason == "tool_calls"
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices).strip()


def test_tool_choice_none_lists_tools_and_parses_nothing(client: openai.OpenAI) -> None:
    plain = client.chat.completions.create(messages=USER, **GREEDY)
    listed = client.chat.completions.create(messages=USER, tools=[WEATHER], tool_choice="none", **GREEDY)
    assert listed.usage.prompt_tokens > plain.usage.prompt_tokens and not listed.choices[0].message.tool_calls


def test_a_json_schema_response_follows_the_schema(client: openai.OpenAI) -> None:
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"enum": [1, 2, 3]}},
              "required": ["answer", "n"], "additionalProperties": False}
    fmt = {"type": "json_schema", "json_schema": {"name": "reply", "schema": schema, "strict": True}}
    for stream in (False, True):
        if stream:
            chunks = client.chat.completions.create(messages=USER, response_format=fmt, stream=True, **GREEDY)
            text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            reply = client.chat.completions.create(messages=USER, response_format=fmt, **GREEDY)
            text = reply.choices[0].message.content
        reply = json.loads(text)
        assert reply["answer"] in ("yes", "no") and reply["n"] in (1, 2, 3)


@pytest.fixture(scope="module")
def smollm2_client(smollm2: dict[str, Path]) -> Iterator[openai.OpenAI]:
    """SmolLM2 (fp32, its int4 export drafting): a model whose answers are text, to predict."""
    with served_here(Generator.load(smollm2["fp32"], draft=smollm2["int4"], config=SpecConfig(gamma=4))) as http:
        yield openai_client(http)


def test_a_prediction_is_drafted_and_reported(smollm2_client: openai.OpenAI) -> None:
    """The answer passed back as the prediction: the same answer, most of it accepted from it."""
    client = smollm2_client
    ask = [{"role": "user", "content": "Write a Python function that adds two numbers."}]
    plain = client.chat.completions.create(messages=ask, **GREEDY)
    text = plain.choices[0].message.content
    predicted = client.chat.completions.create(messages=ask, prediction={"type": "content", "content": text},
                                               **GREEDY)
    assert predicted.choices[0].message.content == text
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 10 and details.rejected_prediction_tokens >= 0
    assert predicted.model_extra["specedge"]["target_calls"] < plain.model_extra["specedge"]["target_calls"]


def test_tools_for_a_template_that_cannot_list_them_are_a_422(tiny_llama: tuple[Path, Path, Path]) -> None:
    with served_here(Generator.load(tiny_llama[1])) as http, \
            pytest.raises(openai.UnprocessableEntityError, match="does not list tools"):
        openai_client(http).chat.completions.create(messages=USER, tools=[WEATHER], **GREEDY)
