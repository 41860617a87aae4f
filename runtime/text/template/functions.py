"""What a chat template may call beyond jinja2's own, as transformers' `apply_chat_template` gives
it, so a prompt renders byte for byte as the model was trained on: its `tojson` (keys in order,
non-ASCII kept, nothing HTML-escaped; jinja2's sorts keys and writes `<` as `\\u003c`),
`strftime_now`, `raise_exception`, the `loopcontrols` extension ({% break %}, {% continue %}) and
the `{% generation %}` block (transformers marks the assistant's tokens with it; here it renders
its body). Each is registered into the bounded sandbox (sandbox.py), which sizes it before it runs
(bounds.py)."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.parser import Parser

from specedge.core.errors import SpecEdgeError
from specedge.runtime.text.template.sandbox import BoundedSandbox

EXTENSIONS = ("jinja2.ext.loopcontrols",)


def tojson(value: Any, ensure_ascii: bool = False, indent: int | str | None = None,
           separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' tojson: json.dumps with its defaults (not jinja2's HTML-safe filter)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def strftime_now(format: str) -> str:
    """The local time now, formatted (templates date their system prompt with it)."""
    return datetime.now().strftime(format)


def raise_exception(message: str) -> None:
    """What a template calls to refuse a conversation: its words, as one clear error."""
    raise SpecEdgeError(f"the chat template refused the conversation: {message}")


class GenerationBlock(Extension):
    """`{% generation %}...{% endgeneration %}`: transformers' mark of the assistant's part, rendered as its body."""

    tags = {"generation"}  # noqa: RUF012 - jinja2's Extension API

    def parse(self, parser: Parser) -> nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.Scope(body, lineno=lineno)


def chat_sandbox() -> BoundedSandbox:
    """The environment a chat template renders in: the bounded sandbox with what transformers adds
    (trim_blocks and lstrip_blocks, as transformers sets them)."""
    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[*EXTENSIONS, GenerationBlock])
    env.filters["tojson"] = env.bounded_filter("tojson", tojson)
    env.globals.update(strftime_now=strftime_now, raise_exception=raise_exception)
    return env
