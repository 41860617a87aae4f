"""Structured output, tool calls and predicted outputs through the server, with the official openai
client against the application in this process: a tiny pair whose chat template lists tools
(Hermes-style markup, as Qwen2.5's), so a required call is constrained into being and parsed."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import openai
import pytest
from tokenizers import AddedToken, Tokenizer

from specedge.request import tools_grammar
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.constraints.grammar import GrammarConstraint, GrammarFault, Vocabulary
from specedge.runtime.text.tools import ToolMarkup
from specedge.serve.protocol import error_for
from tests.serve.conftest import openai_client, served_here
from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model, write_tokenizer

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
GREEDY: dict[str, object] = {"model": "tiny", "temperature": 0, "max_tokens": 120}  # a call: ~85 byte tokens
ONE_CALL: dict[str, object] = {**GREEDY, "parallel_tool_calls": False}  # a random model would call on and on


def marker_tokenizer() -> Tokenizer:
    """The byte tokenizer with <tool_call> and </tool_call> as added tokens of their own, as Qwen2.5's."""
    tok = byte_tokenizer()
    tok.add_tokens([AddedToken(marker, normalized=False) for marker in ("<tool_call>", "</tool_call>")])
    return tok


@pytest.fixture(scope="module", params=["text", "tokens"])
def tool_pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny pair (as tests/conftest.py's) whose chat template lists tools, with room for a
    conversation; its call markers written as text, or (as Qwen2.5's) tokens of their own."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("tools")
    tokens = request.param == "tokens"
    src = make_tiny_model(root / "src", "llama", seed=1, **({"vocab_size": VOCAB + 2} if tokens else {}))
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.05, seed=2)
    for folder in (src, draft_src):
        config = json.loads((folder / "tokenizer_config.json").read_text())
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": TOOLS_TEMPLATE}))
        if tokens:
            write_tokenizer(folder, marker_tokenizer())
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


def lazy_constraint(markup_tokens: bool) -> tuple[GrammarConstraint, Tokenizer]:
    tok = marker_tokenizer() if markup_tokens else byte_tokenizer()
    eos = [tok.token_to_id("<|eos|>")]
    markup = ToolMarkup.of(tok)
    strict = {**WEATHER, "function": {**WEATHER["function"], "strict": True}}
    grammar = tools_grammar([strict, CLOCK], "auto", markup=markup)  # a strict tool under tool_choice auto
    return GrammarConstraint(Vocabulary.of(tok, tok.get_vocab_size(), eos), grammar, eos), tok


@pytest.mark.parametrize("markup_tokens", [False, True])
def test_auto_with_a_strict_tool_leaves_text_free_and_binds_a_call_once_opened(markup_tokens: bool) -> None:
    """tool_choice auto with a strict tool: any text (ending there, or followed by calls); from the
    open marker on, the call's markup, a tool's name and (strict) its schema are enforced."""
    constraint, tok = lazy_constraint(markup_tokens)
    eos = tok.token_to_id("<|eos|>")
    for token in tok.encode("Let me check <tool", add_special_tokens=False).ids:
        assert constraint.allowed()[token]
        constraint.advance(token)
    assert constraint.allowed()[eos]  # free text may end anywhere
    for token in tok.encode("_call>" if not markup_tokens else "", add_special_tokens=False).ids:
        constraint.advance(token)
    if markup_tokens:  # the text "<tool" stays text; the marker is its own token
        constraint.rollback(5)
        constraint.advance(tok.token_to_id("<tool_call>"))
    forced = tok.decode(constraint.forced())
    assert forced == '\n{"name": "get_'  # the markup and the key, spaced as the template writes calls
    for token in constraint.forced():
        constraint.advance(token)
    allowed = {tok.decode([i]) for i in np.flatnonzero(constraint.allowed())}
    assert allowed == {"w", "t"} and not constraint.allowed()[eos]  # get_weather or get_time, nothing else
    for token in tok.encode('weather", "arguments": {"city": "', add_special_tokens=False).ids:
        constraint.advance(token)
    assert {tok.decode([i]) for i in np.flatnonzero(constraint.allowed())} == {"P", "O", "L"}  # the strict enum


def test_a_grammar_fault_is_a_500_in_one_short_line() -> None:
    """A grammar that refuses a token mid-decoding is specedge's fault: never a 400, never llguidance's dump."""
    dump = "Parser Error: token x doesn't satisfy the grammar; <state> Tokens: ... " + "Flags: {...} " * 100
    err = error_for(GrammarFault(dump))
    assert err.status == 500 and err.body()["error"]["type"] == "server_error"
    assert len(err.message) <= 300 and "Parser" not in err.message and "\n" not in err.message


@pytest.mark.parametrize(("fmt", "param", "why"), [
    ({"type": "json_schema", "json_schema": {"name": "loop", "schema": {"$ref": "#"}}},
     "response_format.json_schema.schema", "admits no output"),
    ({"type": "json_schema", "json_schema": {"name": "deep", "schema": {  # {"a": {"a": ... without end
        "type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}}},
     "response_format.json_schema.schema", "fixes"),
    ({"type": "regex", "regex": "a{1000000}"}, "response_format.regex", "fixes"),
    ({"type": "regex", "regex": "x{200}"}, "response_format.regex", "more than the 120"),
])
def test_a_grammar_no_output_can_meet_is_a_400_before_decoding(client: openai.OpenAI, fmt: dict[str, object],
                                                              param: str, why: str) -> None:
    """Never a 200 with empty content for a constraint that cannot be met: one line naming the field."""
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(messages=USER, response_format=fmt, **GREEDY)  # type: ignore[arg-type]
    error = e.value.body
    assert error["param"] == param and why in error["message"], error  # type: ignore[index]
    assert "\n" not in error["message"] and len(error["message"]) <= 300  # type: ignore[index]
