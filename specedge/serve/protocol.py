"""Requests of the OpenAI API: JSON bodies checked and parsed into a `GenerationRequest`, and the
OpenAI error object for whatever is wrong with one.

Status codes: 400 a body the API itself refuses (invalid JSON, a wrong type, a value out of its
documented range), 404 an unknown model or path, 413 a body or prompt too large (the prompt does
not fit the model's context), 422 a valid OpenAI request this server does not support (n > 1,
several prompts, the deprecated `functions`, a `suffix` for a model without fill-in-the-middle
tokens).
Parameters this server does not know are ignored, as other local servers do; the ones it knows but
cannot honour are refused, never silently dropped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from starlette.responses import JSONResponse

from specedge.core.errors import SpecEdgeError
from specedge.request import Request
from specedge.runtime.constraints.grammar import GrammarFault
from specedge.runtime.round.decoding import check_stop_strings
from specedge.runtime.round.logprobs import MAX_TOP_LOGPROBS
from specedge.runtime.text.template.options import check_template_kwargs

MAX_BODY_BYTES = 4 << 20  # a prompt filling any supported context is far smaller
SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")  # the escapes \\ud800 to \\udfff in a JSON text
LONE_SURROGATE = re.compile("[\ud800-\udfff]")  # after parsing: pairs became one character
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}

Kind = Literal["chat", "completion"]
Message = dict[str, Any]  # role and content (text), and an assistant's tool_calls or a tool's tool_call_id


class APIError(Exception):
    """An error answered as the OpenAI error object: {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, *, param: str | None = None, code: str | None = None,
                 kind: str = "invalid_request_error", headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.kind = kind
        self.headers = headers or {}

    def body(self) -> dict[str, object]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}


def error_response(err: APIError) -> JSONResponse:
    """The OpenAI error object of `err`, with its status and headers."""
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


# what a request gets when the server stops with it queued or decoding (retry elsewhere or later)
SHUTTING_DOWN = APIError(503, "the server is shutting down; retry once it is started again", kind="server_error",
                         code="server_shutting_down")


def unsupported(param: str, what: str) -> APIError:
    return APIError(422, f"{what} is not supported by this server", param=param, code="unsupported_parameter")


def invalid(param: str, what: str) -> APIError:
    return APIError(400, f"'{param}' {what}", param=param, code="invalid_value")


@contextmanager
def fields_named(names: Mapping[str, str]) -> Iterator[None]:
    """Errors of the chat parser raised inside, naming the field as the caller's protocol does: `names`
    maps a chat field (or a dotted path's start) to the caller's (max_tokens -> max_output_tokens)."""
    try:
        yield
    except APIError as err:
        param = err.param or ""
        chat = max((n for n in names if param == n or param.startswith(n + ".")), key=len, default=None)
        if chat is None:
            raise
        theirs = names[chat] + param[len(chat):]
        message = err.message.replace(f"'{param}'", f"'{theirs}'", 1)
        raise APIError(err.status, message, param=theirs, code=err.code, kind=err.kind, headers=err.headers) from None


def tool_list(value: object) -> list[Any]:
    """A request's `tools` as a list (empty where none were sent), or a 400 naming the field."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise invalid("tools", "must be a list of tools")
    return value


MESSAGE_CHARS = 300  # an error message: one line, at most this long


def one_line(text: str) -> str:
    return " ".join(str(text).split())[:MESSAGE_CHARS]


def error_for(exc: BaseException) -> APIError:
    """The API error for an exception out of encoding or generation: a SpecEdgeError is the
    request's fault (400), anything else the server's (500), each as one line."""
    if isinstance(exc, APIError):
        return exc
    if isinstance(exc, SpecEdgeError):
        return APIError(400, one_line(str(exc)))
    if isinstance(exc, GrammarFault):  # specedge's fault, in one line (the log has llguidance's account)
        return APIError(500, str(exc), kind="server_error", code="grammar_fault")
    if isinstance(exc, MemoryError):
        return APIError(503, "not enough memory for this request", kind="server_error", code="out_of_memory")
    first = one_line(str(exc))
    return APIError(500, f"internal error: {type(exc).__name__}{': ' + first if first else ''}",
                    kind="server_error", code="internal_error")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object."""
    if len(raw) > MAX_BODY_BYTES:
        raise body_too_large()
    try:
        body = json.loads(raw, parse_constant=_refuse_constant)
    except (ValueError, RecursionError) as e:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise APIError(400, f"the request body is not valid JSON ({one_line(str(e))})", code="invalid_json") from None
    if not isinstance(body, dict):
        raise APIError(400, f"the request body must be a JSON object, not {type(body).__name__}",
                       code="invalid_json")
    if SURROGATE_ESCAPE.search(raw):  # else no string can hold one: UTF-8 bytes cannot
        check_unicode(body)
    return body


def check_unicode(body: dict[str, Any]) -> None:
    """Refuse a lone UTF-16 surrogate (a JSON escape such as \\udcff without its pair) in any key or
    string of the body: it is no Unicode text, and neither a tokenizer nor a response can take it."""
    stack: list[tuple[str, object]] = [("", body)]
    while stack:
        where, value = stack.pop()
        if isinstance(value, str):
            check_surrogates(value, where)
        elif isinstance(value, dict):
            for key in value:
                check_surrogates(key, where, key=True)
            stack.extend((f"{where}.{key}" if where else key, v) for key, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(value))


def check_surrogates(text: str, where: str, key: bool = False) -> None:
    if (found := LONE_SURROGATE.search(text)) is None:
        return
    what = f"a key of '{where[:100]}'" if key and where else "a key" if key else f"'{where[:100]}'"
    raise APIError(400, f"{what} holds a lone surrogate \\u{ord(found.group()):04x} at character "
                        f"{found.start() + 1}, which is no Unicode text; send surrogates only in pairs",
                   param=where[:100] or None, code="invalid_value")


def body_too_large() -> APIError:
    return APIError(413, f"the request body is larger than {MAX_BODY_BYTES >> 20} MiB", code="request_too_large")


def _refuse_constant(name: str) -> float:
    raise ValueError(f"{name} is not a JSON number")


@dataclass(frozen=True)
class GenerationRequest(Request):
    """One checked request (specedge/request.py's Request, read from a JSON body), and how the
    server is to send its answer. A None sampling parameter takes the server's default. Beyond the
    OpenAI API: top_k and min_p (as llama.cpp's server and vLLM take them), ignore_eos (decode exactly
    max_tokens: benchmarks), {"specedge": {"acceptance": "race"|"rejection", "show_draft": true}},
    chat_template_kwargs (vLLM's), reasoning_format (llama-server's: "none" leaves a thinking model's
    <think> block in the content)."""

    kind: Kind = "chat"
    model: str | None = None
    stream: bool = False
    include_usage: bool = False
    show_draft: bool = False  # each streamed chunk says where its tokens came from
    thinking: bool | None = None  # a thinking model's switch (Qwen3's enable_thinking); None: the template's default
    thinking_param: str = ""  # the request's field that asked (reasoning_effort, think...): named where it is a no-op


# Known parameters this server cannot honour, each with the test that a value is the API's default
# (a client that sends the default, as many do, is served).
def _absent(value: object) -> bool:
    return value is None


def _is_one(value: object) -> bool:
    return value is None or (value == 1 and not isinstance(value, bool))


def _false(value: object) -> bool:
    return value is None or value is False


def _empty(value: object) -> bool:
    return value is None or value == {} or value == [] or value == ""


def _no_tools(value: object) -> bool:
    return value is None or value == "none"


def _text_only(value: object) -> bool:
    return value is None or value == ["text"]


COMMON_UNSUPPORTED: dict[str, tuple[Callable[[object], bool], str]] = {
    "n": (_is_one, "more than one choice (n > 1)"),
}
CHAT_UNSUPPORTED: dict[str, tuple[Callable[[object], bool], str]] = {
    **COMMON_UNSUPPORTED,
    "functions": (_empty, "functions (the deprecated form of tools: send tools)"),
    "function_call": (_no_tools, "function_call (the deprecated form of tool_choice: send tool_choice)"),
    "modalities": (_text_only, "output modalities other than text"),
    "audio": (_absent, "audio output"),
}
COMPLETION_UNSUPPORTED: dict[str, tuple[Callable[[object], bool], str]] = {
    **COMMON_UNSUPPORTED,
    "best_of": (_is_one, "best_of > 1"),
    "echo": (_false, "echo"),
}


def check_unsupported(body: dict[str, Any], table: dict[str, tuple[Callable[[object], bool], str]]) -> None:
    for name, (is_default, what) in table.items():
        if name in body and not is_default(body[name]):
            raise unsupported(name, what)


def parse_chat(body: dict[str, Any]) -> GenerationRequest:
    """The chat request; its response_format, tools and prediction: serve/structured.py."""
    check_unsupported(body, CHAT_UNSUPPORTED)
    return GenerationRequest(kind="chat", messages=parse_messages(body.get("messages")),
                             logprobs=_chat_logprobs(body), template_kwargs=_template_kwargs(body),
                             split_reasoning=_reasoning_format(body) != "none",
                             **parse_effort(body.get("reasoning_effort"), "reasoning_effort"), **parse_common(body))


# OpenAI's reasoning_effort as a thinking model's switch: "none" and "minimal" turn thinking off
EFFORTS = {"none": False, "minimal": False, "low": True, "medium": True, "high": True, "xhigh": True}


def parse_effort(value: object, param: str) -> dict[str, Any]:
    """A reasoning effort as the GenerationRequest's thinking switch and the field it came from."""
    if value is None:
        return {}
    if not isinstance(value, str) or value not in EFFORTS:
        raise invalid(param, f"must be one of {', '.join(EFFORTS)}, got {json.dumps(value)[:40]}")
    return {"thinking": EFFORTS[value], "thinking_param": param}


REASONING_FORMATS = ("auto", "deepseek", "none")  # llama-server's: a <think> block apart (auto, deepseek) or not


def _reasoning_format(body: dict[str, Any]) -> str:
    value = body.get("reasoning_format", "auto")
    if value not in REASONING_FORMATS:
        formats = ", ".join(REASONING_FORMATS)
        raise invalid("reasoning_format", f"must be one of {formats}, got {json.dumps(value)[:40]}")
    return value


def _template_kwargs(body: dict[str, Any]) -> dict[str, Any] | None:
    """chat_template_kwargs (as vLLM and llama-server take it): extra variables for the chat template."""
    value = body.get("chat_template_kwargs")
    if value is None:
        return None
    try:
        return check_template_kwargs(value) or None
    except SpecEdgeError as e:
        raise invalid("chat_template_kwargs", e.problem.removeprefix("chat_template_kwargs ")) from None


def parse_completion(body: dict[str, Any]) -> GenerationRequest:
    check_unsupported(body, COMPLETION_UNSUPPORTED)
    return GenerationRequest(kind="completion", prompt=parse_prompt(body.get("prompt")),
                             logprobs=_top_count(body, "logprobs"), suffix=_suffix(body.get("suffix")),
                             **parse_common(body))


def _chat_logprobs(body: dict[str, Any]) -> int | None:
    """Chat's `logprobs` (true: each token's log-probability) and `top_logprobs` (0 to 20
    alternatives; more than 0 only with logprobs true), as the alternatives asked for (None: no logprobs)."""
    top = _top_count(body, "top_logprobs")
    if not _bool(body, "logprobs"):
        if top:
            raise invalid("top_logprobs", "is only allowed when 'logprobs' is true")
        return None
    return top or 0


def _top_count(body: dict[str, Any], name: str) -> int | None:
    """A number of alternatives per token, 0 to 20 (None: not given)."""
    count = _int(body, name, 0)
    if count is not None and count > MAX_TOP_LOGPROBS:
        raise invalid(name, f"must be an integer from 0 to {MAX_TOP_LOGPROBS}, got {count}")
    return count


def _suffix(value: object) -> str | None:
    """The completion's suffix; an empty one is none (a plain completion)."""
    if value is not None and not isinstance(value, str):
        raise invalid("suffix", "must be a string")
    return value or None


def parse_common(body: dict[str, Any]) -> dict[str, Any]:
    """The sampling, length and streaming parameters both endpoints take."""
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid("model", "must be a string")
    stream = _bool(body, "stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid("stream_options", "must be an object")
    include_usage = bool(options) and _bool(options, "include_usage")
    if options and not stream:
        raise invalid("stream_options", "is only allowed when 'stream' is true")
    max_tokens = _int(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _int(body, "max_tokens", 1)
    return {
        "model": model, "stream": stream, "include_usage": include_usage, "max_tokens": max_tokens,
        "temperature": _number(body, "temperature", 0.0, 2.0, "a number from 0 to 2"),
        "top_p": _number(body, "top_p", 0.0, 1.0, "a number in (0, 1]", low_open=True),
        "top_k": _int(body, "top_k", 0), "min_p": _number(body, "min_p", 0.0, 1.0, "a number from 0 to 1"),
        **_penalties(body),
        "seed": _seed(body), "stop": parse_stop(body.get("stop")),
        "ignore_eos": _bool(body, "ignore_eos"), **_extension(body.get("specedge"), stream),
    }


def _penalties(body: dict[str, Any]) -> dict[str, Any]:
    """OpenAI's presence_penalty, frequency_penalty and logit_bias; transformers' repetition_penalty
    (llama-server's repeat_penalty) with llama-server's repeat_last_n as llama-server reads it: -1 the
    whole context, 0 no penalties at all (the model's default ones included)."""
    repetition = _number(body, "repetition_penalty", 0.0, math.inf, "a number > 0", low_open=True)
    if repetition is None:
        repetition = _number(body, "repeat_penalty", 0.0, math.inf, "a number > 0", low_open=True)
    last_n = _int(body, "repeat_last_n", -1)
    presence = _number(body, "presence_penalty", -2.0, 2.0, "a number from -2 to 2")
    frequency = _number(body, "frequency_penalty", -2.0, 2.0, "a number from -2 to 2")
    if last_n == 0:
        presence, frequency, repetition, last_n = 0.0, 0.0, 1.0, None
    return {"presence_penalty": presence, "frequency_penalty": frequency, "repetition_penalty": repetition,
            "repeat_last_n": None if last_n is None else max(last_n, 0),  # -1: 0, the whole context
            "logit_bias": _logit_bias(body.get("logit_bias"))}


def _logit_bias(value: object) -> dict[int, float] | None:
    """{"token id": bias from -100 to 100} as the API sends it (ids as strings)."""
    if value is None or value == {}:
        return None
    if not isinstance(value, dict):
        raise invalid("logit_bias", 'must be an object mapping token ids to biases, e.g. {"1234": -100}')
    out = {}
    for key, bias in value.items():
        if not (isinstance(key, str) and key.isdigit() and len(key) < 12):
            raise invalid("logit_bias", f"has the key {json.dumps(key)[:40]}, not a token id")
        if not isinstance(bias, (int, float)) or isinstance(bias, bool) or not -100 <= bias <= 100:
            raise invalid("logit_bias", f"of token {key} must be a number from -100 to 100, "
                                        f"got {json.dumps(bias)[:40]}")
        out[int(key)] = float(bias)
    return out


ACCEPTANCE_RULES = ("race", "rejection")


def _extension(extension: object, stream: bool) -> dict[str, Any]:
    """specedge's own request field: {"specedge": {"acceptance": "race" | "rejection", "show_draft":
    true}} (show_draft: each streamed chunk says where its tokens came from)."""
    if extension is None:
        return {"acceptance": None, "show_draft": False}
    if not isinstance(extension, dict) or set(extension) - {"acceptance", "show_draft"}:
        raise invalid("specedge", 'must be an object such as {"acceptance": "rejection", "show_draft": true}')
    rule = extension.get("acceptance")
    if rule is not None and rule not in ACCEPTANCE_RULES:
        rules = ", ".join(ACCEPTANCE_RULES)
        raise invalid("specedge.acceptance", f"must be one of {rules}, got {json.dumps(rule)[:40]}")
    show_draft = extension.get("show_draft", False)
    if not isinstance(show_draft, bool):
        raise invalid("specedge.show_draft", "must be true or false")
    if show_draft and not stream:
        raise invalid("specedge.show_draft", "is only allowed when 'stream' is true")
    return {"acceptance": rule, "show_draft": show_draft}


def _bool(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is not None and not isinstance(value, bool):
        raise invalid(name, "must be true or false")
    return bool(value)


def _int(body: dict[str, Any], name: str, minimum: int) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise invalid(name, f"must be an integer >= {minimum}, got {json.dumps(value)[:40]}")
    return value


def _number(body: dict[str, Any], name: str, low: float, high: float, what: str,
            low_open: bool = False) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if (not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value)
            or not low <= value <= high or (low_open and value == low)):
        raise invalid(name, f"must be {what}, got {json.dumps(value)[:40]}")
    return float(value)


def _seed(body: dict[str, Any]) -> int | None:
    seed = body.get("seed")
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise invalid("seed", "must be an integer")
    return seed % (1 << 64)  # the API takes any 64-bit integer; the sampler any integer >= 0


def parse_stop(value: object, param: str = "stop") -> tuple[str, ...]:
    """Stop strings: a string or a list of them, within the runtime's bounds (check_stop_strings), each once."""
    if value is None:
        return ()
    stops = [value] if isinstance(value, str) else value
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise invalid(param, "must be a string or a list of strings")
    if not all(stops):
        raise invalid(param, "may not hold an empty string")
    try:  # the runtime's bounds, as for every route and the CLI (more than OpenAI's 4: clients send dozens)
        check_stop_strings(tuple(stops))
    except SpecEdgeError as e:
        raise invalid(param, f"is out of bounds: {e.problem}; {e.fix}") from None
    return tuple(dict.fromkeys(stops))  # each once


def parse_messages(value: object) -> tuple[Message, ...]:
    if not isinstance(value, list) or not value:
        raise invalid("messages", "must be a non-empty list of messages")
    return tuple(_message(m, i) for i, m in enumerate(value))


def _message(message: object, i: int) -> Message:
    param = f"messages[{i}]"
    if not isinstance(message, dict):
        raise invalid(param, "must be an object with 'role' and 'content'")
    role = message.get("role")
    if role == "function" or message.get("function_call"):
        raise unsupported(f"{param}.role", "function messages (the deprecated form of tool messages)")
    if not isinstance(role, str) or role not in ROLES:
        raise invalid(f"{param}.role", f"must be one of {', '.join(ROLES)}, got {json.dumps(role)[:40]}")
    content = message.get("content")
    if content is None and role == "assistant":
        content = ""
    out: Message = {"role": ROLES[role], "content": _content(content, f"{param}.content")}
    if role == "assistant" and message.get("tool_calls") is not None:
        out["tool_calls"] = _tool_calls(message["tool_calls"], f"{param}.tool_calls")
    if role == "tool":
        call_id = message.get("tool_call_id")
        if not isinstance(call_id, str):
            raise invalid(f"{param}.tool_call_id", "must be the id of the call this message answers")
        out["tool_call_id"] = call_id
    return out


def _tool_calls(value: object, param: str) -> list[dict[str, Any]]:
    """An assistant's earlier tool calls: [{id, type: function, function: {name, arguments}}]."""
    if not isinstance(value, list):
        raise invalid(param, "must be a list of tool calls")
    calls = []
    for i, call in enumerate(value):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not isinstance(function.get("arguments", ""), str):
            raise invalid(f"{param}[{i}]", 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
        calls.append({"id": str(call.get("id", "")), "type": "function",
                      "function": {"name": function["name"], "arguments": function.get("arguments", "")}})
    return calls


def _content(content: object, param: str) -> str:
    """Text content: a string, or a list of text parts joined."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise invalid(param, "must be a string or a list of content parts")
    texts = []
    for part in content:
        if not isinstance(part, dict) or not isinstance(part.get("type"), str):
            raise invalid(param, "must hold content parts, objects with a 'type'")
        if part["type"] != "text":
            raise unsupported(param, f"content of type '{part['type'][:40]}' (this model reads text only)")
        if not isinstance(part.get("text"), str):
            raise invalid(param, "has a text part without a 'text' string")
        texts.append(part["text"])
    return "".join(texts)


def parse_prompt(value: object) -> str | tuple[int, ...]:
    """The completions prompt: text, token ids, or a list of one of those."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list) or not value:
        raise invalid("prompt", "must be a string, a list of token ids, or a list of one of those")
    if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    if len(value) > 1 and all(isinstance(v, (str, list)) for v in value):
        raise unsupported("prompt", "more than one prompt per request")
    return parse_prompt(value[0]) if isinstance(value[0], (str, list)) else parse_prompt(None)
