"""A chat template chosen by the user in place of the model's, and the extra variables a template
reads (`enable_thinking`...): checked once, as one clear line each, before anything renders."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import MAX_TEMPLATE_CHARS

# what the renderer itself passes, or registers: a keyword may not replace them
RESERVED = frozenset({"messages", "tools", "add_generation_prompt", "bos_token", "eos_token",
                      "raise_exception", "strftime_now"})
TEMPLATE_CHARS = MAX_TEMPLATE_CHARS  # a chat template longer than 1 MiB is not one (as a manifest's)


def check_template_kwargs(kwargs: object, what: str = "chat_template_kwargs") -> dict[str, Any]:
    """Extra template variables: an object of names to JSON values, none of them the renderer's own."""
    if not isinstance(kwargs, Mapping):
        raise SpecEdgeError(f"{what} must be a JSON object of names to values, not {type(kwargs).__name__}",
                            'pass e.g. {"enable_thinking": false}')
    for key in kwargs:
        if not isinstance(key, str) or not key.isidentifier():
            raise SpecEdgeError(f"{what} has the key {str(key)[:40]!r}, not a template variable's name",
                                "use names such as enable_thinking")
        if key in RESERVED:
            raise SpecEdgeError(f"{what} may not set '{key}': the renderer passes it",
                                "pass the conversation as messages (and tools) instead")
    try:
        return json.loads(json.dumps(dict(kwargs), allow_nan=False))  # plain JSON values, copied
    except (TypeError, ValueError) as e:
        raise SpecEdgeError(f"{what} holds a value that is not JSON ({e})", "pass JSON values only") from None


def parse_template_kwargs(text: str) -> dict[str, Any]:
    """--chat-template-kwargs: a JSON object on the command line."""
    try:
        value = json.loads(text)
    except ValueError as e:
        raise SpecEdgeError(f"not JSON ({e})", """pass a JSON object, e.g. '{"enable_thinking": false}'""") from None
    return check_template_kwargs(value, "the object")


def read_template(path: str | Path) -> str:
    """--chat-template FILE: a Jinja chat template (as transformers' chat_template), read as UTF-8 text."""
    file = Path(path)
    try:
        if file.stat().st_size > TEMPLATE_CHARS:
            raise SpecEdgeError(f"{file} is larger than 1 MiB, not a chat template", "pass a Jinja chat template file")
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SpecEdgeError(f"{file} cannot be read ({e})", "pass a UTF-8 Jinja chat template file") from None
    if not text.strip():
        raise SpecEdgeError(f"{file} is empty", "pass a Jinja chat template file")
    return text


def compile_check(source: str, what: str) -> None:
    """A template's syntax, checked in the chat sandbox (one line naming `what` if it does not compile)."""
    from jinja2 import TemplateSyntaxError

    from specedge.runtime.text.template.functions import chat_sandbox

    try:
        chat_sandbox().from_string(source)
    except TemplateSyntaxError as e:
        raise SpecEdgeError(f"{what} is not a Jinja template ({e.message}, line {e.lineno})",
                            "fix the template") from None
