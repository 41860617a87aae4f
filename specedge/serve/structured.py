"""What a request asks of the output's shape: `response_format` (JSON object, JSON schema, and
beyond the API a regex or a Lark/GBNF grammar), `tools` with `tool_choice`, and a `prediction`
(OpenAI's predicted outputs) - each read and checked before the request is queued, a 400 naming
the field; specedge/request.py's `shape` turns them into the grammar (the one place every door's
tool_choice becomes one). And the tool calls of a streamed answer, taken out of its text.

Tools are listed to the model by its own chat template, and its tool-call markup is parsed back
into `tool_calls` (runtime/text/tools.py). With `tool_choice` "required" or a named function, the
output is constrained to calls whose arguments follow each function's JSON schema; with "auto"
the model chooses between text and calls, and its calls are parsed: where a tool is `strict`, a
lazy grammar leaves the text free and constrains each call from the moment the model opens it.
With "none" the tools are still listed (as the API does) and nothing is parsed. The markers are
tokens where the model's tokenizer has them as tokens (Qwen2.5's `<tool_call>`: `ToolMarkup`),
and a call's JSON is spaced as the chat template writes the calls it shows the model.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from typing import Any

from specedge.core.errors import SpecEdgeError
from specedge.runtime.constraints.grammar import Grammar, grammar_text
from specedge.runtime.text.tools import (
    CLOSE,
    OPEN,
    ToolCall,
    bare_calls,
    may_be_bare_call,
    open_call_at,
    split_tool_calls,
)
from specedge.serve.protocol import invalid

NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # a function's name, as the API allows it
MAX_TOOLS = 128


def parse_output(body: dict[str, Any]) -> dict[str, Any]:
    """What `body` asks of the output's shape, as Request fields (specedge/request.py's `shape` turns
    them into a grammar for the model): tools, tool_choice, parallel_tool_calls, the response format's
    grammar (and its field) and a prediction."""
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    grammar = parse_response_format(body.get("response_format"))
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise invalid("parallel_tool_calls", "must be true or false")
    return {"tools": tuple(tools), "tool_choice": choice, "parallel_tool_calls": parallel, "grammar": grammar,
            "grammar_param": response_format_param(body["response_format"]) if grammar is not None else "",
            "prediction": parse_prediction(body.get("prediction"))}


def response_format_param(value: dict[str, Any]) -> str:
    """The field of a response_format that holds its grammar."""
    kind = value["type"]
    return {"json_object": "response_format", "json_schema": "response_format.json_schema.schema"}.get(
        kind, f"response_format.{kind}")


def checked(grammar: Grammar, param: str) -> Grammar:
    """`grammar`, once llguidance has read it: a 400 naming `param` if it cannot be used."""
    try:
        grammar_text(grammar)
    except SpecEdgeError as e:
        raise invalid(param, e.problem) from None
    return grammar


def parse_response_format(value: object) -> Grammar | None:
    if value is None:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("type"), str):
        raise invalid("response_format", 'must be an object with a "type"')
    kind = value["type"]
    if kind == "text":
        return None
    if kind == "json_object":
        return checked(Grammar("json_object"), response_format_param(value))
    if kind == "json_schema":
        spec = value.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema", {}), dict):
            raise invalid("response_format.json_schema", 'must be an object with a "schema" object')
        return checked(Grammar("json_schema", spec.get("schema", {})), response_format_param(value))
    if kind in ("regex", "grammar"):  # beyond the API, as other local servers take them
        text, syntax = value.get(kind), value.get("syntax", "lark") if kind == "grammar" else "regex"
        if not isinstance(text, str) or syntax not in ("lark", "gbnf", "regex"):
            what = "a string (syntax lark or gbnf)" if kind == "grammar" else "a string"
            raise invalid(f"response_format.{kind}", f"must be {what}")
        return checked(Grammar(syntax, text), response_format_param(value))
    raise invalid("response_format.type", f"must be text, json_object, json_schema, regex or grammar, not "
                                          f"{json.dumps(kind)[:40]}")


def parse_tools(value: object) -> list[dict[str, Any]]:
    if value is None:
        return []
    if not isinstance(value, list) or len(value) > MAX_TOOLS:
        raise invalid("tools", f"must be a list of at most {MAX_TOOLS} tools")
    tools, names = [], set()
    for i, tool in enumerate(value):
        param = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type") != "function" or not isinstance(tool.get("function"), dict):
            raise invalid(param, 'must be {"type": "function", "function": {...}}')
        function = tool["function"]
        name = function.get("name")
        if not isinstance(name, str) or not NAME.fullmatch(name) or name in names:
            raise invalid(f"{param}.function.name", "must be a unique name of letters, digits, _ and -")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise invalid(f"{param}.function.parameters", "must be a JSON schema object")
        checked(Grammar("json_schema", parameters), f"{param}.function.parameters")
        names.add(name)
        tools.append({"type": "function", "function": {**function, "parameters": parameters}})
    return tools


def parse_tool_choice(value: object, tools: list[dict[str, Any]]) -> str:
    """"auto", "none", "required" or a function's name."""
    if value is None:
        return "auto"
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise invalid("tool_choice", f'must be "auto", "none", "required" or a function, '
                                         f"not {json.dumps(value)[:40]}")
        if value == "required" and not tools:
            raise invalid("tool_choice", 'is "required" but no tools are given')
        return value
    function = value.get("function") if isinstance(value, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str):
        raise invalid("tool_choice", 'must be {"type": "function", "function": {"name": ...}}')
    if name not in {t["function"]["name"] for t in tools}:
        raise invalid("tool_choice.function.name", f"names {json.dumps(name)[:60]}, which is not one of the tools")
    return name


def parse_prediction(value: object) -> str | None:
    if value is None:
        return None
    if not isinstance(value, dict) or value.get("type") != "content":
        raise invalid("prediction", 'must be {"type": "content", "content": ...}')
    content = value.get("content")
    if isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("text"), str) for p in content):
        content = "".join(p["text"] for p in content)
    if not isinstance(content, str):
        raise invalid("prediction.content", "must be a string or a list of text parts")
    return content or None


def api_calls(calls: list[ToolCall], first: int = 0) -> list[dict[str, Any]]:
    """Tool calls as the API carries them, with ids of their own."""
    return [{"index": first + i, "id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": c.name, "arguments": c.arguments}} for i, c in enumerate(calls)]


class ToolCallFilter:
    """Streamed text with the model's tool-call blocks taken out: text is passed on up to where a
    block may begin; a closed block becomes a call. With the tools' `names`, a response that opens
    as bare JSON is held back while it may still be a whole bare call (runtime/text/tools.py)."""

    def __init__(self, names: frozenset[str] = frozenset()) -> None:
        self.pending = ""
        self.calls = 0
        self.names = names
        self.bare = bool(names)  # the response so far may be a whole bare call

    def push(self, text: str) -> Iterator[str | list[dict[str, Any]]]:
        """The text to send now (str) and the calls completed (a list of API tool calls)."""
        self.pending += text
        if self.bare:
            if may_be_bare_call(self.pending, self.names):
                return
            self.bare = False
        while (end := self.pending.find(CLOSE)) >= 0 and (start := self.pending.find(OPEN)) >= 0 and start < end:
            before, calls = split_tool_calls(self.pending[:end + len(CLOSE)])
            self.pending = self.pending[end + len(CLOSE):]
            if calls and before:
                yield before
            if calls:
                yield api_calls(calls, self.calls)
                self.calls += len(calls)
            elif before:
                yield before
        hold = open_call_at(self.pending)
        ready, self.pending = (self.pending, "") if hold < 0 else (self.pending[:hold], self.pending[hold:])
        if ready and (self.calls == 0 or ready.strip()):
            yield ready

    def flush(self) -> Iterator[str | list[dict[str, Any]]]:
        """What is held back at the end: a whole bare call, or the text as the model wrote it (an unclosed block)."""
        rest, self.pending = self.pending, ""
        if self.bare and (calls := bare_calls(rest, self.names)):
            yield api_calls(calls, self.calls)
            self.calls += len(calls)
        elif rest:
            yield rest
