"""The model's tool-call markup read back into calls, and tool messages made ready for templates."""

from __future__ import annotations

import json

import pytest
from tokenizers import AddedToken

from specedge.runtime.text.tools import (
    ToolCall,
    ToolMarkup,
    bare_calls,
    may_be_bare_call,
    open_call_at,
    read_tool_calls,
    renders_tools,
    split_tool_calls,
    template_messages,
)
from specedge.serve.structured import ToolCallFilter
from tests.tiny_models import byte_tokenizer

TEXT = ('Let me look.\n<tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call>'
        '\n<tool_call>\n{"bad json\n</tool_call>')


def test_calls_are_split_out_and_a_broken_block_stays_text() -> None:
    text, calls = split_tool_calls(TEXT)
    assert calls == [ToolCall("f", '{"x": 1}')]
    assert text.startswith("Let me look.") and '{"bad json' in text
    assert split_tool_calls("no calls here ") == ("no calls here ", [])


def test_a_block_being_written_is_held_back() -> None:
    assert open_call_at("text <tool_") == 5 and open_call_at("a <tool_call>\n{") == 2
    assert open_call_at("done </tool_call>") == -1 and open_call_at("plain") == -1


def test_streamed_text_gives_the_same_calls_as_the_whole() -> None:
    stream = ToolCallFilter()
    out = [o for i in range(0, len(TEXT), 7) for o in stream.push(TEXT[i:i + 7])]
    calls = [c for o in out if isinstance(o, list) for c in o]
    assert [c["function"]["name"] for c in calls] == ["f"] and calls[0]["index"] == 0
    text = "".join(o for o in [*out, *stream.flush()] if isinstance(o, str))
    assert text == 'Let me look.\n<tool_call>\n{"bad json\n</tool_call>'  # the broken block as written


def test_template_messages_carry_arguments_as_objects() -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    (message,) = template_messages(messages)
    assert message["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert json.loads(messages[0]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}  # the caller's unchanged
    assert renders_tools("{% if tools %}x{% endif %}") and not renders_tools("{{ messages }}")


def test_markers_that_are_tokens_are_named_by_id() -> None:
    """Qwen2.5's <tool_call> is an added token (not special): the grammar must name it, not its text."""
    tok = byte_tokenizer()
    assert ToolMarkup.of(tok) == ToolMarkup(None, None) and ToolMarkup.of(tok).lark() == ('"<tool_call>"',
                                                                                         '"</tool_call>"')
    tok.add_tokens([AddedToken("<tool_call>", normalized=False), AddedToken("</tool_call>", normalized=False)])
    markup = ToolMarkup.of(tok)
    assert markup == ToolMarkup(tok.token_to_id("<tool_call>"), tok.token_to_id("</tool_call>"))
    assert markup.lark() == (f"<[{markup.open_id}]>", f"<[{markup.close_id}]>")


NAMES = frozenset({"get_weather"})
FENCED_CALL = '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris"\n  }\n}\n```'


@pytest.mark.parametrize("text", [FENCED_CALL, '{"name": "get_weather", "arguments": {"city": "Paris"}}',
                                  ' [{"name": "get_weather", "parameters": {"city": "Paris"}}]\n'])
def test_a_whole_response_that_is_a_bare_call_is_that_call(text: str) -> None:
    """What Qwen2.5-Coder-1.5B writes when free to choose (tool_choice auto): a call in a ```json fence."""
    assert bare_calls(text, NAMES) == [ToolCall("get_weather", '{"city": "Paris"}')]
    assert read_tool_calls(text, NAMES) == ("", [ToolCall("get_weather", '{"city": "Paris"}')])
    assert read_tool_calls(text) == (text, [])  # without the tools' names: text


@pytest.mark.parametrize("text", [
    '{"name": "send_mail", "arguments": {}}',  # not one of the tools
    FENCED_CALL + "\nThis asks for the weather.",  # text after it
    '{"city": "Paris"}',  # JSON, not a call
    "```python\nprint(1)\n```",
    "Sunny in Paris."])
def test_other_responses_are_text(text: str) -> None:
    assert bare_calls(text, NAMES) == [] and read_tool_calls(text, NAMES) == (text, [])


def test_streaming_holds_a_response_back_only_while_it_may_be_a_bare_call() -> None:
    assert may_be_bare_call("", NAMES) and may_be_bare_call("``", NAMES) and may_be_bare_call('```json\n{"na', NAMES)
    assert may_be_bare_call(FENCED_CALL[:-2], NAMES) and may_be_bare_call(FENCED_CALL, NAMES)
    assert not may_be_bare_call("```python", NAMES) and not may_be_bare_call("Sunny", NAMES)
    assert not may_be_bare_call(FENCED_CALL + "\nThis", NAMES)
    assert not may_be_bare_call('{"name": "send_mail", "arguments": {}}', NAMES)


@pytest.mark.parametrize("text", [FENCED_CALL, FENCED_CALL + "\nThat is the call.", "It is sunny."])
def test_streamed_bare_calls_and_text_equal_the_whole(text: str) -> None:
    stream = ToolCallFilter(NAMES | {"f"})
    out = [o for i in range(0, len(text), 3) for o in stream.push(text[i:i + 3])] + list(stream.flush())
    streamed_calls = [(c["function"]["name"], c["function"]["arguments"]) for o in out if isinstance(o, list)
                      for c in o]
    whole_text, whole_calls = read_tool_calls(text, NAMES | {"f"})
    assert streamed_calls == [(c.name, c.arguments) for c in whole_calls]
    assert "".join(o for o in out if isinstance(o, str)).strip() == whole_text.strip()


def test_a_block_left_open_at_the_end_is_sent_as_written() -> None:
    """A reply that ends inside a tool-call block (cut by max_tokens) sends that text as the model
    wrote it, streamed as whole."""
    text = 'Let me look.\n<tool_call>\n{"name": "f", "argu'
    for names in (frozenset(), NAMES | {"f"}):
        stream = ToolCallFilter(names)
        out = [o for i in range(0, len(text), 5) for o in stream.push(text[i:i + 5])] + list(stream.flush())
        assert all(isinstance(o, str) and o for o in out) and "".join(out) == text  # type: ignore[arg-type]
        assert read_tool_calls(text, names) == (text, [])


def test_a_calls_arguments_keep_their_text_as_written() -> None:
    """Arguments the model wrote as an object come back as JSON text with non-ASCII characters as
    they are (as transformers' tojson writes them), not as \\u escapes."""
    text = '<tool_call>\n{"name": "f", "arguments": {"city": "Zürich", "note": "日本"}}\n</tool_call>'
    _, calls = read_tool_calls(text, frozenset({"f"}))
    assert [c.arguments for c in calls] == ['{"city": "Zürich", "note": "日本"}']
