"""OpenAI's Responses API, POST /v1/responses (Codex, the OpenAI Agents SDK, the openai client's
`responses.create`), translated onto the one chat path: `instructions` and `input` (text, or items:
messages, function calls and their outputs) become the chat's messages, function tools its tools,
`text.format` its response format, `reasoning.effort` a thinking model's switch,
`max_output_tokens` its max_tokens; the answer is a `response` object whose `output` holds the
reasoning, the message and the function calls, or a stream of the API's events
(`response.created` ... `response.output_text.delta` ... `response.completed`).

No state is kept: a request carries its whole conversation (`store` is accepted and nothing is
stored; `previous_response_id` is refused in one line).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
import uuid
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from specedge.serve.protocol import (
    APIError,
    GenerationRequest,
    fields_named,
    invalid,
    parse_chat,
    parse_effort,
    tool_list,
    unsupported,
)
from specedge.serve.responses import Outcome, Writer
from specedge.serve.structured import parse_output

TEXT_PARTS = ("input_text", "output_text", "text", "summary_text", "reasoning_text")
UNSUPPORTED = {"background": "background responses", "conversation": "stored conversations",
               "prompt": "stored prompt templates"}

if TYPE_CHECKING:  # the app imports these routes: no import of it back
    from specedge.serve.app import EventStream, Server


def text_of(content: object, param: str) -> str:
    """A message's content: a string or a list of text parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of content parts")
    texts = []
    for i, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in TEXT_PARTS and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif isinstance(kind, str) and kind not in TEXT_PARTS:
            raise unsupported(f"{param}[{i}]", f"content of type '{kind[:40]}' (this model reads text only)")
        else:
            raise invalid(f"{param}[{i}]", 'must be a content part such as {"type": "input_text", "text": ...}')
    return "".join(texts)


def input_messages(value: object) -> list[dict[str, Any]]:
    """`input` as chat messages: a user's text, or items - messages, function calls (an assistant's
    tool_calls, joined to the assistant message before them) and their outputs (tool messages)."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid("input", "must be a string or a non-empty list of input items")
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(value):
        param = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid(param, "must be an input item (a message, a function_call or a function_call_output)")
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("system", "developer", "user", "assistant"):
                raise invalid(f"{param}.role", f"must be system, developer, user or assistant, got "
                                               f"{json.dumps(role)[:40]}")
            messages.append({"role": role, "content": text_of(item.get("content", ""), f"{param}.content")})
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments", ""), item.get("call_id")
            if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
                raise invalid(param, 'must be {"type": "function_call", "call_id", "name", "arguments"}')
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id, output = item.get("call_id"), item.get("output")
            if not isinstance(call_id, str):
                raise invalid(f"{param}.call_id", "must be the call_id of the function_call it answers")
            messages.append({"role": "tool", "tool_call_id": call_id,
                             "content": output if isinstance(output, str) else text_of(output, f"{param}.output")})
        elif kind == "reasoning":
            continue  # a thinking model's earlier reasoning: the chat template drops it
        else:
            raise unsupported(f"{param}.type", f"input items of type '{str(kind)[:40]}'")
    return messages


def chat_tools(value: object) -> list[dict[str, Any]] | None:
    """Function tools ({"type": "function", "name", "parameters", "strict"}) as chat's tools."""
    if value is None:
        return None
    tools = []
    for i, tool in enumerate(tool_list(value)):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise unsupported(f"tools[{i}].type", f"tools of type '{str(kind)[:40]}' (only function tools)")
        function = {k: tool[k] for k in ("name", "description", "parameters") if k in tool}
        function["strict"] = tool.get("strict", True) is not False  # the Responses API's default: strict
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(value: object) -> object:
    if isinstance(value, dict):
        if value.get("type") != "function" or not isinstance(value.get("name"), str):
            raise unsupported("tool_choice", f"a tool_choice of type '{str(value.get('type'))[:40]}'")
        return {"type": "function", "function": {"name": value["name"]}}
    return value


# the chat fields whose errors name them as the Responses API does
CHAT_NAMES = {"max_tokens": "max_output_tokens", "response_format": "text.format",
              "response_format.json_schema": "text.format"}


def chat_format(text: object) -> dict[str, Any] | None:
    """`text.format` as chat's response_format."""
    if text is None:
        return None
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt is None:
        return None
    if not isinstance(fmt, dict):
        raise invalid("text.format", 'must be an object such as {"type": "json_schema", "schema": {...}}')
    if fmt.get("type") == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": fmt.get("name"), "schema": fmt.get("schema", {}),
                                                       "strict": fmt.get("strict")}}
    return fmt


def first_set(value: object, default: int) -> object:
    return value if value is not None else default


def parse_responses(body: dict[str, Any], context: int) -> GenerationRequest:
    """The request, as the chat request it amounts to."""
    if body.get("previous_response_id") is not None:
        raise invalid("previous_response_id", "names a stored response, and this server stores none: send the "
                                              "whole conversation as input")
    for name, what in UNSUPPORTED.items():
        if body.get(name):
            raise unsupported(name, what)
    messages = input_messages(body.get("input"))
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid("instructions", "must be a string")
        messages.insert(0, {"role": "system", "content": instructions})
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "stream", "parallel_tool_calls",
                                                 "seed", "stop", "top_k", "min_p", "specedge") if k in body}
    chat.update(messages=messages, tools=chat_tools(body.get("tools")), tool_choice=chat_tool_choice(
        body.get("tool_choice")), response_format=chat_format(body.get("text")),
        max_tokens=first_set(body.get("max_output_tokens"), context))  # null: no limit but the context, as OpenAI's
    reasoning = body.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise invalid("reasoning", 'must be an object such as {"effort": "low"}')
    with fields_named(CHAT_NAMES):
        req = parse_chat({k: v for k, v in chat.items() if v is not None})
        output = parse_output({k: v for k, v in chat.items() if v is not None})
    effort = parse_effort((reasoning or {}).get("effort"), "reasoning.effort")
    return dataclasses.replace(req, **output, **effort)


def event(kind: str, number: int, **fields: object) -> bytes:
    return (f"event: {kind}\ndata: ".encode()
            + json.dumps({"type": kind, "sequence_number": number, **fields}, separators=(",", ":")).encode()
            + b"\n\n")


def usage_of(outcome: Outcome) -> dict[str, object]:
    s = outcome.result.stats
    return {"input_tokens": s.prompt_tokens, "input_tokens_details": {"cached_tokens": outcome.reused},
            "output_tokens": s.n_tokens, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": s.prompt_tokens + s.n_tokens}


class ResponsesWriter(Writer):
    """A `response` object, whole or as the Responses API's stream of events; its output items:
    a reasoning item (a thinking model's), a message, function calls."""

    done = b""

    def __init__(self, model: str, body: dict[str, Any], req: GenerationRequest) -> None:
        self.id = "resp_" + uuid.uuid4().hex
        self.model = model
        self.created = int(time.time())
        self.body_in = body
        self.req = req
        self.number = 0  # the stream's sequence_number
        self.items: list[dict[str, Any]] = []  # output items, in order
        self.open: dict[str, Any] | None = None  # the item being streamed

    def response(self, status: str, output: list[dict[str, Any]], outcome: Outcome | None = None) -> dict[str, Any]:
        b = self.body_in
        incomplete = outcome is not None and outcome.finish == "length"
        return {"id": self.id, "object": "response", "created_at": self.created,
                "status": "incomplete" if incomplete else status, "error": None,
                "incomplete_details": {"reason": "max_output_tokens"} if incomplete else None,
                "instructions": b.get("instructions"), "max_output_tokens": b.get("max_output_tokens"),
                "model": self.model, "output": output, "parallel_tool_calls": self.req.parallel_tool_calls,
                "previous_response_id": None, "reasoning": {"effort": (b.get("reasoning") or {}).get("effort"),
                                                            "summary": None},
                "store": False, "temperature": b.get("temperature"),
                "text": b.get("text") or {"format": {"type": "text"}},
                "tool_choice": b.get("tool_choice", "auto"), "tools": b.get("tools") or [], "top_p": b.get("top_p"),
                "truncation": "disabled", "usage": usage_of(outcome) if outcome else None, "user": None,
                "metadata": b.get("metadata") or {},
                **({"specedge": outcome.stats} if outcome else {})}

    def next(self, kind: str, **fields: object) -> bytes:
        self.number += 1
        return event(kind, self.number - 1, **fields)

    def opening(self, prompt_tokens: int = 0, reused: int = 0) -> bytes:
        skeleton = self.response("in_progress", [])
        return self.next("response.created", response=skeleton) + self.next("response.in_progress", response=skeleton)

    def start(self, item: dict[str, Any]) -> bytes:
        """Open an output item (closing the one open)."""
        out = self.close()
        self.open = item
        index = len(self.items)
        self.items.append(item)
        added = {**item, "status": "in_progress"}
        if item["type"] in ("message", "reasoning"):
            added["content"] = []
        out += self.next("response.output_item.added", output_index=index, item=added)
        if item["type"] == "message":
            out += self.next("response.content_part.added", item_id=item["id"], output_index=index, content_index=0,
                             part={"type": "output_text", "text": "", "annotations": []})
        return out

    def close(self) -> bytes:
        """Finish the open output item: its done events."""
        item, self.open = self.open, None
        if item is None:
            return b""
        index = self.items.index(item)
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            out += self.next("response.output_text.done", item_id=item["id"], output_index=index, content_index=0,
                             text=part["text"], logprobs=[])
            out += self.next("response.content_part.done", item_id=item["id"], output_index=index, content_index=0,
                             part=part)
        elif item["type"] == "reasoning":
            out += self.next("response.reasoning_text.done", item_id=item["id"], output_index=index,
                             content_index=0, text=item["content"][0]["text"])
        return out + self.next("response.output_item.done", output_index=index, item=item)

    def chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if not text:
            return b""
        out = b"" if self.open is not None and self.open["type"] == "message" else self.start(message_item(""))
        item = self.open
        assert item is not None
        item["content"][0]["text"] += text
        return out + self.next("response.output_text.delta", item_id=item["id"], output_index=self.items.index(item),
                               content_index=0, delta=text, logprobs=[])

    def reasoning_chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if not text:
            return b""
        out = b"" if self.open is not None and self.open["type"] == "reasoning" else self.start(reasoning_item(""))
        item = self.open
        assert item is not None
        item["content"][0]["text"] += text
        return out + self.next("response.reasoning_text.delta", item_id=item["id"],
                               output_index=self.items.index(item), content_index=0, delta=text)

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        out = b""
        for call in tool_calls:
            item = call_item(call)
            arguments = item["arguments"]
            out += self.start({**item, "arguments": ""})
            self.open = item
            self.items[-1] = item
            index = len(self.items) - 1
            out += self.next("response.function_call_arguments.delta", item_id=item["id"], output_index=index,
                             delta=arguments)
            out += self.next("response.function_call_arguments.done", item_id=item["id"], output_index=index,
                             arguments=arguments, name=item["name"])
        return out

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        out = self.close()
        done = self.response("completed", self.items, outcome)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return out + self.next(kind, response=done)

    def body(self, outcome: Outcome) -> dict[str, object]:
        o = outcome
        output = [*([reasoning_item(o.reasoning)] if o.reasoning else []),
                  *([message_item(o.text)] if o.text or not o.calls else []),
                  *(call_item(c) for c in o.calls or [])]
        return self.response("completed", output, outcome)

    def error_event(self, err: APIError) -> bytes:
        return self.next("error", code=err.code, message=err.message, param=err.param)


def message_item(text: str) -> dict[str, Any]:
    return {"id": "msg_" + uuid.uuid4().hex, "type": "message", "status": "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}]}


def reasoning_item(text: str) -> dict[str, Any]:
    return {"id": "rs_" + uuid.uuid4().hex, "type": "reasoning", "status": "completed", "summary": [],
            "content": [{"type": "reasoning_text", "text": text}]}


def call_item(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    return {"id": "fc_" + uuid.uuid4().hex, "type": "function_call", "status": "completed",
            "call_id": call["id"], "name": function["name"], "arguments": function["arguments"]}


async def responses(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    return await server.complete(request, functools.partial(parse_responses, body, server.context),
                                 lambda req: ResponsesWriter(server.settings.model_id, body, req))


def routes(server: Server) -> list[Route]:
    return [Route("/v1/responses", server.endpoint(functools.partial(responses, server)), methods=["POST"])]
