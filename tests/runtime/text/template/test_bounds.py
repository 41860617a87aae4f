"""A chat template that would amplify its operands into gigabytes is refused before the work is
done: sized up front (runtime/text/template/bounds.py), not stopped by the clock or after the fact.
One that builds many values each within the bounds is stopped by the render's total budget, one
that hands a filter more items than a loop may take is refused before the filter walks them, and
a failed render frees what it built at once (the hostile ones run in a child process under a
memory limit, so a regression fails instead of taking the machine's memory)."""

from __future__ import annotations

import json
import subprocess
import sys
import tracemalloc

import pytest
from jinja2.sandbox import ImmutableSandboxedEnvironment

from specedge.core.errors import SpecEdgeError
from specedge.runtime.text.codec import TextCodec
from specedge.runtime.text.template import bounds as tb
from specedge.runtime.text.template.functions import chat_sandbox, strftime_now, tojson
from specedge.runtime.text.template.sandbox import MAX_CHARS, BoundedSandbox

PEAK_BYTES = 64 << 20  # what refusing may take: the operands, never the result

AMPLIFIERS = {  # each would take from 100 MB to several GB; the operands take at most a few MB
    "% width": "{{ '%999999999d' % 1 }}",
    "% precision": "{{ '%.999999999f' % 1.5 }}",
    "% of a list holding one string 1000 times": "{% set s = 'x' * 100000 %}{{ '%s' % ([s] * 1000,) }}",
    "format filter": "{{ '%999999999d' | format(1) }}",
    "str.format width": "{{ '{:>999999999}'.format(1) }}",
    "str.format precision": "{{ '{:.999999999f}'.format(1.5) }}",
    "str.format nested widths": "{{ ('{:>{w}}' * 8).format(1, 2, 3, 4, 5, 6, 7, 8, w=16000000) }}",
    "str.format repeating a field": "{% set s = 'x' * 1000000 %}{{ ('{0}' * 100).format(s) }}",
    "str.format_map": "{{ '{a:>999999999}'.format_map({'a': 1}) }}",
    "indent of many lines": "{{ ('x\n' * 100000) | indent(1000) }}",
    "indent by a long string": "{{ ('x\n' * 1000) | indent('y' * 100000, true) }}",
    "center": "{{ 'x' | center(999999999) }}",
    "ljust": "{{ 'x'.ljust(999999999) }}",
    "rjust": "{{ 'x'.rjust(999999999) }}",
    "zfill": "{{ '1'.zfill(999999999) }}",
    "expandtabs": "{{ ('\t' * 1000).expandtabs(100000) }}",
    "replace": "{{ ('x' * 10000).replace('x', 'y' * 10000) }}",
    "replace filter": "{{ ('x' * 10000) | replace('x', 'y' * 10000) }}",
    "str.join": "{{ ('y' * 100000).join('x' * 1000) }}",
    "join filter": "{{ ('x' * 1000) | join('y' * 100000) }}",
    "join of one string many times": "{% set s = 'x' * 1000000 %}{{ ([s] * 100) | join }}",
    "translate": "{{ ('x' * 10000).translate({120: 'y' * 10000}) }}",
    "wordwrap": "{{ ('ab ' * 10000) | wordwrap(1, wrapstring='y' * 10000) }}",
    "tojson indent": "{{ ([[1] * 100] * 100) | tojson(indent=100000) }}",
    "escape": "{% set s = '<' * 3000000 %}{{ s | e }}",
    "urlize": "{{ ('a ' * 10000) | urlize(target='y' * 10000) }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "slice": "{{ [1] | slice(1000000, fill_with=0) | list | length }}",
    "batch": "{{ [1] | batch(16000000, fill_with=0) | list | length }}",
    "printing a list holding one string 1000 times": "{% set s = 'x' * 100000 %}{{ [s] * 1000 }}",
    "~ of many operands": "{% set s = 'x' * 1000000 %}{{ " + " ~ ".join(["s"] * 100) + " }}",
    "a macro repeating a string": ("{% set s = 'x' * 1000000 %}{% macro m() %}{% for i in range(100) %}{{ s }}"
                                   "{% endfor %}{% endmacro %}{{ m() }}"),
    "Markup %, which escapes its arguments": ("{% set s = '\"' * 2000000 %}"
                                              "{{ ('%s' * 8) | safe % (s, s, s, s, s, s, s, s) }}"),
    "Markup join, which escapes its items": "{% set s = '\"' * 2000000 %}{{ ('' | safe).join([s] * 8) }}",
    "Markup replace, which escapes the new text": "{{ (('x' * 4000) | safe).replace('x', '\"' * 4000) }}",
    "a block set doubling": ("{% set ns = namespace(s='x') %}{% for i in range(40) %}{% set ns.s %}{{ ns.s }}"
                             "{{ ns.s }}{% endset %}{% endfor %}"),
    "transformers' tojson with long separators": "{{ ([0] * 100000) | tojson(separators=('x' * 100000, ':')) }}",
    "transformers' tojson with a wide indent": "{{ ([[0]] * 100000) | tojson(indent=100000) }}",
    "strftime_now of a long format": "{{ strftime_now('%c' * 1000000) }}",
}


def render(template: str) -> str:
    env = chat_sandbox()  # the environment chat templates render in: transformers' functions too
    return TextCodec._guard(lambda: env.render_bounded(env.from_string(template)))


@pytest.mark.parametrize("case", list(AMPLIFIERS))
def test_an_amplifying_template_is_refused_before_the_work(case: str) -> None:
    tracemalloc.start()
    try:
        with pytest.raises(SpecEdgeError, match="chat template was stopped") as e:
            render(AMPLIFIERS[case])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert "ran for more than" not in str(e.value)  # sized, not timed out
    assert peak < PEAK_BYTES, f"{peak / 2**20:.0f} MiB taken before the refusal"


ORDINARY = (  # every construct the bounds look at, at the sizes chat templates use
    "{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
    "{{ '<|%s|>' % m.role }}{{ '%-8s|%5.2f|%03d' % (m.role, 1.5, loop.index) }}{{ m.content | indent(2, true) }}"
    "{{ '{}: {!r} {:>6} {:,}'.format(m.role, m.content, loop.index, 1234567) }}{{ '{role}'.format_map(m) }}"
    "{{ m.content.replace('o', '0') }}{{ m.content | replace('h', 'H') }}{{ m.content.center(12, '*') }}"
    "{{ m.content.ljust(9) ~ '|' ~ m.content.rjust(9) ~ '|' ~ '7'.zfill(3) ~ 'a\tb'.expandtabs(4) }}"
    "{% set block %}[{{ m.content }}]{% endset %}{{ block }}{% endfor %}"
    "{{ messages | map(attribute='content') | join(', ') }}{{ ', '.join(['a', 'b']) }}{{ messages | tojson }}"
    "{{ messages[0] | tojson(indent=2) }}{{ 'x<y' | e }}{{ 'a&b' | urlencode }}{{ 'see http://a.b' | urlize }}"
    "{{ '%s' | format(ns.n) }}{{ [1, 2, 3] | batch(2) | list }}{{ [1, 2, 3] | slice(2) | list }}"
    "{{ messages }}{{ 'one two three four' | wordwrap(9) }}{{ 'ab'.translate({97: 'AA'}) }}{{ 4 % 3 }}"
)
MESSAGES = [{"role": "user", "content": "hello there\nsecond line"}, {"role": "assistant", "content": "hi <b>"}]


def test_ordinary_templates_render_as_jinja2_renders_them() -> None:
    plain = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    bounded = BoundedSandbox(trim_blocks=True, lstrip_blocks=True)
    expected = plain.from_string(ORDINARY).render(messages=MESSAGES)
    assert bounded.render_bounded(bounded.from_string(ORDINARY), messages=MESSAGES) == expected


def test_a_result_just_within_the_bound_renders() -> None:
    assert len(render(f"{{{{ 'x'.ljust({MAX_CHARS}) }}}}")) == MAX_CHARS


def test_a_repetition_just_within_the_bound_is_made_one_more_refused() -> None:
    """`*` may make a string of MAX_CHARS characters, not one more."""
    assert render(f"{{{{ ('x' * {MAX_CHARS}) | length }}}}") == str(MAX_CHARS)
    with pytest.raises(SpecEdgeError, match=f"would make {MAX_CHARS + 1} items"):
        render(f"{{{{ ('x' * {MAX_CHARS + 1}) | length }}}}")


def test_a_number_of_thousands_of_digits_prints_whole() -> None:
    """A number of 14,000 bits (4,215 digits, near the 4,300 Python prints) is far from a huge text:
    it prints (its bound is its digits, not many times them)."""
    assert render("{{ 2 ** 14000 }}") == str(2 ** 14000)


LIMIT = 1 << 40
TEXT = "héllo <wörld> & 'q' \"d\" \\ \t\n😀 " * 3
VALUES = [TEXT, 12345678901234567890, -1.7e308, 2.5, None, True, [TEXT, 1, [2.5, None]],
          {"a": TEXT, "3": (1, 2)}, ("x",), b"\x00\xff", "😀🎉😀"]  # JSON writes each as a surrogate pair


@pytest.mark.parametrize("value", VALUES, ids=range(len(VALUES)))
def test_text_bounds_are_never_below_the_text(value: object) -> None:
    assert tb.text_size(value, LIMIT) >= len(str(value))
    assert tb.text_size(value, LIMIT, "repr") >= max(len(repr(value)), len(ascii(value)))
    env = ImmutableSandboxedEnvironment()
    if not isinstance(value, bytes):  # not JSON
        assert tb.text_size(value, LIMIT, "escaped") >= len(env.from_string("{{ v | tojson }}").render(v=value))
    assert tb.text_size(value, LIMIT, "escaped") >= len(str(env.filters["escape"](value)))


@pytest.mark.parametrize(("fmt", "args"), [
    ("%s|%r|%a|%d|%x|%o|%e|%f|%g|%c|%%", (TEXT, TEXT, TEXT, 10**30, 10**30, 10**30, 1e300, -1.7e308, 1e-300, 65)),
    ("%-20s%*d%.*f%(k)s", {"k": TEXT}), ("%*.*f", (40, 30, 1.5)), ("%s", [TEXT] * 3), ("%s %s", (1.7e308, 2**200)),
    ("%(a)s%(a)r%(b)d", {"a": TEXT, "b": 10**50}), ("%.50d|%+#40.30x", (7, 255)), ("%10%|%d", (3,)),
])
def test_percent_bounds_are_never_below_the_result(fmt: str, args: object) -> None:
    try:
        expected = fmt % args
    except (TypeError, ValueError, KeyError):
        expected = ""
    assert tb.percent_size(fmt, args, LIMIT) >= len(expected)


@pytest.mark.parametrize(("fmt", "args", "kwargs"), [
    ("{}|{!r}|{!a}|{:>40}|{:.30f}|{:,}|{:_x}|{:e}|{:%}", (TEXT, TEXT, TEXT, TEXT, 1.5, 10**30, 10**30, 1e300, 1e300),
     {}),
    ("{0}{0}{1[0]}{k}{k!r:^{w}}", ([TEXT], "ab"), {"k": TEXT, "w": 90}), ("{:{f}{a}{w}.{p}}", (1.5,),
                                                                          {"f": "*", "a": ">", "w": 50, "p": 20}),
    ("{:,.2f}|{:08.3e}|{:#b}", (1e300, -1e-300, 2**100), {}),
])
def test_format_bounds_are_never_below_the_result(fmt: str, args: tuple[object, ...],
                                                  kwargs: dict[str, object]) -> None:
    assert tb.format_size(fmt, args, kwargs, LIMIT) >= len(fmt.format(*args, **kwargs))


@pytest.mark.parametrize(("name", "args"), [
    ("center", (50, "*")), ("ljust", (7,)), ("rjust", (300,)), ("zfill", (90,)), ("expandtabs", (13,)),
    ("expandtabs", ()), ("replace", ("l", "LLL")), ("replace", ("", "--")), ("replace", ("o", "0000", 1)),
    ("translate", ({104: "HHHH", 108: None},)), ("format", ()), ("format_map", ({},)),
])
def test_method_bounds_are_never_below_the_result(name: str, args: tuple[object, ...]) -> None:
    size = tb.method_size(TEXT, name, args, {}, LIMIT)
    assert size is not None and size >= len(getattr(TEXT, name)(*args))


@pytest.mark.parametrize(("name", "template"), [
    ("indent", "{{ v | indent(7, true, true) }}"), ("indent", "{{ v | indent('>>>', true) }}"),
    ("center", "{{ v | center(300) }}"), ("format", "{{ '%s-%r-%9d' | format(v, v, 5) }}"),
    ("replace", "{{ v | replace('l', 'LLLL') }}"), ("wordwrap", "{{ v | wordwrap(3, true, '<br>') }}"),
    ("urlize", "{{ 'www.a.com x@y.org http://b.c ' ~ v | urlize(9, true, '_blank') }}"),
    ("escape", "{{ v | escape }}"), ("forceescape", "{{ v | forceescape }}"), ("urlencode", "{{ v | urlencode }}"),
    ("xmlattr", "{{ {'a': v, 'b': 3} | xmlattr }}"), ("string", "{{ [v, 1] | string }}"),
    ("tojson", "{{ [v, {'k': [v, 1]}] | tojson(indent=5) }}"), ("pprint", "{{ [v, {'k': [v] * 30}] | pprint }}"),
])
def test_filter_bounds_are_never_below_the_result(name: str, template: str) -> None:
    """Each filter call is sized as the sandbox sizes it (its arguments bound to jinja2's names)."""
    seen: list[int] = []
    env = ImmutableSandboxedEnvironment()
    original = env.filters[name]

    def sizing(*args: object, **kwargs: object) -> object:
        out = original(*args, **kwargs)
        size = tb.call_size(tb.FILTER_SIZES, name, original, args, kwargs, LIMIT)
        assert size is not None and size >= len(out), (size, len(out))
        seen.append(size)
        return out

    if hasattr(original, "jinja_pass_arg"):  # jinja2 passes the context as the original wants it
        sizing.jinja_pass_arg = original.jinja_pass_arg  # type: ignore[attr-defined]
    env.filters[name] = sizing
    env.from_string(template).render(v=TEXT)
    assert seen


@pytest.mark.parametrize("kwargs", [{}, {"indent": 3}, {"separators": (" ,  ", " :: ")}, {"ensure_ascii": True},
                                    {"indent": "\t\t", "separators": (",", ":"), "sort_keys": True}])
def test_transformers_tojson_bound_is_never_below_the_result(kwargs: dict[str, object]) -> None:
    value = [TEXT, {"k": [TEXT, 1, None], "z": {"y": 2.5}}] * 5
    size = tb.call_size(tb.FILTER_SIZES, "tojson", tojson, (value,), kwargs, LIMIT)
    assert size is not None and size >= len(tojson(value, **kwargs))  # type: ignore[arg-type]


def test_strftime_now_bound_is_never_below_the_result() -> None:
    fmt = "%c %A %B %x %X %Z %% %j" * 3
    size = tb.call_size(tb.GLOBAL_SIZES, "strftime_now", strftime_now, (fmt,), {}, LIMIT)
    assert size is not None and size >= len(strftime_now(fmt))


def test_lipsum_bound_is_never_below_the_result() -> None:
    from jinja2.utils import generate_lorem_ipsum

    for kwargs in ({}, {"n": 3, "html": False}, {"n": 2, "min": 5, "max": 300}):
        size = tb.call_size(tb.GLOBAL_SIZES, "lipsum", generate_lorem_ipsum, (), kwargs, LIMIT)
        assert size is not None and size >= len(generate_lorem_ipsum(**kwargs))


CHILD = """
import gc, json, resource, sys, time
limit = int(sys.argv[1])
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
gc.disable()  # what a failed render built must go by reference counting alone, as in a server between collections
from specedge.core.errors import SpecEdgeError
from specedge.runtime.text.template.sandbox import BoundedSandbox
from specedge.runtime.text.codec import TextCodec

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

env = BoundedSandbox()
start, results = rss(), []
for source in json.loads(sys.argv[2]):
    template = env.from_string(source)
    began = time.monotonic()
    try:
        TextCodec._guard(lambda: env.render_bounded(template))
        message = "rendered"
    except SpecEdgeError as e:
        message = str(e)
    results.append([time.monotonic() - began, message])
with open("/proc/self/status") as f:  # VmHWM: this process's peak (ru_maxrss would keep the parent's from fork)
    peak = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) * 1024
print(json.dumps({"start": start, "end": rss(), "peak": peak, "results": results}))
"""
ADDRESS_SPACE = 3 << 30  # the child's memory limit: the old code took gigabytes for what follows
GROWTH_BYTES = 256 << 20  # what a render may take from the process at its peak, and what may stay


def render_in_child(templates: list[str], timeout: float = 60) -> dict[str, object]:
    """Render each template (once each) through TextCodec._guard in a child process under
    ADDRESS_SPACE with no garbage collection: its RSS at start, at end and at its peak, and
    (seconds, message) per render."""
    proc = subprocess.run([sys.executable, "-c", CHILD, str(ADDRESS_SPACE), json.dumps(templates)],
                          capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    report: dict[str, object] = json.loads(proc.stdout)
    return report


MANY_VALUES = ("{% set ns = namespace(items=[]) %}{% for i in range(100000) %}"  # each string within MAX_CHARS
               "{% set ns.items = ns.items + ['x'.ljust(16000000)] %}{% endfor %}{{ ns.items | length }}")


def test_renders_that_build_many_values_are_stopped_and_free_what_they_built() -> None:
    """12 requests with a template that builds 16M-character strings into a list: each is stopped
    by the render's total budget (not after 2 s and gigabytes), and what it built is freed at once
    (the old code kept each failed render's frames alive through the error's traceback)."""
    report = render_in_child([MANY_VALUES] * 12)
    for _, message in report["results"]:  # type: ignore[attr-defined]
        assert "chat template was stopped: it built more than" in message, message  # the budget, not the clock
    start, end, peak = report["start"], report["end"], report["peak"]
    assert end - start < GROWTH_BYTES, f"{start / 2**20:.0f} MiB at start, {end / 2**20:.0f} MiB after 12 renders"
    assert peak - start < GROWTH_BYTES, f"{start / 2**20:.0f} MiB at start, {peak / 2**20:.0f} MiB at the peak"


WALKED = "('jihgfedcba' * 1600000)"  # 16M characters: a string within MAX_CHARS, and a list of them
WALKING = {  # each ran from 5 s to 74 s (the clock cannot stop one step) or took gigabytes
    "sort of a long string": f"{{{{ {WALKED} | sort | length }}}}",
    "min of a long list": f"{{{{ {WALKED} | list | min }}}}",
    "unique of a long string": f"{{{{ {WALKED} | unique | list | length }}}}",
    "batch of a long list": f"{{{{ {WALKED} | list | batch(2) | list | length }}}}",
    "tojson of a list shared many times": "{% set l = [1] * 100000 %}{{ ([l] * 100000) | tojson | length }}",
}


def test_a_filter_given_more_items_than_a_loop_may_take_is_refused_at_once() -> None:
    report = render_in_child(list(WALKING.values()))
    for case, (_, message) in zip(WALKING, report["results"], strict=True):  # type: ignore[call-overload]
        assert "chat template was stopped" in message, (case, message)
        assert "ran for more than" not in message, (case, message)  # refused before it runs, not by the clock
    assert report["peak"] - report["start"] < GROWTH_BYTES  # type: ignore[operator]


def test_ordinary_filters_of_a_conversation_still_render() -> None:
    env = BoundedSandbox()
    source = ("{{ messages | map(attribute='role') | unique | sort | join(',') }}|{{ messages | length }}|"
              "{{ messages | selectattr('role', 'equalto', 'user') | list | length }}|{{ (m * 1000) | min }}")
    template = env.from_string(source)
    assert env.render_bounded(template, messages=MESSAGES * 500, m="hello") == "assistant,user|1000|500|e"
