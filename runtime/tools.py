"""Tool calls: the caller's tools rendered by the model's own chat template, and the model's
tool-call markup parsed back into calls.

Qwen2.5 (and Hermes-style templates) list the tools in the system turn and ask for each call as
`<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`; a tool's result comes back as a
message of role `tool`. The template is the model's own: specedge passes it `tools` and the
messages, and reads the markup it asked for.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text of an object, as the OpenAI API carries it


def parse_call(body: str) -> ToolCall | None:
    """The call in one block's JSON ({"name", "arguments"}), or None if it is not one."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("name"), str):
        return None
    arguments = data.get("arguments", data.get("parameters", {}))
    if isinstance(arguments, str):  # already JSON text
        return ToolCall(data["name"], arguments)
    return ToolCall(data["name"], json.dumps(arguments, ensure_ascii=False))


def split_tool_calls(text: str) -> tuple[str, list[ToolCall]]:
    """The text outside tool-call blocks, and the calls of the blocks that hold one (a block that
    does not parse stays in the text, as the model wrote it)."""
    calls: list[ToolCall] = []

    def take(match: re.Match[str]) -> str:
        call = parse_call(match.group(1))
        if call is None:
            return match.group(0)
        calls.append(call)
        return ""

    rest = CALL.sub(take, text)
    return (rest.strip() if calls else rest), calls


def open_call_at(text: str) -> int:
    """Where a tool-call block that may still be being written begins in `text` (-1: none): an
    unclosed `<tool_call>`, or a tail that could be the start of one (streaming holds text back from there)."""
    last = text.rfind(OPEN)
    if last >= 0 and text.find(CLOSE, last) < 0:
        return last
    for n in range(min(len(OPEN) - 1, len(text)), 0, -1):
        if text.endswith(OPEN[:n]):
            return len(text) - n
    return -1


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: an assistant's tool-call arguments as objects (the
    API carries JSON text; templates such as Qwen2.5's write them with `tojson`)."""
    out = []
    for message in messages:
        message = dict(message)
        if isinstance(message.get("tool_calls"), list):
            message["tool_calls"] = [with_object_arguments(call) for call in message["tool_calls"]]
        out.append(message)
    return out


def with_object_arguments(call: object) -> object:
    if not isinstance(call, Mapping) or not isinstance(call.get("function"), Mapping):
        return call
    function = dict(call["function"])
    if isinstance(function.get("arguments"), str):
        with contextlib.suppress(ValueError, RecursionError):  # else left as the text it is
            function["arguments"] = json.loads(function["arguments"])
    return {**call, "function": function}


def renders_tools(template: str | None) -> bool:
    """Whether a chat template does anything with `tools` (else a request's tools cannot reach the model)."""
    return template is not None and re.search(r"\btools\b", template) is not None
