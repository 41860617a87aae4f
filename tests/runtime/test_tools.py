"""The model's tool-call markup read back into calls, and tool messages made ready for templates."""

from __future__ import annotations

import json

from specedge.runtime.tools import ToolCall, open_call_at, renders_tools, split_tool_calls, template_messages
from specedge.serve.structured import ToolCallFilter

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
    text = "".join(o for o in out if isinstance(o, str)) + stream.flush()
    assert text == 'Let me look.\n<tool_call>\n{"bad json\n</tool_call>'  # the broken block as written


def test_template_messages_carry_arguments_as_objects() -> None:
    messages = [{"role": "assistant", "content": "", "tool_calls": [
        {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}}]}]
    (message,) = template_messages(messages)
    assert message["tool_calls"][0]["function"]["arguments"] == {"x": 1}
    assert json.loads(messages[0]["tool_calls"][0]["function"]["arguments"]) == {"x": 1}  # the caller's unchanged
    assert renders_tools("{% if tools %}x{% endif %}") and not renders_tools("{{ messages }}")
