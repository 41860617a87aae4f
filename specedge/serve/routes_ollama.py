"""ollama's API (Open WebUI's ollama connection, Aider's `ollama_chat/`, LangChain's ChatOllama, the
`ollama` client), over the one server: POST /api/chat and /api/generate (streamed as NDJSON unless
`"stream": false`, as ollama does), GET /api/tags, POST /api/show (with the model's capabilities),
GET /api/ps, GET /api/version; embeddings (/api/embed, /api/embeddings) are refused in one line.

A chat, and a generate that is not `raw`, is decoded through the chat template (generate's `system`
and `prompt` as its messages), a raw generate as plain text, one with a `suffix` through the
model's fill-in-the-middle tokens. `options` map onto the request's fields (num_predict: max_tokens;
temperature, top_p, top_k, min_p, stop, seed, repeat_penalty, repeat_last_n, presence_penalty,
frequency_penalty); those only a llama.cpp runner knows (num_ctx, num_thread, num_gpu...) are
accepted and do nothing, a sampler this server cannot run (mirostat, tfs_z, typical_p) with a value
other than its neutral one is refused. `format` is "json" or a JSON schema; `think` a thinking
model's switch. The served model answers any name; errors are ollama's `{"error": "..."}`.
"""

from __future__ import annotations

import dataclasses
import datetime
import functools
import json
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specedge.serve.protocol import (
    APIError,
    GenerationRequest,
    fields_named,
    invalid,
    parse_chat,
    parse_common,
    parse_prompt,
    unsupported,
)
from specedge.serve.responses import Outcome, Writer
from specedge.serve.structured import parse_output

VERSION = "0.12.0"  # the ollama API whose shapes these routes answer in (/api/version)
OPTIONS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "min_p": "min_p", "stop": "stop",
           "seed": "seed", "repeat_penalty": "repeat_penalty", "presence_penalty": "presence_penalty",
           "frequency_penalty": "frequency_penalty", "repeat_last_n": "repeat_last_n"}
# the chat fields whose errors name them as ollama's request does
CHAT_NAMES = {**{chat: f"options.{name}" for name, chat in OPTIONS.items()}, "max_tokens": "options.num_predict",
              "response_format": "format", "response_format.json_schema": "format",
              "response_format.json_schema.schema": "format"}
NEUTRAL = {"mirostat": 0, "tfs_z": 1, "typical_p": 1}  # samplers this server cannot run, but at these values
DONE_REASONS = {"stop": "stop", "tool_calls": "stop", "length": "length"}
NO_EMBEDDINGS = APIError(422, "this server serves a text generation model and no embedding model; use another "
                              "server for embeddings", code="unsupported_endpoint")

if TYPE_CHECKING:  # the app imports these routes: no import of it back
    from specedge.serve.app import EventStream, Server


def ollama_error(err: APIError) -> JSONResponse:
    """ollama's error object: {"error": "message"}."""
    return JSONResponse({"error": err.message}, status_code=err.status, headers=err.headers)


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat().replace("+00:00", "Z")


def options_of(value: object, context: int) -> dict[str, Any]:
    """`options` as the chat request's fields; num_predict left out is ollama's -1: until the context
    is full (not the server's --max-tokens)."""
    if value is None:
        return {"max_tokens": context}
    if not isinstance(value, dict):
        raise invalid("options", "must be an object such as {\"temperature\": 0}")
    for name, neutral in NEUTRAL.items():
        if value.get(name) not in (None, neutral):
            raise unsupported(f"options.{name}", f"the {name} sampler")
    out = {OPTIONS[k]: v for k, v in value.items() if k in OPTIONS and v is not None}
    n = value.get("num_predict")
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n == 0 or n < -2:
            raise invalid("options.num_predict", f"must be -1, -2 or a number of tokens >= 1, got {json.dumps(n)[:40]}")
        out["max_tokens"] = context if n < 0 else n  # -1: until the context is full, -2: fill it
    out.setdefault("max_tokens", context)
    if out.get("seed") == -1:
        out.pop("seed")
    # repeat_last_n 0 (no penalty at all, as llama.cpp's sampler reads it) is the OpenAI parser's reading already
    return out


def format_of(value: object) -> dict[str, Any] | None:
    """`format` ("json" or a JSON schema) as a response_format."""
    if value in (None, ""):
        return None
    if value == "json":
        return {"type": "json_object"}
    if isinstance(value, dict):
        return {"type": "json_schema", "json_schema": {"schema": value}}
    raise invalid("format", f'must be "json" or a JSON schema, got {json.dumps(value)[:40]}')


def think_of(value: object) -> dict[str, Any]:
    """`think` (true, false, or a level: "low", "medium", "high") as the thinking switch."""
    if value is None:
        return {}
    if value not in (True, False, "low", "medium", "high"):
        raise invalid("think", f'must be true, false, "low", "medium" or "high", got {json.dumps(value)[:40]}')
    return {"thinking": value is not False, "thinking_param": "think"}


def chat_messages(value: object) -> list[dict[str, Any]]:
    """ollama's messages as chat's: tool_calls with arguments as objects, tool messages by tool_name."""
    if not isinstance(value, list):
        raise invalid("messages", "must be a list of messages")
    out, calls = [], 0
    for i, message in enumerate(value):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise invalid(param, "must be an object with 'role' and 'content'")
        if message.get("images"):
            raise unsupported(f"{param}.images", "images (this model reads text only)")
        chat = {"role": message.get("role"), "content": message.get("content") or ""}
        if message.get("tool_calls"):
            if not isinstance(message["tool_calls"], list):
                raise invalid(f"{param}.tool_calls", "must be a list of tool calls")
            chat["tool_calls"] = []
            for j, call in enumerate(message["tool_calls"]):
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise invalid(f"{param}.tool_calls[{j}]", 'must be {"function": {"name", "arguments": {...}}}')
                arguments = function.get("arguments", {})
                chat["tool_calls"].append({"id": call.get("id") or f"call_{calls}", "type": "function", "function": {
                    "name": function["name"],
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments)}})
                calls += 1
        if chat["role"] == "tool":
            chat["tool_call_id"] = str(message.get("tool_call_id") or message.get("tool_name") or "")
        out.append(chat)
    return out


def chat_request(body: dict[str, Any], context: int, messages: list[dict[str, Any]]) -> GenerationRequest:
    """A chat request of ollama's fields (stream: true unless false, as ollama's default)."""
    chat: dict[str, Any] = {"model": body.get("model"), "messages": messages, "tools": body.get("tools") or None,
                            "response_format": format_of(body.get("format")), "stream": body.get("stream", True),
                            **options_of(body.get("options"), context)}
    chat = {k: v for k, v in chat.items() if v is not None}
    with fields_named(CHAT_NAMES):
        return dataclasses.replace(parse_chat(chat), **parse_output(chat), **think_of(body.get("think")))


def generate_request(body: dict[str, Any], context: int) -> GenerationRequest:
    """/api/generate: a chat of `system` and `prompt`, or `raw` text, or text and a `suffix` to fill in between."""
    for name in ("template", "context", "images"):
        if body.get(name):
            raise unsupported(name, {"template": "a template per request", "context": "the deprecated context of "
                                     "an earlier answer (send the conversation to /api/chat)",
                                     "images": "images (this model reads text only)"}[name])
    prompt, suffix, system = body.get("prompt") or "", body.get("suffix"), body.get("system")
    for name, value in (("prompt", prompt), ("suffix", suffix), ("system", system)):
        if value is not None and not isinstance(value, str):
            raise invalid(name, "must be a string")
    raw = body.get("raw", False)
    if not isinstance(raw, bool):
        raise invalid("raw", "must be true or false")
    if not raw and not suffix:
        messages = [*([{"role": "system", "content": system}] if system else []), {"role": "user", "content": prompt}]
        return chat_request(body, context, messages)
    fields = {"model": body.get("model"), "stream": body.get("stream", True),
              **options_of(body.get("options"), context)}
    with fields_named(CHAT_NAMES):
        output = parse_output({"response_format": format_of(body.get("format"))})
        common = parse_common(fields)
    return GenerationRequest(kind="completion", prompt=parse_prompt(prompt), suffix=suffix or None,
                             grammar=output["grammar"], grammar_param=output["grammar_param"], **common)


class OllamaWriter(Writer):
    """ollama's answers: one JSON object, or NDJSON lines ending in the one with `done: true`."""

    media_type = "application/x-ndjson"
    done = b""
    ping = b""  # NDJSON has no comments: a waiting stream sends nothing

    def __init__(self, model: str, generate: bool) -> None:
        self.model = model
        self.generate = generate  # /api/generate: `response` and `thinking` beside, not in, a message
        self.created = now()

    def line(self, data: dict[str, Any]) -> bytes:
        return json.dumps(data, separators=(",", ":")).encode() + b"\n"

    def piece(self, content: str = "", thinking: str | None = None,
              calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        if self.generate:
            return {"response": content, **({"thinking": thinking} if thinking is not None else {})}
        message: dict[str, Any] = {"role": "assistant", "content": content}
        if thinking is not None:
            message["thinking"] = thinking
        if calls:
            message["tool_calls"] = [tool_call(c) for c in calls]
        return {"message": message}

    def chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        if not text:
            return b""
        return self.line({"model": self.model, "created_at": now(), **self.piece(text), "done": False})

    def reasoning_chunk(self, text: str, first: bool = False, logprobs: object = (), origin: object = None) -> bytes:
        return self.line({"model": self.model, "created_at": now(), **self.piece(thinking=text), "done": False})

    def calls_chunk(self, tool_calls: list[dict[str, object]], first: bool = False) -> bytes:
        return self.line({"model": self.model, "created_at": now(), **self.piece(calls=tool_calls), "done": False})

    def last(self, outcome: Outcome, fields: dict[str, Any]) -> dict[str, Any]:
        s, stats = outcome.result.stats, outcome.stats
        queued = float(stats.get("queued_s") or 0.0)  # type: ignore[arg-type]
        return {"model": self.model, "created_at": now(), **fields, "done": True,
                "done_reason": DONE_REASONS.get(outcome.finish or "", "stop"),
                "total_duration": int((queued + s.time_total_s) * 1e9), "load_duration": 0,
                "prompt_eval_count": s.prompt_tokens, "prompt_eval_duration": int(s.time_prefill_s * 1e9),
                "eval_count": s.n_tokens, "eval_duration": int(s.time_decode_s * 1e9), "specedge": stats}

    def end(self, outcome: Outcome, first: bool, include_usage: bool) -> bytes:
        return self.line(self.last(outcome, self.piece()))

    def body(self, outcome: Outcome) -> dict[str, object]:
        o = outcome
        return self.last(o, self.piece(o.text or "", o.reasoning, o.calls))

    def error_event(self, err: APIError) -> bytes:
        return self.line({"error": err.message})

    def error_response(self, err: APIError) -> JSONResponse:
        return ollama_error(err)


def tool_call(call: dict[str, Any]) -> dict[str, Any]:
    """A call as ollama carries it: the arguments as an object."""
    function = call["function"]
    try:
        arguments = json.loads(function["arguments"])
    except ValueError:
        arguments = function["arguments"]
    return {"id": call["id"], "function": {"index": call.get("index", 0), "name": function["name"],
                                           "arguments": arguments}}


def loaded(model: str, generate: bool, reason: str = "load") -> JSONResponse:
    """ollama's answer to a request that only loads (or unloads) the model: it is always loaded."""
    piece = {"response": ""} if generate else {"message": {"role": "assistant", "content": ""}}
    return JSONResponse({"model": model, "created_at": now(), **piece, "done": True, "done_reason": reason})


async def chat(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    model = body.get("model") if isinstance(body.get("model"), str) else server.settings.model_id
    if body.get("messages") in (None, []):
        return loaded(model, False, "unload" if body.get("keep_alive") in (0, "0") else "load")
    return await server.complete(request, lambda: chat_request(body, server.context,
                                                                chat_messages(body.get("messages"))),
                                 lambda req: OllamaWriter(model, False))


async def generate(server: Server, request: Request) -> Response | EventStream:
    body = await server.body(request)
    model = body.get("model") if isinstance(body.get("model"), str) else server.settings.model_id
    if not body.get("prompt") and not body.get("suffix"):
        return loaded(model, True, "unload" if body.get("keep_alive") in (0, "0") else "load")
    return await server.complete(request, functools.partial(generate_request, body, server.context),
                                 lambda req: OllamaWriter(model, True))


def name_of(server: Server) -> str:
    """The model's ollama name: its id, tagged `latest` unless it has a tag."""
    model = server.settings.model_id
    return model if ":" in model else f"{model}:latest"


def details(server: Server) -> dict[str, Any]:
    m = server.generator.target.manifest
    params = m.costs.matmul_params if m.costs else 0
    return {"parent_model": "", "format": "onnx", "family": m.architecture, "families": [m.architecture],
            "parameter_size": f"{params / 1e9:.1f}B" if params else "",
            "quantization_level": m.quantization.method.upper()}


def model_entry(server: Server) -> dict[str, Any]:
    gen = server.generator
    models = [gen.target.manifest]
    size = sum(int(f.get("size", 0)) for m in models for f in m.files.values())
    name = name_of(server)
    return {"name": name, "model": name, "modified_at": now(), "size": size,
            "digest": str(gen.target.manifest.source.get("sha256", "")), "details": details(server)}


def capabilities(server: Server) -> list[str]:
    return ["completion", *(["tools"] if server.lists_tools else []), *(["insert"] if server.fills_middle else []),
            *(["thinking"] if server.thinks else [])]


async def tags(server: Server, request: Request) -> JSONResponse:
    return JSONResponse({"models": [model_entry(server)]})


async def ps(server: Server, request: Request) -> JSONResponse:
    entry = model_entry(server)
    return JSONResponse({"models": [{**entry, "expires_at": "2318-01-01T00:00:00Z", "size_vram": 0,
                                     "context_length": server.context}]})


async def version(server: Server, request: Request) -> JSONResponse:
    return JSONResponse({"version": VERSION})


async def show(server: Server, request: Request) -> JSONResponse:
    body = await server.body(request)
    server.check_model(body.get("model", body.get("name")))
    gen, m = server.generator, server.generator.target.manifest
    arch = m.architecture
    info = {"general.architecture": arch, "general.parameter_count": m.costs.matmul_params if m.costs else 0,
            f"{arch}.context_length": server.context, f"{arch}.embedding_length": m.hidden_size,
            f"{arch}.block_count": m.num_layers, f"{arch}.attention.head_count": m.num_heads,
            f"{arch}.attention.head_count_kv": m.num_kv_heads}
    defaults = server.sampling_defaults()
    parameters = "\n".join(f"{k} {defaults[k]}" for k in ("temperature", "top_p", "top_k", "min_p")) + \
        f"\nrepeat_penalty {defaults['repetition_penalty']}"
    return JSONResponse({"license": "", "modelfile": f"# served by specedge\nFROM {gen.target.folder}\n",
                         "parameters": parameters, "template": gen.codec.template_source or "",
                         "details": details(server), "model_info": info, "capabilities": capabilities(server),
                         "modified_at": now()})


async def embeddings(server: Server, request: Request) -> JSONResponse:
    raise NO_EMBEDDINGS


def routes(server: Server) -> list[Route]:
    def route(path: str, handler: Any, method: str) -> Route:
        return Route(path, server.endpoint(functools.partial(handler, server)), methods=[method])

    return [route("/api/chat", chat, "POST"), route("/api/generate", generate, "POST"),
            route("/api/tags", tags, "GET"), route("/api/show", show, "POST"), route("/api/ps", ps, "GET"),
            route("/api/version", version, "GET"), route("/api/embed", embeddings, "POST"),
            route("/api/embeddings", embeddings, "POST"),
            Route("/v1/embeddings", server.endpoint(functools.partial(embeddings, server)), methods=["POST"])]
