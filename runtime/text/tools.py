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
from typing import TYPE_CHECKING, Any

from specedge.runtime.text.reasoning import held_back

if TYPE_CHECKING:
    from tokenizers import Tokenizer

    from specedge.runtime.constraints.grammar import Grammar

OPEN, CLOSE = "<tool_call>", "</tool_call>"
CALL = re.compile(re.escape(OPEN) + r"\s*(.*?)\s*" + re.escape(CLOSE), re.S)


@dataclass(frozen=True)
class ToolMarkup:
    """How a model's tokenizer spells the call markers: Qwen2.5's `<tool_call>` and `</tool_call>`
    are tokens of their own (151657, 151658), which the model emits as one token each, so a grammar
    must name the token, not the text (whose bytes the model never writes); other models write
    them as text. An id is set where the marker is one added token of the tokenizer."""

    open_id: int | None = None
    close_id: int | None = None

    @classmethod
    def of(cls, tokenizer: Tokenizer) -> ToolMarkup:
        added = {token.content: i for i, token in tokenizer.get_added_tokens_decoder().items()}
        return cls(added.get(OPEN), added.get(CLOSE))

    def lark(self) -> tuple[str, str]:
        """The open and close markers as Lark items: a token (`<[id]>`) or a string literal."""
        return tuple(f"<[{i}]>" if i is not None else json.dumps(text)  # type: ignore[return-value]
                     for i, text in ((self.open_id, OPEN), (self.close_id, CLOSE)))


TEXT_MARKUP = ToolMarkup()


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
    return call_of(data)


def call_of(data: object) -> ToolCall | None:
    """The call a decoded JSON value is ({"name", "arguments"} or "parameters"), or None."""
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


def read_tool_calls(text: str, names: frozenset[str] = frozenset()) -> tuple[str, list[ToolCall]]:
    """The text outside tool-call blocks and their calls; with the tools' `names`, a response that
    is nothing but a call to one of them written as bare JSON (or in a ```json fence: what small
    models such as Qwen2.5-Coder-1.5B write when free to choose) is that call, and no text."""
    rest, calls = split_tool_calls(text)
    if not calls and names and (bare := bare_calls(text, names)):
        return "", bare
    return rest, calls


FENCED = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.S)
BARE_OPENINGS = ("```json", "```\n", "{", "[")


def bare_calls(text: str, names: frozenset[str]) -> list[ToolCall]:
    """The calls of a whole response written as a JSON call or list of calls to the named tools ([]: it is not)."""
    body = text.strip()
    if (fenced := FENCED.fullmatch(body)) is not None:
        body = fenced.group(1)
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):
        return []
    calls = [call_of(item) for item in (data if isinstance(data, list) else [data])]
    if not calls or any(c is None or c.name not in names for c in calls):
        return []
    return calls  # type: ignore[return-value]


def may_be_bare_call(text: str, names: frozenset[str]) -> bool:
    """Whether a response that begins with `text` could still be a whole bare call (streaming
    holds it back meanwhile): it opens as JSON or a ```json fence, and no complete value in it
    is already something else."""
    body = text.lstrip()
    if not any(body.startswith(o) or o.startswith(body) for o in BARE_OPENINGS):
        return False
    inner = body.removeprefix("```json").removeprefix("```").lstrip()
    try:
        value, end = json.JSONDecoder().raw_decode(inner)
    except (ValueError, RecursionError):
        return True  # not yet whole
    rest = inner[end:].strip()
    calls = [call_of(item) for item in (value if isinstance(value, list) else [value])]
    is_call = all(c is not None and c.name in names for c in calls)
    return is_call and (rest == "" or "```".startswith(rest))


def open_call_at(text: str) -> int:
    """Where a tool-call block that may still be being written begins in `text` (-1: none): an
    unclosed `<tool_call>`, or a tail that could be the start of one (streaming holds text back from there)."""
    last = text.rfind(OPEN)
    if last >= 0 and text.find(CLOSE, last) < 0:
        return last
    tail = held_back(text, OPEN)
    return len(text) - tail if tail else -1


# a call's JSON as templates write the calls they show the model (transformers' tojson: json.dumps'
# spacing), with no other whitespace: the model's own habit, and more of its tokens forced
CALL_JSON = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], parallel: bool = True, markup: ToolMarkup = TEXT_MARKUP,
                      lazy: bool = False) -> Grammar:
    """The tool-call markup of a call (with `parallel`, one or more) to these tools (OpenAI's tool
    objects), each call's arguments following its function's schema (Lark with llguidance's
    embedded JSON schemas); a non-`strict` tool's arguments are any object when `lazy`. Lazy: any
    text, or text and then calls - the grammar binds from the open marker on (a token the text
    cannot contain; written as text, the lazy lexeme that ends at it)."""
    from specedge.runtime.constraints.grammar import Grammar

    calls = [{"type": "object", "properties": {"name": {"const": t["function"]["name"]},
                                               "arguments": arguments_schema(t, lazy)},
              "required": ["name", "arguments"], "additionalProperties": False} for t in tools]
    schema = {**(calls[0] if len(calls) == 1 else {"anyOf": calls}), "x-guidance": CALL_JSON}
    opener, closer = markup.lark()
    more = (' ("\\n" call)*' if parallel else "") + ' "\\n"?'  # a newline may end the calls (Qwen2.5's does)
    rules = [f'call: {opener} "\\n" body "\\n" {closer}', f"body: %json {json.dumps(schema)}"]
    if not lazy:
        rules.insert(0, f"start: call{more}")
    elif markup.open_id is not None:
        rules[:0] = [f"start: TEXT | TEXT? call{more}", "TEXT: /(.|\\n)+/"]
    else:
        rules = [f"start: TEXT | head rest{more}", "TEXT: /(.|\\n)+/", f"head[lazy]: /(.|\\n)*{re.escape(OPEN)}/",
                 f'rest: "\\n" body "\\n" {closer}', *rules]
    return Grammar("lark", "\n".join(rules) + "\n")


def arguments_schema(tool: Mapping[str, Any], lazy: bool) -> Any:
    """A call's arguments: its function's schema; in a lazy grammar, that of a strict function only."""
    function = tool["function"]
    return function.get("parameters", {"type": "object"}) if not lazy or function.get("strict") is True \
        else {"type": "object"}


def template_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates expect them: an assistant's tool-call arguments as objects (the
    API carries JSON text; templates such as Qwen2.5's write them with `tojson`), and no key whose
    value is None (as transformers drops them: an OpenAI assistant message's null content is no
    content, not the text "None")."""
    out = []
    for message in messages:
        message = {key: value for key, value in message.items() if value is not None}
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
