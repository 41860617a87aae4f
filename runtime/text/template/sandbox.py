"""The chat template's sandbox: jinja2's immutable sandbox, bounded at every call, attribute, loop
item, operator and piece of output (sizes computed before a value is built: bounds.py), and the
errors and clean-up of a render that fails."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator
from functools import wraps
from types import FrameType, TracebackType
from typing import Any, TypeVar

from jinja2 import Template, nodes
from jinja2.compiler import CodeGenerator, Frame
from jinja2.runtime import Context
from jinja2.sandbox import ImmutableSandboxedEnvironment, SecurityError

from specedge.core.errors import SpecEdgeError
from specedge.runtime.text.template.bounds import (
    FILTER_SIZES,
    GLOBAL_SIZES,
    call_size,
    method_size,
    percent_size,
    text_size,
)

T = TypeVar("T")

# A chat template is code from the model's publisher: it runs sandboxed (no attribute starting
# with _, no mutation of lists or dicts) and bounded, checked at every call, attribute, loop item,
# operator and piece of output it makes; what a call, filter or operator would make is sized
# before it runs (runtime/text/template/bounds.py), so a huge string is refused, never built. A render
# has a total budget too, of time and of what it builds (every string, list or slice it makes,
# counted as made), so many values each within the bounds cannot add up to gigabytes; and a
# render that fails frees what it built at once (release), not at the next garbage collection.
RENDER_SECONDS = 2.0  # a chat template renders in milliseconds
MAX_ITEMS = 100_000  # items of one range() or one loop
MAX_CHARS = 1 << 24  # characters of the rendered text, or of one string or list the template builds
MAX_RENDER_CHARS = 1 << 26  # characters and items of all the values one render builds
MAX_NUMBER = 1 << 24  # a larger integer passed to a function or filter (a width, a count) is refused
MAX_POWER_BITS = 1 << 16  # bits of the result of **
SEQUENCES = (str, list, tuple)
CONTAINERS = (list, tuple, dict, set, frozenset)
WALKERS = frozenset({  # filters that take a string's characters one at a time, in Python
    "batch", "dictsort", "groupby", "join", "map", "max", "min", "reject", "rejectattr", "select", "selectattr",
    "sort", "sum", "unique"})


class TemplateLimit(SecurityError):
    """A chat template went past one of the bounds above."""


class BoundedCodeGenerator(CodeGenerator):
    """Compiles every {% for %} to iterate through environment.bounded_iter, and every ~ to size
    its operands through environment.bounded_pieces before it joins them."""

    def visit_For(self, node: nodes.For, frame: Frame) -> None:
        node.iter = nodes.Call(nodes.EnvironmentAttribute("bounded_iter"), [node.iter], [], None, None)
        super().visit_For(node, frame)

    def visit_Concat(self, node: nodes.Concat, frame: Frame) -> None:  # jinja2's, the operands sized first
        if frame.eval_ctx.volatile:
            join = "(markup_join if context.eval_ctx.volatile else str_join)"
        else:
            join = "markup_join" if frame.eval_ctx.autoescape else "str_join"
        self.write(f"{join}(environment.bounded_pieces((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write(")))")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """A sandbox whose rendering is bounded in time and size: a template that loops for long, or
    builds a huge string, is stopped with TemplateLimit instead of hanging or exhausting memory."""

    code_generator_class = BoundedCodeGenerator
    intercepted_binops = frozenset({"*", "**", "+", "%"})  # also keeps them from being folded at compile time

    def __init__(self, **options: Any) -> None:
        super().__init__(finalize=self.bounded_output, **options)
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.built = 0  # characters and items the current render has made
        self.globals["range"] = self.bounded_range
        self.filters = {name: self.bounded_filter(name, f) for name, f in self.filters.items()}

    def render_bounded(self, template: Template, **variables: Any) -> str:
        self.deadline = time.monotonic() + RENDER_SECONDS
        self.built = 0
        pieces, size = [], 0
        for piece in template.generate(**variables):
            size += len(piece)
            if size > MAX_CHARS:
                raise TemplateLimit(f"its output passed {MAX_CHARS} characters")
            self.tick()
            self.charge(len(piece))
            pieces.append(piece)
        return "".join(pieces)

    def tick(self) -> None:
        if time.monotonic() > self.deadline:
            raise TemplateLimit(f"it ran for more than {RENDER_SECONDS:g} s")

    def charge(self, size: int) -> None:
        """Count `size` characters or items the render makes against its total budget."""
        self.built += size
        if self.built > MAX_RENDER_CHARS:
            raise TemplateLimit(f"it built more than {MAX_RENDER_CHARS} characters and items in all")

    def charged(self, value: T) -> T:
        """A value the render has just made, once counted against its total budget."""
        self.charge(built_size(value))
        return value

    def bounded_iter(self, iterable: Iterable[Any]) -> Iterator[Any]:
        for i, item in enumerate(iterable):
            if i >= MAX_ITEMS:
                raise TemplateLimit(f"a loop ran past {MAX_ITEMS} items")
            self.tick()
            yield item

    def refuse_over(self, size: int | None, what: str) -> None:
        """Stop the template before it makes `size` characters (or items), if that is too many."""
        if size is not None and size > MAX_CHARS:
            raise TemplateLimit(f"{what} would make {size} characters, more than {MAX_CHARS}")

    def bounded_pieces(self, pieces: tuple[Any, ...]) -> tuple[Any, ...]:
        """The operands of ~, once their text is known to fit."""
        self.tick()
        total = 0
        for piece in pieces:
            total += text_size(piece, MAX_CHARS - total)
            self.refuse_over(total, "~")
        self.charge(total)  # what their join will make
        return pieces

    def bounded_output(self, value: Any) -> Any:
        """Every {{ value }}, before it is made text: a list holding one long string 1,000 times is 16 GB of it."""
        self.refuse_over(text_size(value, MAX_CHARS), "printing a value")
        return value

    def concat(self, pieces: Iterable[str]) -> str:  # type: ignore[override]
        """The join of a block's output ({% set %}...{% endset %}, a macro, {% filter %}), sized first."""
        parts, total = [], 0
        for piece in pieces:
            total += len(piece)
            self.refuse_over(total, "a block")
            parts.append(piece)
        return self.charged("".join(parts))

    def bounded_join(self, items: Iterable[Any], separator: object, escaped: bool = False) -> Iterator[Any]:
        """The items of a join, their text counted as they come (escaped: as a Markup join
        escapes them): join takes them all, then allocates the result, so a sum past the bound
        stops it before the allocation."""
        step = text_size(separator, MAX_CHARS)
        total = 0
        for item in items:
            total += text_size(item, MAX_CHARS - total, "escaped" if escaped else "str") + step
            self.refuse_over(total, "join")
            self.tick()
            yield item

    def bounded_range(self, *args: int) -> range:
        items = range(*args)
        try:
            items[MAX_ITEMS]  # len() of a huge range overflows; indexing does not
        except IndexError:
            return items
        raise TemplateLimit(f"range{args} has more than {MAX_ITEMS} items")

    def check_numbers(self, name: str, args: Iterable[object]) -> None:
        for value in args:
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_NUMBER:
                raise TemplateLimit(f"{name} was given {value}, more than the {MAX_NUMBER} a template may ask for")

    def check_items(self, name: str, f: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Stop a filter given more items than a loop may take (a list, tuple, dict or set, or the
        string it walks): it walks them in one step, which the clock cannot stop (min of 16M items: 70 s)."""
        lead = 1 if hasattr(f, "jinja_pass_arg") else 0  # the context before the value
        value = args[lead] if len(args) > lead else None
        for arg in (*args[lead:], *kwargs.values()):
            walked = isinstance(arg, CONTAINERS) or (arg is value and isinstance(arg, str) and name in WALKERS)
            if walked and len(arg) > MAX_ITEMS:
                raise TemplateLimit(f"filter {name} was given {len(arg)} items, more than the {MAX_ITEMS} a loop "
                                    "may take")

    def bounded_filter(self, name: str, f: Callable[..., Any]) -> Callable[..., Any]:
        @wraps(f)  # keeps jinja2's pass_context / pass_environment marks
        def bounded(*args: Any, **kwargs: Any) -> Any:
            self.tick()
            self.check_items(name, f, args, kwargs)
            self.check_numbers(f"filter {name}", [*args[1:], *kwargs.values()])  # args[0]: the value or context
            self.refuse_over(call_size(FILTER_SIZES, name, f, args, kwargs, MAX_CHARS), f"filter {name}")
            if name == "join":
                args, kwargs = self.counted_join(f, args, kwargs)
            out = f(*args, **kwargs)
            if isinstance(out, SEQUENCES) and len(out) > MAX_CHARS:
                raise TemplateLimit(f"filter {name} made {len(out)} items")
            return self.charged(out)

        return bounded

    def wrap_str_format(self, value: Any) -> Callable[..., str] | None:
        """jinja2's sandboxed str.format and str.format_map (jinja2 >= 3.1.5 wraps them when the
        attribute is read, so `call` never sees them), sized before they run."""
        wrapped = super().wrap_str_format(value)
        if wrapped is None:
            return None
        text, name = value.__self__, value.__name__

        @wraps(wrapped)
        def bounded(*args: Any, **kwargs: Any) -> str:
            self.refuse_over(method_size(text, name, args, kwargs, MAX_CHARS), f"str.{name}")
            return wrapped(*args, **kwargs)

        return bounded

    def counted_join(self, f: Callable[..., Any], args: tuple[Any, ...],
                     kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        """The join filter's arguments, its items passed through bounded_join."""
        lead = 1 if hasattr(f, "jinja_pass_arg") else 0  # the eval context before the value
        if len(args) <= lead:
            return args, kwargs
        separator = args[lead + 1] if len(args) > lead + 1 else kwargs.get("d", "")
        escaped = bool(lead and getattr(args[0], "autoescape", False))  # in {% autoescape %}: items escaped
        return (*args[:lead], self.bounded_join(args[lead], separator, escaped), *args[lead + 1:]), kwargs

    def call(__self, __context: Context, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        __self.tick()
        if __obj is not __self.globals["range"]:  # range bounds its own items
            __self.check_numbers(getattr(__obj, "__name__", "a call"), [*args, *kwargs.values()])
        name = getattr(__obj, "__name__", "")
        text = getattr(__obj, "__self__", None)
        if isinstance(text, str) and getattr(str, name, None) is not None:  # a str method: 'x'.center(9)
            __self.refuse_over(method_size(text, name, args, kwargs, MAX_CHARS), f"str.{name}")
            if name == "join" and args:
                args = (__self.bounded_join(args[0], text, escaped=hasattr(text, "__html__")), *args[1:])
        for key in GLOBAL_SIZES:
            if __obj is __self.globals.get(key):
                __self.refuse_over(call_size(GLOBAL_SIZES, key, __obj, args, kwargs, MAX_CHARS), key)
        out = super().call(__context, __obj, *args, **kwargs)
        if isinstance(out, SEQUENCES) and len(out) > MAX_CHARS:
            raise TemplateLimit(f"a call made {len(out)} items")
        return __self.charged(out)

    def getattr(self, obj: Any, attribute: str) -> Any:
        self.tick()
        return super().getattr(obj, attribute)

    def getitem(self, obj: Any, argument: Any) -> Any:
        self.tick()
        item = super().getitem(obj, argument)
        return self.charged(item) if isinstance(argument, slice) else item  # a slice is a new value; an item is not

    def call_binop(self, context: Context, operator: str, left: Any, right: Any) -> Any:
        self.tick()
        if (size := result_size(operator, left, right)) > MAX_CHARS:
            raise TemplateLimit(f"{operator} would make {size} items")
        if operator == "%" and isinstance(left, str):
            self.refuse_over(percent_size(left, right, MAX_CHARS), "%")
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and right > 0 \
                and left.bit_length() * right > MAX_POWER_BITS:
            raise TemplateLimit(f"{left} ** {right} is too large")
        return self.charged(super().call_binop(context, operator, left, right))


def built_size(value: object) -> int:
    """What a value just made counts against a render's budget: its characters or items."""
    return len(value) if isinstance(value, (*SEQUENCES, dict, set, frozenset)) else 0


def result_size(operator: str, left: object, right: object) -> int:
    """Items of the string, list or tuple `left operator right` makes (0: not one)."""
    if operator == "+" and isinstance(left, SEQUENCES) and isinstance(right, SEQUENCES):
        return len(left) + len(right)
    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, SEQUENCES) and isinstance(n, int):
                return len(seq) * n
    return 0


class ChatTemplateError(SpecEdgeError):
    """A chat the model's template cannot render (none, or it failed): the way round it is raw text,
    which each front end names its own way (`advise`)."""

    RAW = "pass the raw prompt instead of chat messages"

    def __init__(self, problem: str, template_fault: bool = True) -> None:
        self.template_fault = template_fault
        super().__init__(problem, self.fix_text(self.RAW))

    def fix_text(self, raw: str) -> str:
        return f"{raw}, or fix the template" if self.template_fault else raw

    def advise(self, raw: str) -> SpecEdgeError:
        """This error with the front end's own way to send raw text (`drop --chat`, a field)."""
        return SpecEdgeError(self.problem, self.fix_text(raw))


def template_error(e: Exception) -> SpecEdgeError:
    """What a chat template raised, as one clear error."""
    if isinstance(e, SpecEdgeError):  # raise_exception: the template's own words
        return e
    if isinstance(e, TemplateLimit):
        return ChatTemplateError(f"the model's chat template was stopped: {e}")
    return ChatTemplateError(f"the model's chat template failed to render ({type(e).__name__}: {e})")


def release(error: BaseException | None) -> None:
    """Free what a failed render built, now: the frames of the error's traceback (and of the
    errors chained to it) hold the template's variables in reference cycles, which only a
    garbage collection would free, gigabytes staying with an idle process meanwhile."""
    while error is not None:
        clear_frames(error.__traceback__)
        chained = error.__cause__ or error.__context__
        error.__traceback__ = error.__cause__ = error.__context__ = None
        error = chained


def clear_frames(tb: TracebackType | None) -> None:
    """Drop the variables of each finished frame of a traceback and of the frames that called
    them (jinja2's rewritten traceback holds the real one in such a caller), up to the first
    frame still running: the caller of the render."""
    cleared: set[int] = set()
    while tb is not None:
        frame: FrameType | None = tb.tb_frame
        while frame is not None and id(frame) not in cleared:
            caller = frame.f_back
            try:
                frame.clear()
            except RuntimeError:  # still running
                break
            cleared.add(id(frame))
            frame = caller
        tb = tb.tb_next
