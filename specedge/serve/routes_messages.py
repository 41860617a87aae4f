"""Anthropic's Messages API, POST /v1/messages (Claude Code, the anthropic client's
`messages.create`), translated onto the one chat path: `system` and `messages` (text, tool_use and
tool_result blocks) become the chat's messages, `tools` (name, input_schema) its tools, `tool_choice`
(auto, any, tool, none) its tool_choice, `stop_sequences` its stop strings, `thinking` (and
`output_config.effort`) a thinking model's switch, `output_config.format` its JSON schema. The
answer is a `message` whose content holds thinking, text and tool_use blocks, with `stop_reason`
end_turn, max_tokens, stop_sequence or tool_use; or a stream of its events (message_start,
content_block_start/delta/stop, message_delta, message_stop). Errors are Anthropic's error object.
POST /v1/messages/count_tokens counts a request's prompt. The key may come as `x-api-key`
(serve/guard.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import uuid
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specedge.serve.protocol import APIError, GenerationRequest, invalid, parse_chat, tool_list, unsupported
from specedge.serve.responses import Outcome, Writer
from specedge.serve.structured import parse_output

ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               421: "invalid_request_error", 422: "invalid_request_error", 429: "rate_limit_error",
               503: "overloaded_error"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

if TYPE_CHECKING:  # the app imports these routes: no import of it back
    from specedge.serve.app import EventStream, Server


def error_body(err: APIError) -> dict[str, object]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(err.status, "api_error"), "message": err.message}}


def anthropic_error(err: APIError) -> JSONResponse:
    """Anthropic's error object, with the status and headers of `err`."""
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


def block_text(block: dict[str, Any], param: str) -> str:
    if not isinstance(block.get("text"), str):
        raise invalid(param, 'must be {"type": "text", "text": ...}')
    return block["text"]


def result_text(content: object, param: str) -> str:
    """A tool_result's content: a string or text blocks."""
    if isinstance(content, str) or content is None:
        return content or ""
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of text blocks")
    texts = []
    for i, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        if kind != "text":
            raise unsupported(f"{param}[{i}]", f"tool_result content of type '{str(kind)[:40]}' (text only)")
        texts.append(block_text(block, f"{param}[{i}]"))
    return "".join(texts)


def chat_messages(system: object, messages: object) -> list[dict[str, Any]]:
    """`system` and `messages` as chat messages: a user's tool_result blocks become tool messages
    (before its text), an assistant's tool_use blocks its tool_calls; thinking blocks are dropped
    (the chat template drops earlier reasoning)."""
    out: list[dict[str, Any]] = []
    if system is not None:
        if isinstance(system, list):
            system = "".join(block_text(b if isinstance(b, dict) else {}, f"system[{i}]")
                             for i, b in enumerate(system))
        if not isinstance(system, str):
            raise invalid("system", "must be a string or a list of text blocks")
        if system:
            out.append({"role": "system", "content": system})
    if not isinstance(messages, list) or not messages:
        raise invalid("messages", "must be a non-empty list of messages")
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role not in ("user", "assistant"):
            raise invalid(f"{param}.role", f"must be user or assistant, got {json.dumps(role)[:40]}")
        content = message.get("content")
        if isinstance(content, str):
            out.append({"role": role, "content": content})
            continue
        if not isinstance(content, list):
            raise invalid(f"{param}.content", "must be a string or a list of content blocks")
        texts, calls = [], []
        for j, block in enumerate(content):
            where = f"{param}.content[{j}]"
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text":
                texts.append(block_text(block, where))
            elif kind == "tool_use" and role == "assistant":
                if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                    raise invalid(where, 'must be {"type": "tool_use", "id", "name", "input": {...}}')
                calls.append({"id": str(block.get("id", "")), "type": "function",
                              "function": {"name": block["name"], "arguments": json.dumps(block.get("input", {}))}})
            elif kind == "tool_result" and role == "user":
                if not isinstance(block.get("tool_use_id"), str):
                    raise invalid(f"{where}.tool_use_id", "must be the id of the tool_use it answers")
                out.append({"role": "tool", "tool_call_id": block["tool_use_id"],
                            "content": result_text(block.get("content"), f"{where}.content")})
            elif kind in ("thinking", "redacted_thinking"):
                continue
            elif isinstance(kind, str):
                raise unsupported(where, f"content blocks of type '{kind[:40]}' in a {role} message")
            else:
                raise invalid(where, 'must be a content block such as {"type": "text", "text": ...}')
        if texts or calls or not content:
            out.append({"role": role, "content": "".join(texts), **({"tool_calls": calls} if calls else {})})
    if messages[-1].get("role") == "assistant" and out[-1].get("content") and "tool_calls" not in out[-1]:
        # the chat path answers a finished conversation: it would take a prefill for a whole turn and answer anew
        raise unsupported(f"messages[{len(messages) - 1}]", "continuing a last assistant message (a prefill: "
                          "end the messages with the user's)")
    return out


def chat_tools(value: object) -> list[dict[str, Any]] | None:
    """Client tools ({name, description, input_schema}) as chat's; Anthropic's own server tools are refused."""
    if value is None:
        return None
    tools = []
    for i, tool in enumerate(tool_list(value)):
        if not isinstance(tool, dict):
            raise invalid(f"tools[{i}]", "must be a tool: {name, description, input_schema}")
        kind = tool.get("type", "custom")
        if kind != "custom":
            raise unsupported(f"tools[{i}].type", f"Anthropic's server tool '{str(kind)[:40]}'")
        function = {"name": tool.get("name"), "parameters": tool.get("input_schema", {"type": "object"})}
        if "description" in tool:
            function["description"] = tool["description"]
        tools.append({"type": "function", "function": function})
    return tools


def chat_tool_choice(value: object) -> tuple[object, bool]:
    """tool_choice (auto, any, tool, none) as chat's, and whether calls may come in parallel."""
    if value is None:
        return None, True
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("auto", "any", "tool", "none"):
        raise invalid("tool_choice", 'must be {"type": "auto" | "any" | "tool" | "none"}')
    parallel = not value.get("disable_parallel_tool_use", False)
    if kind == "tool":
        return {"type": "function", "function": {"name": value.get("name")}}, parallel
    return {"any": "required"}.get(kind, kind), parallel


def parse_messages_request(body: dict[str, Any]) -> GenerationRequest:
    """The request, as the chat request it amounts to."""
    max_tokens = body.get("max_tokens")
    if max_tokens is None:
        raise invalid("max_tokens", "is required (the most tokens to write)")
    if body.get("mcp_servers"):
        raise unsupported("mcp_servers", "MCP servers")
    temperature = body.get("temperature")
    if temperature is not None and (not isinstance(temperature, (int, float)) or not 0 <= temperature <= 1):
        raise invalid("temperature", f"must be a number from 0 to 1, got {json.dumps(temperature)[:40]}")
    tool_choice, parallel = chat_tool_choice(body.get("tool_choice"))
    chat: dict[str, Any] = {k: body[k] for k in ("model", "temperature", "top_p", "top_k", "stream", "specedge")
                            if k in body}
    config = body.get("output_config") or {}
    if not isinstance(config, dict):
        raise invalid("output_config", 'must be an object such as {"format": {"type": "json_schema", ...}}')
    fmt = config.get("format")
    if fmt is not None and (not isinstance(fmt, dict) or fmt.get("type") != "json_schema"):
        raise invalid("output_config.format", 'must be {"type": "json_schema", "schema": {...}}')
    chat.update(messages=chat_messages(body.get("system"), body.get("messages")), max_tokens=max_tokens,
                stop=body.get("stop_sequences"), tools=chat_tools(body.get("tools")), tool_choice=tool_choice,
                parallel_tool_calls=parallel, response_format={
                    "type": "json_schema", "json_schema": {"schema": fmt.get("schema", {})}} if fmt else None)
    chat = {k: v for k, v in chat.items() if v is not None}
    try:
        req = parse_chat(chat)
        output = parse_output(chat)
    except APIError as e:  # chat's names for Anthropic's fields
        raise rename(e, {"stop": "stop_sequences", "response_format.json_schema.schema": "output_config.format"}) \
            from None
    return dataclasses.replace(req, **output, **thinking(body.get("thinking"), config.get("effort")))


def rename(err: APIError, names: dict[str, str]) -> APIError:
    for chat, own in names.items():
        if err.param == chat:
            err.param, err.message = own, err.message.replace(f"'{chat}'", f"'{own}'", 1)
    return err


EFFORTS = ("low", "medium", "high", "xhigh", "max")


def thinking(value: object, effort: object = None) -> dict[str, Any]:
    """`thinking` ({"type": "enabled" | "adaptive" | "between_tools" | "disabled"}), else
    `output_config.effort` (any level: think), as the thinking switch."""
    if value is None:
        if effort is None:
            return {}
        if effort not in EFFORTS:
            raise invalid("output_config.effort", f"must be one of {', '.join(EFFORTS)}, got {json.dumps(effort)[:40]}")
        return {"thinking": True, "thinking_param": "output_config.effort"}
    kind = value.get("type") if isinstance(value, dict) else None
    if kind not in ("enabled", "adaptive", "between_tools", "disabled"):
        raise invalid("thinking", 'must be {"type": "enabled", "budget_tokens": N} or {"type": "disabled"}')
    return {"thinking": kind != "disabled", "thinking_param": "thinking"}


def sse_event(kind: str, data: dict[str, Any]) -> bytes:
    return f"event: {kind}\ndata: ".encode() + json.dumps({"type": kind, **data}, separators=(",", ":")).encode() \
        + b"\n\n"


def usage_of(outcome: Outcome) -> dict[str, int]:
    """Anthropic's usage: input_tokens beside those read from the cache (cache_read_input_tokens)."""
    s = outcome.result.stats
    return {"input_tokens": s.prompt_tokens - outcome.reused, "output_tokens": s.n_tokens,
            "cache_read_input_tokens": outcome.reused, "cache_creation_input_tokens": 0}


def stop_of(outcome: Outcome) -> tuple[str | None, str | None]:
    """stop_reason and stop_sequence."""
    s = outcome.result.stats
    if s.stop_reason == "stop_string":
        return "stop_sequence", s.stop_string
    return STOP_REASONS.get(outcome.finish or ""), None


class MessagesWriter(Writer):
    """A `message`, whole or as the Messages API's stream of events."""

    done = b""

    def __init__(self, model: str) -> None:
        self.id = "msg_" + uuid.uuid4().hex
        self.model = model
        self.index = -1  # the open content block's index
        self.open: str | None = None  # its type: text, thinking (tool_use blocks open and close at once)

    def message(self, content: list[dict[str, Any]], stop: tuple[str | None, str | None],
                use: dict[str, int]) -> dict[str, Any]:
        return {"id": self.id, "type": "message", "role": "assistant", "model": self.model, "content": content,
                "stop_reason": stop[0], "stop_sequence": stop[1], "usage": use}

    def opening(self, prompt_tokens: int = 0, reused: int = 0) -> bytes:
        use = {"input_tokens": prompt_tokens - reused, "output_tokens": 0, "cache_read_input_tokens": reused,
               "cache_creation_input_tokens": 0}  # as usage_of counts them at the end
        start = self.message([], (None, None), use)
        return sse_event("message_start", {"message": start}) + sse_event("ping", {})

    def start(self, block: dict[str, Any]) -> bytes:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        return out + sse_event("content_block_start", {"index": self.index, "content_block": block})

    def close(self) -> bytes:
        if self.open is None:
            return b""
        self.open = None
        return sse_event("content_block_stop", {"index": self.index})

    def chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if not text:
            return b""
        out = b"" if self.open == "text" else self.start({"type": "text", "text": ""})
        return out + sse_event("content_block_delta", {"index": self.index,
                                                       "delta": {"type": "text_delta", "text": text}})

    def reasoning_chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if not text:
            return b""
        out = b"" if self.open == "thinking" else self.start({"type": "thinking", "thinking": "", "signature": ""})
        return out + sse_event("content_block_delta", {"index": self.index,
                                                       "delta": {"type": "thinking_delta", "thinking": text}})

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        out = b""
        for call in tool_calls:
            block = tool_use(call)
            out += self.start({**block, "input": {}})
            out += sse_event("content_block_delta", {"index": self.index, "delta": {
                "type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
            out += self.close()
        return out

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        reason, sequence = stop_of(outcome)
        return (self.close() + sse_event("message_delta", {"delta": {"stop_reason": reason, "stop_sequence": sequence},
                                                           "usage": usage_of(outcome), "specedge": outcome.stats})
                + sse_event("message_stop", {}))

    def body(self, outcome: Outcome) -> dict[str, object]:
        o = outcome
        content = [*([{"type": "thinking", "thinking": o.reasoning, "signature": ""}] if o.reasoning else []),
                   *([{"type": "text", "text": o.text}] if o.text else []), *(tool_use(c) for c in o.calls or [])]
        return {**self.message(content, stop_of(o), usage_of(o)), "specedge": o.stats}

    def error_event(self, err: APIError) -> bytes:
        return sse_event("error", {"error": error_body(err)["error"]})

    def error_response(self, err: APIError) -> JSONResponse:
        return anthropic_error(err)


def tool_use(call: dict[str, Any]) -> dict[str, Any]:
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:  # not JSON: the text as the model wrote it
        arguments = {"arguments": function["arguments"]}
    return {"type": "tool_use", "id": "toolu_" + str(call["id"]).removeprefix("call_"), "name": function["name"],
            "input": arguments if isinstance(arguments, dict) else {"arguments": arguments}}


async def messages(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    return await server.complete(request, functools.partial(parse_messages_request, body),
                                 lambda req: MessagesWriter(server.settings.model_id))


async def count_tokens(server: Server, request: Request) -> JSONResponse:
    """The prompt's tokens as the chat template renders the request (its system, messages and tools):
    read, checked and tokenized off the event loop under a place in the queue, as /tokenize is."""
    body = await server.body(request)

    def count() -> int:
        req = parse_messages_request({**body, "max_tokens": 1, "stream": False})
        server.check_model(req.model)
        server.check_prompt_size(req)
        req, _ = server.thinking(req)
        with server._side_lock:
            codec = server.side_codec()
            return len(codec.encode_chat([dict(m) for m in req.messages], tools=list(req.tools) or None,
                                         template_kwargs=req.template_kwargs))

    with server.admit():
        return JSONResponse({"input_tokens": await run_in_threadpool(count)})


def routes(server: Server) -> list[Route]:
    def route(path: str, handler: Any) -> Route:
        return Route(path, server.endpoint(functools.partial(handler, server)), methods=["POST"])

    return [route("/v1/messages", messages), route("/v1/messages/count_tokens", count_tokens)]
