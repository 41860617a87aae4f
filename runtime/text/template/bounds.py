"""How many characters a chat template's operation would make, known before it runs.

BoundedSandbox (runtime/text/codec.py) asks these before it lets an operator, a call or a filter run,
so a template that would build a huge string is refused before the memory is taken: the widths
and precisions of `%` formatting and str.format (`'%999999999d' % 1`), padding and indentation
(`center`, `ljust`, `rjust`, `zfill`, `expandtabs`, `indent`), `replace`, `translate`,
`wordwrap`, escaping, `tojson`, `pprint`, `urlize`, `batch`, `slice`, `lipsum`, and the text of
a value printed whole (a list holding one long string many times). Each figure is an upper bound
on the length of the result, from one pass over the operands, never from the result itself.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from string import Formatter
from typing import Any

from jinja2.utils import Namespace

HUGE = 1 << 62  # what a width too long to read stands for
FLOAT_CHARS = 330  # a float printed by any conversion: 309 digits of 1.8e308, a sign, a point, 6 decimals
OBJECT_CHARS = 200  # the repr of an object that is not text, a number or a container
ITEM_CHARS = 16  # what a container's text adds per item: separators, and quotes escaped
QUOTE_GROWTH = 10  # repr/ascii of one character: at most '\U0001f600'
ESCAPE_GROWTH = 12  # one character escaped for JSON or HTML: at most a surrogate pair, '\ud83d\ude00'
URL_GROWTH = 12  # one character percent-encoded: 4 UTF-8 bytes, '%F0%9F%98%80'
ESCAPED = "<>&'\"\\"  # what JSON (htmlsafe) or HTML escaping writes as several characters
CONTROLS = [chr(c) for c in (*range(32), 127)]
PERCENT_SPEC = re.compile(r"%(?:\([^)]*\))?[#0\- +]*(\*|\d+)?(?:\.(\*|\d*))?[hlL]?(.)", re.S)
CONTEXTS = ("eval_ctx", "environment", "context")  # what jinja2 passes a filter before its value
Sizer = Callable[[Mapping[str, Any], int], int]


# -- the text of a value -----------------------------------------------------------------------
def text_size(value: object, limit: int, mode: str = "str") -> int:
    """An upper bound on the length of `value` as text: str(value) (mode "str"), its repr
    ("repr"), or its text escaped for JSON or HTML ("escaped"); exact for a string in mode "str".
    A container is walked item by item (its text holds each item's repr), the walk stopping as
    soon as the sum passes `limit`."""
    if isinstance(value, str):
        return {"str": len, "repr": quoted_size, "escaped": escaped_size}[mode](value)
    if isinstance(value, (bytes, bytearray)):  # its repr: b'\xff', then each character escaped
        return (len(value) * 4 + 3) * (ESCAPE_GROWTH if mode == "escaped" else 1)
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, int):
        return value.bit_length() * 31 // 100 + 2  # decimal digits: bits · log10(2), and a sign
    if isinstance(value, float):
        return 32
    items = container_items(value)
    if items is None:
        return OBJECT_CHARS
    total = OBJECT_CHARS  # brackets, or a view's or a namespace's name around the items
    for item in items:
        total += text_size(item, limit - total, "escaped" if mode == "escaped" else "repr") + ITEM_CHARS
        if total > limit:
            break
    return total


def container_items(value: object) -> Iterable[Any] | None:
    """What a container prints: its items (a mapping's keys and values); None for anything else."""
    if isinstance(value, Namespace):  # jinja2's namespace() prints its attributes
        value = value._Namespace__attrs  # (read only here: an undefined value refuses any attribute)
    if isinstance(value, Mapping):
        return (part for pair in value.items() for part in pair)
    if isinstance(value, (list, tuple, set, frozenset)) or type(value).__name__ in ("dict_keys", "dict_values",
                                                                                       "dict_items"):
        return value  # type: ignore[return-value]
    return None


def quoted_size(text: str) -> int:
    """An upper bound on len(repr(text)) and len(ascii(text))."""
    if text.isascii() and text.isprintable():
        return len(text) + 2 + text.count("\\") + text.count("'") + text.count('"')
    return len(text) * QUOTE_GROWTH + 2


def escaped_size(text: str) -> int:
    """An upper bound on the length of `text` escaped for JSON (jinja2's htmlsafe tojson) or HTML."""
    if not text.isascii():
        return len(text) * ESCAPE_GROWTH + 2
    special = sum(text.count(c) for c in ESCAPED) + sum(text.count(c) for c in CONTROLS)
    return len(text) + 5 * special + 2


def printed_size(values: Iterable[object], limit: int, escaped: bool = False) -> tuple[int, int]:
    """(widest, widest as a repr): the longest any of `values` prints as, a float at its widest
    fixed-point form; escaped: as a Markup string formats them, HTML-escaped."""
    plain = quoted = 0
    for value in values:
        if isinstance(value, float):
            plain, quoted = max(plain, FLOAT_CHARS), max(quoted, FLOAT_CHARS)
            continue
        plain = max(plain, text_size(value, limit, "escaped" if escaped else "str"))
        quoted = max(quoted, text_size(value, limit, "repr") * (ESCAPE_GROWTH if escaped else 1))
    return plain, quoted


def number(digits: str) -> int:
    return int(digits) if len(digits) < 19 else HUGE


def largest_int(values: Iterable[object]) -> int:
    """The largest integer among `values`: what a width or precision taken from them may be."""
    return max((abs(v) for v in values if isinstance(v, int) and not isinstance(v, bool)), default=0)


# -- formatting ---------------------------------------------------------------------------------
def percent_size(fmt: str, args: object, limit: int) -> int:
    """An upper bound on len(fmt % args): the format's own characters and, per conversion, its
    width and precision (a '*' one taken from the arguments) and the widest argument printed
    (escaped, where `fmt` is Markup)."""
    values = list(args) if isinstance(args, tuple) else [args]
    if isinstance(args, Mapping):
        values += list(args.values())
    plain, quoted = printed_size(values, limit, escaped=is_markup(fmt))
    star = largest_int(values)
    total = len(fmt)
    for match in PERCENT_SPEC.finditer(fmt):
        width, precision, kind = match.groups()
        if kind == "%":
            continue
        total += sum(star if part == "*" else number(part) for part in (width, precision) if part)
        total += quoted if kind in "ra" else plain
        if total > limit:
            break
    return total


def format_size(fmt: str, args: Iterable[object], kwargs: Mapping[str, object], limit: int) -> int:
    """An upper bound on len(fmt.format(*args, **kwargs)): the literal text and, per field, the
    numbers of its format spec (a nested '{}' one taken from the arguments), the widest argument
    printed (a third more with digit grouping), and room for an attribute or item of it."""
    try:
        fields = list(Formatter().parse(fmt))
    except ValueError:
        return len(fmt)  # the call raises the same error
    values = [*args, *kwargs.values()]
    plain, quoted = printed_size(values, limit, escaped=is_markup(fmt))
    star = largest_int(values)
    total = 0
    for literal, field, spec, conversion in fields:
        total += len(literal)
        if field is None:
            continue
        printed = quoted if conversion in ("r", "a") else plain
        spec = spec or ""
        grouped = printed // 3 if "," in spec or "_" in spec else 0
        total += printed + grouped + OBJECT_CHARS + sum(number(d) for d in re.findall(r"\d+", spec))
        total += star * spec.count("{")
        if total > limit:
            break
    return total


# -- str methods --------------------------------------------------------------------------------
def method_size(text: str, name: str, args: tuple[Any, ...], kwargs: Mapping[str, Any], limit: int) -> int | None:
    """An upper bound on the length of text.name(*args, **kwargs) for the str methods that can
    make text longer than their operands (join aside: the sandbox counts its items as they come);
    None for the others."""
    def arg(i: int, key: str, default: Any = None) -> Any:
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "format":
        return format_size(text, args, kwargs, limit)
    if name == "format_map":
        mapping = arg(0, "mapping")
        return format_size(text, (), mapping if isinstance(mapping, Mapping) else {}, limit)
    if name in ("center", "ljust", "rjust", "zfill"):
        width = arg(0, "width", 0)
        return max(len(text), width) if isinstance(width, int) else None
    if name == "expandtabs":
        size = arg(0, "tabsize", 8)
        return len(text) + text.count("\t") * max(size, 0) if isinstance(size, int) else None
    if name == "replace":
        return replace_size(text, arg(0, "old"), arg(1, "new"), arg(2, "count", -1))
    if name == "translate":
        return translate_size(text, arg(0, "table"))
    return None


def replace_size(text: object, old: object, new: object, count: object) -> int | None:
    if not (isinstance(text, str) and isinstance(old, str) and isinstance(new, str)):
        return None
    found = text.count(old) if old else len(text) + 1
    if isinstance(count, int) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(text_size(new, HUGE, "escaped" if is_markup(text) else "str") - len(old), 0)


def is_markup(text: object) -> bool:
    """A Markup string escapes what it is formatted, joined or replaced with."""
    return hasattr(text, "__html__") and isinstance(text, str)


def translate_size(text: str, table: object) -> int | None:
    if isinstance(table, Mapping):
        mapped: Iterable[object] = table.values()
    elif isinstance(table, (list, tuple)):
        mapped = table
    else:
        return None
    return len(text) * max((len(v) for v in mapped if isinstance(v, str)), default=1)


# -- jinja2's filters and globals ---------------------------------------------------------------
def bind(f: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> dict[str, Any] | None:
    """The arguments of a filter or global call by jinja2's parameter names, defaults applied;
    None where they do not fit (the call raises the error itself)."""
    signature = _signature(f)
    if signature is None:
        return None
    first = next(iter(signature.parameters), "")
    if hasattr(f, "jinja_pass_arg") and first not in CONTEXTS:  # an async variant: the context not in its signature
        args = args[1:]
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    return dict(bound.arguments)


@functools.cache
def _signature(f: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(f)
    except (TypeError, ValueError):
        return None


def call_size(sizers: Mapping[str, Sizer], name: str, f: Callable[..., Any], args: tuple[Any, ...],
              kwargs: Mapping[str, Any], limit: int) -> int | None:
    """An upper bound on the length of what filter or global `name` (one of `sizers`) makes."""
    sizer = sizers.get(name)
    arguments = bind(f, args, kwargs) if sizer is not None else None
    return sizer(arguments, limit) if arguments is not None and sizer is not None else None


def _first(a: Mapping[str, Any]) -> Any:
    """The value a filter is applied to: its first argument after a context or environment."""
    return next((v for k, v in a.items() if k not in CONTEXTS), None)


def _int(value: object) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _indent(a: Mapping[str, Any], limit: int) -> int:
    text, width = a["s"], a["width"]
    step = len(width) if isinstance(width, str) else _int(width)
    size = text_size(text, limit)
    lines = text.count("\n") + 1 if isinstance(text, str) else size + 1
    return size + lines * max(step, 0)


def _format(a: Mapping[str, Any], limit: int) -> int:
    value, args, kwargs = a["value"], a["args"], a["kwargs"]
    if isinstance(value, str):
        return percent_size(value, kwargs or args, limit)
    return text_size(value, limit) + text_size(args, limit) + text_size(kwargs, limit)


def _wordwrap(a: Mapping[str, Any], limit: int) -> int:
    wrap = a["wrapstring"]
    return text_size(a["s"], limit) * (1 + (len(wrap) if isinstance(wrap, str) else 1))  # a wrap after each character


def _urlize(a: Mapping[str, Any], limit: int) -> int:
    size = text_size(a["value"], limit, "escaped")
    extra = sum(len(v) for v in (a["target"], a["rel"]) if isinstance(v, str)) + OBJECT_CHARS
    return size * 2 + (text_size(a["value"], limit) // 2 + 1) * extra  # each word a link: its text twice, attributes


def _nested(value: object, limit: int) -> tuple[int, int]:
    """(items, depth) of a container, walked until `limit` items."""
    items, depth, todo = 0, 0, [(value, 1)]
    while todo and items < limit:
        current, level = todo.pop()
        inner = container_items(current)
        if inner is None:
            continue
        depth = max(depth, level)
        for item in inner:
            items += 1
            todo.append((item, level + 1))
    return items, depth


def _laid_out(value: object, indent: object, mode: str, limit: int) -> int:
    """JSON or pprint text of `value`: its items' text, and a line per item indented per level."""
    step = len(indent) if isinstance(indent, str) else _int(indent)
    size = text_size(value, limit, mode)
    if size > limit:
        return size
    items, depth = _nested(value, limit // ITEM_CHARS + 1)  # more items: their text alone is past the limit
    return size + (items + 1) * (depth * max(step, 1) + 2)


def _json_size(a: Mapping[str, Any], limit: int) -> int:
    """JSON text of a value (jinja2's tojson, or transformers' with its separators)."""
    size = _laid_out(a["value"], a["indent"], "escaped", limit)
    separators = a.get("separators")
    if isinstance(separators, (tuple, list)) and size <= limit:
        items, _ = _nested(a["value"], limit // ITEM_CHARS + 1)
        size += (items + 1) * sum(len(s) for s in separators if isinstance(s, str))
    return size


def _lipsum(a: Mapping[str, Any], limit: int) -> int:
    n, low, high = _int(a["n"]), _int(a["min"]), _int(a["max"])
    return max(n, 0) * (max(low, high, 0) * 16 + 64)  # words of up to 15 letters and a space, a paragraph's mark-up


FILTER_SIZES: dict[str, Sizer] = {
    "center": lambda a, limit: max(text_size(a["value"], limit), _int(a["width"])),
    "indent": _indent,
    "format": _format,
    "replace": lambda a, limit: replace_size(a["s"], a["old"], a["new"], a["count"]) or 0,
    "wordwrap": _wordwrap,
    "urlize": _urlize,
    "escape": lambda a, limit: text_size(_first(a), limit, "escaped"),
    "urlencode": lambda a, limit: text_size(_first(a), limit) * URL_GROWTH,
    "xmlattr": lambda a, limit: text_size(a["d"], limit, "escaped"),
    "string": lambda a, limit: text_size(_first(a), limit),
    "tojson": _json_size,
    "pprint": lambda a, limit: _laid_out(a["value"], 1, "repr", limit),
    "batch": lambda a, limit: _int(a["linecount"]) * 8,  # the padding of the last batch: an item each
    "slice": lambda a, limit: _int(a["slices"]) * 64,  # a list per slice
}
FILTER_SIZES["e"] = FILTER_SIZES["forceescape"] = FILTER_SIZES["escape"]
STRFTIME_GROWTH = 64  # characters one character of a strftime format may become (%c: 24 for 2)
GLOBAL_SIZES: dict[str, Sizer] = {"lipsum": _lipsum,
                                  "strftime_now": lambda a, limit: text_size(a["format"], limit) * STRFTIME_GROWTH}
