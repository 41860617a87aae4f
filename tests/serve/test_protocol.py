"""Request parsing and validation, without a model: what is accepted, what is refused with which status."""

from __future__ import annotations

import pytest

from specedge.request import finish_reason
from specedge.serve.protocol import APIError, parse_chat, parse_completion, parse_json
from specedge.serve.structured import parse_output
from specedge.serve.worker import cached_prefix

USER = [{"role": "user", "content": "hi"}]


def parse_chat_request(body: dict[str, object]) -> None:
    """What the server parses of a chat request: its parameters, then the output's shape."""
    parse_chat(body)
    parse_output(body)


def status_of(fn, body) -> int:  # type: ignore[no-untyped-def]
    with pytest.raises(APIError) as info:
        fn(body)
    message = info.value.body()["error"]["message"]  # type: ignore[index]
    assert "\n" not in message and message
    return info.value.status


def test_chat_defaults_and_parameters() -> None:
    req = parse_chat({"model": "m", "messages": USER})
    assert (req.kind, req.model, req.stream, req.max_tokens, req.temperature, req.stop) == ("chat", "m", False,
                                                                                             None, None, ())
    req = parse_chat({"messages": USER, "max_tokens": 5, "max_completion_tokens": 7, "temperature": 0,
                      "top_p": 0.5, "seed": -1, "stop": "x", "stream": True,
                      "stream_options": {"include_usage": True}, "n": 1, "logprobs": False,
                      "response_format": {"type": "text"}, "unknown_extra": 3})
    assert req.max_tokens == 7 and req.temperature == 0.0 and req.top_p == 0.5
    assert req.seed == (1 << 64) - 1 and req.stop == ("x",) and req.stream and req.include_usage


def test_min_p_and_a_neutral_repetition_penalty_are_taken() -> None:
    assert parse_chat({"messages": USER}).min_p is None
    assert parse_chat({"messages": USER, "min_p": 0.05, "repetition_penalty": 1.0}).min_p == 0.05
    assert parse_completion({"prompt": "x", "min_p": 0}).min_p == 0.0


def test_the_acceptance_rule_is_a_request_field() -> None:
    assert parse_chat({"messages": USER}).acceptance is None
    assert parse_chat({"messages": USER, "specedge": {"acceptance": "rejection"}}).acceptance == "rejection"
    assert parse_completion({"prompt": "x", "specedge": {"acceptance": "race"}}).acceptance == "race"
    assert status_of(parse_chat, {"messages": USER, "specedge": {"acceptance": "coin"}}) == 400
    assert status_of(parse_chat, {"messages": USER, "specedge": {"gamma": 3}}) == 400
    assert status_of(parse_chat, {"messages": USER, "specedge": "rejection"}) == 400


def test_message_content_parts_and_roles() -> None:
    req = parse_chat({"messages": [{"role": "developer", "content": "be brief"},
                                   {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                {"type": "text", "text": "b"}]},
                                   {"role": "assistant", "content": None}]})
    assert req.messages == ({"role": "system", "content": "be brief"}, {"role": "user", "content": "ab"},
                            {"role": "assistant", "content": ""})


TOOL = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


@pytest.mark.parametrize(("body", "status"), [
    ({"messages": USER, "n": 2}, 422),
    ({"messages": USER, "top_logprobs": 21, "logprobs": True}, 400),
    ({"messages": USER, "top_logprobs": 2}, 400),  # without logprobs true
    ({"messages": USER, "logprobs": "yes"}, 400),
    ({"messages": USER, "tools": [{"type": "function"}]}, 400),  # no function
    ({"messages": USER, "functions": [{"name": "f"}]}, 422),  # the deprecated form
    ({"messages": USER, "presence_penalty": 2.5}, 400),  # OpenAI's range: -2 to 2
    ({"messages": USER, "frequency_penalty": "1"}, 400),
    ({"messages": USER, "repetition_penalty": 0}, 400),  # > 0
    ({"messages": USER, "repeat_penalty": -1.0}, 400),  # llama-server's name
    ({"messages": USER, "logit_bias": {"12": 101}}, 400),  # -100 to 100
    ({"messages": USER, "logit_bias": {"abc": 1}}, 400),  # keys are token ids
    ({"messages": USER, "logit_bias": [1, 2]}, 400),
    ({"messages": USER, "min_p": 1.5}, 400),
    ({"messages": USER, "min_p": "0.1"}, 400),
    ({"messages": USER, "chat_template_kwargs": {"tools": []}}, 400),
    ({"messages": [{"role": "tool", "content": "x"}]}, 400),  # no tool_call_id
    ({"messages": [{"role": "function", "name": "f", "content": "x"}]}, 422),
    ({"messages": USER, "tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400),
    ({"messages": USER, "tool_choice": "required"}, 400),  # no tools
    ({"messages": USER, "tools": [{**TOOL, "function": {**TOOL["function"], "parameters": {"type": 7}}}]}, 400),
    ({"messages": USER, "tools": [TOOL, TOOL]}, 400),  # the same name twice
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "nope"}}}},
     400),
    ({"messages": USER, "response_format": {"type": "json_schema", "json_schema": {"schema": {"uniqueItems": True}}}},
     400),  # a keyword the engine cannot enforce
    ({"messages": USER, "response_format": {"type": "regex", "regex": "[a-"}}, 400),
    ({"messages": USER, "response_format": {"type": "xml"}}, 400),
    ({"messages": USER, "prediction": {"type": "content", "content": 5}}, 400),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]}, 422),
    ({"messages": []}, 400),
    ({}, 400),
    ({"messages": [{"role": "wizard", "content": "x"}]}, 400),
    ({"messages": [{"role": "user", "content": 3}]}, 400),
    ({"messages": USER, "temperature": 2.5}, 400),
    ({"messages": USER, "temperature": True}, 400),
    ({"messages": USER, "top_p": 0}, 400),
    ({"messages": USER, "max_tokens": 0}, 400),
    ({"messages": USER, "max_tokens": "9"}, 400),
    ({"messages": USER, "stop": ["a"] * 65}, 400),
    ({"messages": USER, "stop": ["a" * 513]}, 400),
    ({"messages": USER, "reasoning_effort": "extreme"}, 400),
    ({"messages": USER, "response_format": {"type": "json_object", "schema": "object"}}, 400),
    ({"messages": USER, "stop": [""]}, 400),
    ({"messages": USER, "stream": "yes"}, 400),
    ({"messages": USER, "stream_options": {"include_usage": True}}, 400),
    ({"messages": USER, "model": 3}, 400),
])
def test_chat_refusals(body: dict[str, object], status: int) -> None:
    assert status_of(parse_chat_request, body) == status


def test_clients_as_they_send_stop_lists_and_reasoning_effort() -> None:
    """Continue sends a dozen stop strings to a local server; 64 of up to 512 characters are taken,
    each once. reasoning_effort is a thinking model's switch: none and minimal turn it off."""
    stops = ["\n\n", "```", "<|endoftext|>", "<|fim_prefix|>", "/src/", "#- coding: utf-8", *map(str, range(57))]
    assert parse_chat({"messages": USER, "stop": [*stops, "```"]}).stop == tuple(stops)
    assert parse_chat({"messages": USER, "stop": ["y" * 512]}).stop == ("y" * 512,)
    assert parse_chat({"messages": USER, "stop": []}).stop == ()
    efforts = {e: parse_chat({"messages": USER, "reasoning_effort": e}).thinking
               for e in ("none", "minimal", "low", "medium", "high")}
    assert efforts == {"none": False, "minimal": False, "low": True, "medium": True, "high": True}
    assert parse_chat({"messages": USER}).thinking is None


def test_a_json_object_with_a_schema_is_that_schema() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    output = parse_output({"response_format": {"type": "json_object", "schema": schema}})
    assert (output["grammar"].kind, output["grammar"].source, output["grammar_param"]) == (
        "json_schema", schema, "response_format.schema")
    assert parse_output({"response_format": {"type": "json_object"}})["grammar"].kind == "json_object"


def test_penalties_and_logit_bias_are_read_as_their_apis_define_them() -> None:
    req = parse_chat({"messages": USER, "presence_penalty": 0.5, "frequency_penalty": -1, "repetition_penalty": 1.1,
                      "repeat_last_n": 64, "logit_bias": {"12": -100, "7": 2.5}})
    assert (req.presence_penalty, req.frequency_penalty) == (0.5, -1)
    assert (req.repetition_penalty, req.repeat_last_n) == (1.1, 64)
    assert req.logit_bias == {12: -100.0, 7: 2.5}
    llama = parse_chat({"messages": USER, "repeat_penalty": 1.2, "repeat_last_n": -1})  # llama-server's names
    assert (llama.repetition_penalty, llama.repeat_last_n) == (1.2, 0)
    off = parse_chat({"messages": USER, "repeat_penalty": 1.2, "frequency_penalty": 1, "repeat_last_n": 0})
    assert (off.repetition_penalty, off.frequency_penalty, off.presence_penalty) == (1.0, 0.0, 0.0)  # as llama-server
    none = parse_chat({"messages": USER, "presence_penalty": 0, "logit_bias": {}})  # a client's defaults
    assert none.presence_penalty == 0 and none.logit_bias is None


def test_completion_prompts() -> None:
    assert parse_completion({"prompt": "abc"}).prompt == "abc"
    assert parse_completion({"prompt": ["abc"]}).prompt == "abc"
    assert parse_completion({"prompt": [1, 2, 3]}).prompt == (1, 2, 3)
    assert parse_completion({"prompt": [[4, 5]]}).prompt == (4, 5)
    assert status_of(parse_completion, {"prompt": ["a", "b"]}) == 422
    assert status_of(parse_completion, {"prompt": [[1], [2]]}) == 422
    assert status_of(parse_completion, {"prompt": []}) == 400
    assert status_of(parse_completion, {"prompt": None}) == 400
    assert status_of(parse_completion, {"prompt": "a", "echo": True}) == 422
    assert status_of(parse_completion, {"prompt": "a", "best_of": 3}) == 422
    assert status_of(parse_completion, {"prompt": "a", "suffix": 3}) == 400
    assert status_of(parse_completion, {"prompt": "a", "logprobs": 21}) == 400
    assert status_of(parse_completion, {"prompt": "a", "logprobs": True}) == 400


def test_logprobs_and_suffix_are_request_fields() -> None:
    assert parse_chat({"messages": USER}).logprobs is None
    assert parse_chat({"messages": USER, "logprobs": False, "top_logprobs": 0}).logprobs is None  # the defaults
    assert parse_chat({"messages": USER, "logprobs": True}).logprobs == 0
    assert parse_chat({"messages": USER, "logprobs": True, "top_logprobs": 20}).logprobs == 20
    assert parse_completion({"prompt": "a"}).logprobs is None
    assert parse_completion({"prompt": "a", "logprobs": 0}).logprobs == 0
    assert parse_completion({"prompt": "a", "logprobs": 5}).logprobs == 5
    assert parse_completion({"prompt": "a", "suffix": "b"}).suffix == "b"
    assert parse_completion({"prompt": "a", "suffix": ""}).suffix is None  # no suffix: a plain completion
    with pytest.raises(APIError) as info:
        parse_chat({"messages": USER, "logprobs": True, "top_logprobs": 21})
    assert info.value.param == "top_logprobs" and "0 to 20" in info.value.message


@pytest.mark.parametrize(("raw", "status"), [
    (b"{", 400), (b"[1, 2]", 400), (b"\xff\xfe", 400), (b'{"temperature": NaN}', 400),
    (b" " * (5 << 20), 413),
])
def test_json_body(raw: bytes, status: int) -> None:
    assert status_of(parse_json, raw) == status


def test_finish_reasons() -> None:
    assert [finish_reason(r) for r in ("eos", "stop_string", "max_new_tokens", "context", "interrupted")] == [
        "stop", "stop", "length", "length", None]


def test_cached_prefix_is_what_prefill_keeps() -> None:
    assert cached_prefix([1, 2, 3, 4], [1, 2, 3, 9, 9]) == 3
    assert cached_prefix([1, 2, 3, 4], [1, 2, 3]) == 2  # the last prompt token is always fed, for its logits
    assert cached_prefix([], [1, 2]) == 0 and cached_prefix([5], [1, 2]) == 0


def test_penalties_in_their_range_are_served_others_refused() -> None:
    """A client's penalties from -2 to 2 (OpenAI's range; 0 is the API's default, which many send) are
    served as sent; a value outside it, or not a number, is one 400 line naming its field."""
    for value in (None, 0, 0.0, 1, 0.5, -2, 2):
        req = parse_chat({"messages": USER, "presence_penalty": value, "frequency_penalty": value})
        assert (req.presence_penalty, req.frequency_penalty) == (value, value)
    for value in (2.5, -3, True, "1"):
        for field in ("presence_penalty", "frequency_penalty"):
            with pytest.raises(APIError) as e:
                parse_chat({"messages": USER, field: value})
            assert e.value.status == 400 and e.value.param == field, (field, value)


def test_an_earlier_tool_calls_arguments_must_be_a_json_string() -> None:
    """An assistant's earlier tool call carries its arguments as a string of JSON (OpenAI's shape);
    an object there is refused, naming the call."""
    def conversation(arguments: object) -> dict[str, object]:
        call = {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        return {"messages": [*USER, {"role": "assistant", "content": None, "tool_calls": [call]},
                             {"role": "tool", "tool_call_id": "c1", "content": "sunny"}], "tools": [TOOL]}

    req = parse_chat(conversation('{"city": "Oslo"}'))
    assert req.messages[1]["tool_calls"][0]["function"]["arguments"] == '{"city": "Oslo"}'
    with pytest.raises(APIError) as e:
        parse_chat(conversation({"city": "Oslo"}))
    assert e.value.status == 400 and e.value.param == "messages[1].tool_calls[0]"


def test_a_tool_refused_names_its_field() -> None:
    """The error object's `param` is the field at fault: a tool's repeated name is tools[1].function.name."""
    with pytest.raises(APIError) as e:
        parse_chat_request({"messages": USER, "tools": [TOOL, TOOL]})
    assert e.value.param == "tools[1].function.name"
    assert e.value.message == "'tools[1].function.name' must be a unique name of letters, digits, _ and -"


@pytest.mark.parametrize("body, param", [
    ({"messages": USER, "reasoning_effort": {}}, "reasoning_effort"),
    ({"messages": USER, "reasoning_effort": ["low"]}, "reasoning_effort"),
    ({"messages": [{"role": ["user"], "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": {"a": 1}, "content": "hi"}]}, "messages[0].role"),
])
def test_a_field_of_the_wrong_type_is_a_400_naming_it(body: dict[str, object], param: str) -> None:
    """Not text where text is due (an effort, a role): one 400 line naming the field, never a 500."""
    with pytest.raises(APIError) as e:
        parse_chat(body)
    assert e.value.status == 400 and e.value.param == param
