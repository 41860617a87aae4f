"""Mutation testing of our own: plant one small change at a time in chosen modules (an operator
flipped, a constant off by one, a boolean flipped, a keyword argument dropped, two arguments swapped,
a condition negated, the other branch of an `x if c else y`, a call statement removed, `min` for
`max`), run the default tests that cover the changed line, and report the mutants no test notices.

    .venv/bin/python scripts/mutants.py coverage           # per-test coverage of MODULES, once (~6 min)
    .venv/bin/python scripts/mutants.py run                # the campaign: docs/mutants.json, docs/mutants.md
    .venv/bin/python scripts/mutants.py run --module runtime/gamma.py --per-module 0   # every mutant of one
    .venv/bin/python scripts/mutants.py show ID            # a mutant's diff and the tests that cover it
    .venv/bin/python scripts/mutants.py run --id ID --tests tests/kernels/test_sampling.py   # one mutant, given tests
    .venv/bin/python scripts/mutants.py run --id ID --tests NODEID --record   # a survivor a new test kills, recorded

`coverage` runs the default set once under coverage.py, switching coverage's context at every test
(setup, call and teardown), and keeps for each line of MODULES the tests that ran it, and every
test's time (.mutants/coverage.json; `run` refuses it once a module has changed). `run` lists every
mutant of each module, keeps those on lines some test runs, samples `--per-module` of them per
module with `--seed`, and runs each in its own pytest process: the module is compiled from the
mutated source by an import hook (.mutants/hook/sitecustomize.py, on PYTHONPATH, so the processes a
test starts see the mutant too; nothing in the checkout is written), the covering tests in order of
their time, stopping at the first failure (`-x`). A mutant is killed when a test fails (or the tests
do not even load), survives when they all pass, and counts as killed by timeout when they take
more than 3x their time in the coverage run plus 30 s. A mutant at module or class level (a
constant, a dataclass default) runs every test that covers its module; a default argument's, the
tests that cover its function. Survivors are matched against scripts/mutants_explained.toml
(equivalent mutants and behaviour not promised, each with why) and listed in docs/mutants.md.

Limits: coverage is measured in the pytest process (threads included), not in the processes tests
start (the CLI and `specedge serve` run as commands), so a line only those run counts as uncovered;
strings are not mutated; lines marked `# pragma: no mutate` and asserts are skipped.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import hashlib
import io
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import tokenize
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / ".mutants"
HOOK = WORK / "hook"
COVERAGE = WORK / "coverage.json"
CACHE = WORK / "cache"  # the tests' exports (SmolLM2), apart from the user's cache: no cleanup there removes them
RESULTS = ROOT / "docs" / "mutants.json"
REPORT = ROOT / "docs" / "mutants.md"
EXPLAINED = ROOT / "scripts" / "mutants_explained.toml"

# the round; the acceptance rules and sampling; the doors; the template path; the exporter's per-family code
MODULES = [
    "runtime/round/decoding.py", "runtime/round/drafters.py", "runtime/round/gamma.py",
    "kernels/acceptance.py", "kernels/sampling.py", "kernels/laws.py", "kernels/noise.py",
    "specedge/api.py", "specedge/chat.py", "specedge/serve/app.py", "specedge/serve/protocol.py",
    "specedge/serve/responses.py", "specedge/serve/structured.py",
    "runtime/text/codec.py", "runtime/text/tools.py", "runtime/text/reasoning.py",
    "runtime/text/template/bounds.py", "runtime/text/template/functions.py", "runtime/text/template/options.py",
    "runtime/text/template/sandbox.py",
    "export/source_config.py", "export/gguf_source.py", "export/hf_source.py", "export/decoder_graph.py",
]
SUBPACKAGES = ("core", "export", "runtime", "kernels", "models", "device_profiles")  # pyproject's package-dir
PER_MODULE = 10
SEED = 67


def module_name(path: str) -> str:
    """The import name of a module of this repository: runtime/text.py is specedge.runtime.text."""
    dotted = path.removesuffix(".py").replace("/", ".")
    return "specedge." + dotted if path.split("/")[0] in SUBPACKAGES else dotted


# -- mutants -----------------------------------------------------------------------------------------

COMPARE = {ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==", ast.NotEq: "!=",
           ast.In: "in", ast.NotIn: "not in", ast.Is: "is", ast.IsNot: "is not"}
COMPARE_SWAP = {"<": "<=", "<=": "<", ">": ">=", ">=": ">", "==": "!=", "!=": "==", "in": "not in",
                "not in": "in", "is": "is not", "is not": "is"}
BINOP = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.FloorDiv: "//", ast.Mod: "%",
         ast.Pow: "**", ast.LShift: "<<", ast.RShift: ">>", ast.BitOr: "|", ast.BitXor: "^", ast.BitAnd: "&"}
BINOP_SWAP = {"+": "-", "-": "+", "*": "/", "/": "*", "//": "*", "%": "//", "**": "*", "<<": ">>",
              ">>": "<<", "|": "&", "&": "|", "^": "|"}

# calls whose positional arguments commute: swapping them is no mutant
COMMUTATIVE = {"min", "max", "maximum", "minimum", "union1d", "intersect1d", "add", "multiply", "logaddexp",
               "array_equal", "hypot", "gcd", "fmax", "fmin"}


@dataclasses.dataclass(frozen=True)
class Mutant:
    module: str          # path in the repository
    scope: str           # the enclosing function or class (dotted), or <module>
    start: int           # character offsets in the source of the text replaced
    end: int
    replacement: str
    line: int
    lines: tuple[int, ...]      # the lines whose tests run it
    fallback: str               # where to look when no test covers `lines`: "none", "function" or "module"
    function_lines: tuple[int, ...]
    uses: tuple[int, ...]       # a module-level name's value: the lines that read the name
    before: str          # the text replaced and its replacement, as the report shows them
    after: str
    occurrence: int = 0  # among mutants of the same scope, before and after

    @property
    def mutation(self) -> str:
        return f"`{self.before}` → `{self.after}`"

    @property
    def key(self) -> str:
        return f"{self.module}::{self.scope}::{self.before}→{self.after}#{self.occurrence}"

    @property
    def id(self) -> str:
        return Path(self.module).stem + "-" + hashlib.sha1(self.key.encode()).hexdigest()[:6]

    def apply(self, source: str) -> str:
        return source[:self.start] + self.replacement + source[self.end:]


def short(text: str, width: int = 70) -> str:
    one = " ".join(text.split())
    return one if len(one) <= width else one[:width - 1] + "…"


class Planter(ast.NodeVisitor):
    """Every mutant of one module's source."""

    def __init__(self, module: str, source: str) -> None:
        self.module, self.source = module, source
        self.lines = source.splitlines(keepends=True)
        self.starts = [0]
        for line in self.lines:
            self.starts.append(self.starts[-1] + len(line))
        self.scope: list[str] = []
        self.function: list[ast.AST] = []   # the enclosing function definitions
        self.in_body: list[bool] = []       # whether the visit is inside the innermost function's body
        self.skip_lines = {i + 1 for i, line in enumerate(self.lines) if "pragma: no mutate" in line}
        self.reads: dict[str, set[int]] = defaultdict(set)   # name -> the lines that read it
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
                self.reads[node.id].add(node.lineno)
        self.uses: tuple[int, ...] = ()
        self.found: list[Mutant] = []

    # positions: ast columns are UTF-8 byte offsets
    def offset(self, line: int, col: int) -> int:
        text = self.lines[line - 1].encode()[:col].decode()
        return self.starts[line - 1] + len(text)

    def span(self, node: ast.AST) -> tuple[int, int]:
        return self.offset(node.lineno, node.col_offset), self.offset(node.end_lineno, node.end_col_offset)

    def text(self, node: ast.AST) -> str:
        a, b = self.span(node)
        return self.source[a:b]

    def add(self, node: ast.AST, start: int, end: int, replacement: str, before: str | None = None,
            after: str | None = None) -> None:
        if node.lineno in self.skip_lines:
            return
        function = self.function[-1] if self.function else None
        if function is not None and self.in_body[-1]:
            fallback = "none"       # its own lines' tests, or none
        elif function is not None:   # a default argument or a decorator: the function's tests
            fallback = "function"
        else:                        # run at import: every test of the module
            fallback = "module"
        function_lines: tuple[int, ...] = ()
        if function is not None:
            body = function.body  # type: ignore[attr-defined]
            function_lines = tuple(range(body[0].lineno, body[-1].end_lineno + 1))
        own = tuple(range(node.lineno, node.end_lineno + 1))
        if function is not None and not self.in_body[-1]:
            own = ()   # evaluated when the function is defined: no test's context covers it
        mutated = self.source[start:end]
        self.found.append(Mutant(
            module=self.module, scope=".".join(self.scope) or "<module>", start=start, end=end,
            replacement=replacement, line=node.lineno, lines=own, fallback=fallback, uses=self.uses,
            function_lines=function_lines,
            before=short(before if before is not None else mutated),
            after=short(after if after is not None else replacement)))

    def operator_between(self, left_end: int, right_start: int, expected: str) -> tuple[int, int] | None:
        """The offsets of the operator `expected` (one or two tokens) between two operands, if the
        text between them holds nothing else but brackets, spaces and comments."""
        segment = self.source[left_end:right_start]
        rows = segment.splitlines(keepends=True)
        row_starts = [0]
        for row in rows:
            row_starts.append(row_starts[-1] + len(row))
        found: list[tokenize.TokenInfo] = []
        try:
            for tok in tokenize.generate_tokens(io.StringIO(segment).readline):
                if tok.type in (tokenize.OP, tokenize.NAME) and tok.string not in "()[]{}":
                    found.append(tok)
        except (tokenize.TokenError, IndentationError, SyntaxError):
            pass
        if " ".join(t.string for t in found) != expected or not found:
            return None
        first, last = found[0], found[-1]
        a = left_end + row_starts[first.start[0] - 1] + first.start[1]
        b = left_end + row_starts[last.end[0] - 1] + last.end[1]
        return a, b

    # scopes
    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        self.function.append(node)
        self.in_body.append(False)
        self.visit(node.args)   # decorators are not mutated: dataclass(frozen=True) and such are structure
        self.scope.append(node.name)
        self.in_body[-1] = True
        for statement in node.body:
            self.visit(statement)
        self.scope.pop()
        self.in_body.pop()
        self.function.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.scope.append(node.name)
        # a class body runs at import: its own function stack is empty
        saved = self.function, self.in_body
        self.function, self.in_body = [], []
        for statement in node.body:
            self.visit(statement)
        self.function, self.in_body = saved
        self.scope.pop()

    def visit_arguments(self, node: ast.arguments) -> None:
        for default in [*node.defaults, *[d for d in node.kw_defaults if d is not None]]:
            self.visit(default)   # annotations are not evaluated (from __future__ import annotations)

    def visit_Assign(self, node: ast.Assign) -> None:
        """A module-level constant runs the tests of the lines that read it."""
        names = [t.id for t in node.targets if isinstance(t, ast.Name)]
        if self.scope or not names:
            self.generic_visit(node)
            return
        self.uses = tuple(sorted(set().union(*(self.reads[n] for n in names)) - {node.lineno}))
        self.generic_visit(node)
        self.uses = ()

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        if node.value is not None:
            self.visit(node.value)

    def visit_Assert(self, node: ast.Assert) -> None:
        pass

    def visit_Expr(self, node: ast.Expr) -> None:
        value = node.value
        if isinstance(value, ast.Constant):   # a docstring
            return
        if isinstance(value, ast.Call):
            a, b = self.span(node)
            self.add(node, a, b, "pass", after="pass")
        self.generic_visit(node)

    def visit_If(self, node: ast.If) -> None:
        test = self.text(node.test)
        if test in ("TYPE_CHECKING", '__name__ == "__main__"'):
            return
        # a negation that another mutant already makes (`==` to `!=`, `not x` to `x`) is left out
        negated = (isinstance(node.test, ast.Compare) and len(node.test.ops) == 1
                   and not isinstance(node.test.ops[0], ast.Lt | ast.LtE | ast.Gt | ast.GtE))
        if not negated and not (isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not)):
            a, b = self.span(node.test)
            self.add(node.test, a, b, f"not ({test})")
        self.generic_visit(node)

    def visit_IfExp(self, node: ast.IfExp) -> None:
        a, b = self.span(node)
        body, orelse = self.text(node.body), self.text(node.orelse)
        self.add(node, a, b, f"{orelse} if {self.text(node.test)} else {body}")
        self.generic_visit(node)

    def visit_Break(self, node: ast.Break) -> None:
        self.add(node, *self.span(node), "continue")

    def visit_Continue(self, node: ast.Continue) -> None:
        self.add(node, *self.span(node), "break")

    def visit_Compare(self, node: ast.Compare) -> None:
        left = node.left
        for op, right in zip(node.ops, node.comparators, strict=True):
            symbol = COMPARE[type(op)]
            where = self.operator_between(self.span(left)[1], self.span(right)[0], symbol)
            if where is not None:
                new = COMPARE_SWAP[symbol]
                self.add(node, *where, new, before=self.pair(left, symbol, right), after=self.pair(left, new, right))
            left = right
        self.generic_visit(node)

    def is_text(self, node: ast.AST) -> bool:
        return isinstance(node, ast.JoinedStr) or (isinstance(node, ast.Constant)
                                                   and isinstance(node.value, str | bytes))

    def pair(self, left: ast.AST, symbol: str, right: ast.AST) -> str:
        return f"{short(self.text(left), 30)} {symbol} {short(self.text(right), 30)}"

    def visit_BinOp(self, node: ast.BinOp) -> None:
        symbol = BINOP.get(type(node.op))
        if symbol and not (self.is_text(node.left) or self.is_text(node.right)):
            where = self.operator_between(self.span(node.left)[1], self.span(node.right)[0], symbol)
            if where is not None:
                new = BINOP_SWAP[symbol]
                mutated = self.source[self.span(node)[0]:where[0]] + new + self.source[where[1]:self.span(node)[1]]
                self.add(node, *where, new, before=self.text(node), after=mutated)
        self.generic_visit(node)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        symbol = BINOP.get(type(node.op))
        if symbol and not self.is_text(node.value):
            where = self.operator_between(self.span(node.target)[1], self.span(node.value)[0], symbol + "=")
            if where is not None:
                self.add(node, *where, BINOP_SWAP[symbol] + "=", before=self.text(node),
                         after=self.source[self.span(node)[0]:where[0]] + BINOP_SWAP[symbol] + "="
                         + self.source[where[1]:self.span(node)[1]])
        self.generic_visit(node)

    def visit_BoolOp(self, node: ast.BoolOp) -> None:
        symbol = "and" if isinstance(node.op, ast.And) else "or"
        for left, right in zip(node.values, node.values[1:], strict=False):
            where = self.operator_between(self.span(left)[1], self.span(right)[0], symbol)
            if where is not None:
                new = "or" if symbol == "and" else "and"
                self.add(node, *where, new, before=self.pair(left, symbol, right), after=self.pair(left, new, right))
        self.generic_visit(node)

    def visit_UnaryOp(self, node: ast.UnaryOp) -> None:
        if isinstance(node.op, ast.Not | ast.USub) and not isinstance(node.operand, ast.Constant):
            a, b = self.span(node)
            self.add(node, a, b, self.text(node.operand))
        self.generic_visit(node)

    def visit_Constant(self, node: ast.Constant) -> None:
        value = node.value
        if isinstance(value, bool):
            new = repr(not value)
        elif isinstance(value, int):
            new = "0" if value == 1 else repr(value + 1)
        elif isinstance(value, float):
            new = repr(value + 1.0)
        else:
            return
        self.add(node, *self.span(node), new)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("min", "max"):
            a, b = self.span(func)
            self.add(node, a, b, "max" if func.id == "min" else "min", before=short(self.text(node)),
                     after=short(("max" if func.id == "min" else "min") + self.text(node)[3:]))
        arguments = sorted([*node.args, *node.keywords], key=lambda n: (n.lineno, n.col_offset))
        for i, keyword in enumerate(arguments):
            if not isinstance(keyword, ast.keyword) or keyword.arg is None:
                continue
            if i > 0:   # from the end of the argument before it
                a, b = self.span(arguments[i - 1])[1], self.span(keyword)[1]
            elif len(arguments) > 1:
                a, b = self.span(keyword)[0], self.span(arguments[1])[0]
            else:
                a, b = self.span(keyword)
            self.add(node, a, b, "", before=f"{short(self.text(func), 30)}(..., {short(self.text(keyword), 40)})",
                     after=f"{short(self.text(func), 30)}(...)")
        positional = [arg for arg in node.args if not isinstance(arg, ast.Starred)]
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        if len(positional) == len(node.args) and name not in COMMUTATIVE:
            for left, right in itertools.pairwise(positional):
                lt, rt = self.text(left), self.text(right)
                if lt == rt:
                    continue
                a, b = self.span(left)[0], self.span(right)[1]
                middle = self.source[self.span(left)[1]:self.span(right)[0]]
                call = short(self.text(func), 30)
                self.add(node, a, b, rt + middle + lt, before=f"{call}({short(lt, 25)}, {short(rt, 25)})",
                         after=f"{call}({short(rt, 25)}, {short(lt, 25)})")
        self.generic_visit(node)


def plant(module: str) -> list[Mutant]:
    """Every mutant of `module` that compiles, each with its occurrence among its scope's alike."""
    source = (ROOT / module).read_text()
    planter = Planter(module, source)
    planter.visit(ast.parse(source))
    seen: dict[tuple[str, str, str], int] = defaultdict(int)
    mutants = []
    for m in sorted(planter.found, key=lambda m: (m.start, m.end, m.replacement)):
        try:
            compile(m.apply(source), module, "exec", dont_inherit=True)
        except SyntaxError:
            continue
        n = seen[(m.scope, m.before, m.after)]
        seen[(m.scope, m.before, m.after)] += 1
        mutants.append(dataclasses.replace(m, occurrence=n))
    return mutants


# -- coverage ----------------------------------------------------------------------------------------

COVER_PLUGIN = '''
"""Per-test coverage of the mutated modules (scripts/mutants.py coverage)."""
import json, os
import coverage, pytest

_cov = coverage.Coverage(data_file=None, include=json.loads(os.environ["MUTANTS_FILES"]), config_file=False)
_cov.start()
_seconds, _failed, _uses = {}, set(), {}
_contexts = [""]  # the test running, then the shared fixtures being set up within it
# the Python processes a test starts measure themselves (sitecustomize.py), as that test's
os.environ["MUTANTS_SUBPROCESS_COVER"] = os.environ["MUTANTS_COVER_DIR"]

def _switch(context):
    _cov.switch_context(context)
    os.environ["MUTANTS_CONTEXT"] = context

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _contexts[:] = [item.nodeid]
    _switch(item.nodeid)
    yield
    _contexts[:] = [""]
    _switch("")

@pytest.hookimpl(hookwrapper=True)
def pytest_fixture_setup(fixturedef, request):
    """A session or module fixture's setup runs for every test that uses it, not only the first:
    its lines are the fixture's, given to each test that uses the fixture."""
    if fixturedef.scope == "function":
        yield
        return
    _contexts.append("fixture:" + fixturedef.argname)
    _switch(_contexts[-1])
    try:
        yield
    finally:
        _contexts.pop()
        _switch(_contexts[-1])

@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    request = getattr(item, "_request", None)
    _uses[item.nodeid] = sorted(set(getattr(request, "_fixture_defs", {}) or {}) | set(item.fixturenames))
    yield

def pytest_runtest_logreport(report):
    _seconds[report.nodeid] = _seconds.get(report.nodeid, 0.0) + report.duration
    if report.failed:
        _failed.add(report.nodeid)

def pytest_sessionfinish(session):
    _cov.stop()
    data = _cov.get_data()
    lines = {}
    for name in data.measured_files():
        lines[name] = {line: sorted(c for c in contexts if c)
                       for line, contexts in data.contexts_by_lineno(name).items()}
    with open(os.environ["MUTANTS_OUT"], "w") as f:
        json.dump({"seconds": _seconds, "failed": sorted(_failed), "lines": lines, "uses": _uses}, f)
'''

SITECUSTOMIZE = '''
"""scripts/mutants.py: compile one module from its mutated source (MUTANTS_MODULE, MUTANTS_SOURCE),
in this process and every Python process it starts."""
import importlib.abc, importlib.machinery, importlib.util, os, sys

_name = os.environ.get("MUTANTS_MODULE")
if _name:
    _origin = os.environ["MUTANTS_ORIGIN"]
    with open(os.environ["MUTANTS_SOURCE"], "rb") as _f:
        _source = _f.read()

    class _Loader(importlib.machinery.SourceFileLoader):
        def get_code(self, fullname):
            return compile(_source, self.path, "exec", dont_inherit=True)

    class _Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, fullname, path=None, target=None):
            if fullname != _name:
                return None
            return importlib.util.spec_from_file_location(fullname, _origin, loader=_Loader(fullname, _origin))

    sys.meta_path.insert(0, _Finder())

# scripts/mutants.py coverage: a process a test started measures the mutated modules, as that test's
_cover = os.environ.get("MUTANTS_SUBPROCESS_COVER")
if _cover:
    import atexit, json
    import coverage

    _cov = coverage.Coverage(data_file=os.path.join(_cover, "sub"), data_suffix=True, config_file=False,
                             include=json.loads(os.environ["MUTANTS_FILES"]),
                             context=os.environ.get("MUTANTS_CONTEXT") or None)
    _cov.set_option("run:disable_warnings", ["no-data-collected", "module-not-imported", "module-not-measured",
                                             "already-imported", "no-ctracer", "include-ignored"])
    _cov.start()

    @atexit.register
    def _save():
        _cov.stop()
        _cov.save()
'''

SELECT_PLUGIN = '''
"""scripts/mutants.py: run the tests MUTANTS_TESTS lists, in its order; write what failed to MUTANTS_OUT."""
import json, os

_wanted = [line for line in open(os.environ["MUTANTS_TESTS"]).read().splitlines() if line]
_ran, _failed = [], []

def pytest_collection_modifyitems(session, config, items):
    order = {nodeid: i for i, nodeid in enumerate(_wanted)}
    keep = sorted((item for item in items if item.nodeid in order), key=lambda item: order[item.nodeid])
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid not in order])
    items[:] = keep

def pytest_runtest_logreport(report):
    if report.when == "call" or report.failed:
        if report.nodeid not in _ran:
            _ran.append(report.nodeid)
    if report.failed and report.nodeid not in _failed:
        _failed.append(report.nodeid)

def pytest_sessionfinish(session, exitstatus):
    with open(os.environ["MUTANTS_OUT"], "w") as f:
        json.dump({"ran": _ran, "failed": _failed, "exit": int(exitstatus)}, f)
'''


def write_hooks() -> None:
    HOOK.mkdir(parents=True, exist_ok=True)
    for name, text in (("sitecustomize.py", SITECUSTOMIZE), ("mutants_select.py", SELECT_PLUGIN),
                       ("mutants_cover.py", COVER_PLUGIN)):
        if not (HOOK / name).exists() or (HOOK / name).read_text() != text:   # runs at once share them
            (HOOK / name).write_text(text)


def digest(module: str) -> str:
    return hashlib.sha256((ROOT / module).read_bytes()).hexdigest()


def take_coverage(args: argparse.Namespace) -> None:
    write_hooks()
    out = WORK / "coverage.raw.json"
    sub = WORK / "subprocesses"
    shutil.rmtree(sub, ignore_errors=True)
    sub.mkdir(parents=True)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               MUTANTS_FILES=json.dumps([str(ROOT / m) for m in MODULES]), MUTANTS_OUT=str(out),
               MUTANTS_COVER_DIR=str(sub), SPECEDGE_CACHE=os.environ.get("SPECEDGE_CACHE", str(CACHE)))
    started = time.monotonic()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "mutants_cover", "-p", "no:cacheprovider", *args.pytest_args]
    print("+", " ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, env=env, check=False)
    raw = json.loads(out.read_text())
    merge_subprocesses(raw["lines"], sub)
    users: dict[str, set[str]] = defaultdict(set)   # a shared fixture -> the tests that use it
    for test, fixtures in raw["uses"].items():
        for name in fixtures:
            users["fixture:" + name].add(test)
    for by_line in raw["lines"].values():
        for line, contexts in by_line.items():
            by_line[line] = sorted({t for c in contexts
                                    for t in (users.get(c, ()) if c.startswith("fixture:") else (c,))})
    tests = sorted(raw["seconds"])
    index = {t: i for i, t in enumerate(tests)}
    lines: dict[str, dict[str, list[int]]] = {}
    for name, by_line in raw["lines"].items():
        module = Path(name).resolve().relative_to(ROOT).as_posix()
        lines[module] = {line: [index[c] for c in contexts if c in index] for line, contexts in by_line.items()}
    COVERAGE.write_text(json.dumps({
        "digests": {m: digest(m) for m in MODULES}, "tests": tests,
        "seconds": [round(raw["seconds"][t], 3) for t in tests], "failed": raw["failed"], "lines": lines,
        "took": round(time.monotonic() - started, 1)}))
    print(f"coverage of {len(lines)} modules by {len(tests)} tests in {time.monotonic() - started:.0f} s: {COVERAGE}")


def merge_subprocesses(lines: dict[str, dict[str, list[str]]], folder: Path) -> None:
    """Adds what the processes the tests started ran (each file's context: the test that started it)."""
    import coverage

    for path in sorted(folder.glob("sub.*")):
        data = coverage.CoverageData(basename=str(path))
        data.read()
        for name in data.measured_files():
            mine = lines.setdefault(name, {})
            for line, contexts in data.contexts_by_lineno(name).items():
                mine[str(line)] = sorted(set(mine.get(str(line), [])) | {c for c in contexts if c})


def load_coverage(modules: list[str]) -> dict:
    if not COVERAGE.exists():
        sys.exit(f"no coverage yet: run `{sys.executable} scripts/mutants.py coverage` first")
    cov = json.loads(COVERAGE.read_text())
    stale = [m for m in modules if cov["digests"].get(m) != digest(m)]
    if stale:
        sys.exit(f"the coverage is older than {', '.join(stale)}: run `scripts/mutants.py coverage` again")
    return cov


class Covering:
    """The tests that cover a mutant, fastest first."""

    def __init__(self, cov: dict) -> None:
        self.tests, self.seconds = cov["tests"], cov["seconds"]
        failed = set(cov["failed"])
        self.by_line = {m: {int(line): [i for i in ids if self.tests[i] not in failed] for line, ids in lines.items()}
                        for m, lines in cov["lines"].items()}

    def of(self, mutant: Mutant) -> list[int]:
        lines = self.by_line.get(mutant.module, {})
        if mutant.fallback == "module":  # run at import: whoever imported first (a child process) says nothing
            ids = {i for line in mutant.uses for i in lines.get(line, [])} or {i for these in lines.values()
                                                                             for i in these}
        else:
            ids = {i for line in mutant.lines for i in lines.get(line, [])}
        if not ids and mutant.fallback == "function":
            ids = {i for line in mutant.function_lines for i in lines.get(line, [])}
        return sorted(ids, key=lambda i: (self.seconds[i], self.tests[i]))


# -- the campaign ------------------------------------------------------------------------------------

def run_one(mutant: Mutant, tests: list[str], seconds: float, *, verbose: bool = False,
            marks: str | None = None) -> dict:
    """Runs `tests` against `mutant` in a pytest process of its own."""
    write_hooks()
    source = (ROOT / mutant.module).read_text()
    with tempfile.TemporaryDirectory(dir=WORK, prefix="run-") as here:
        return run_in(mutant, source, tests, seconds, Path(here), verbose, marks)


def run_in(mutant: Mutant, source: str, tests: list[str], seconds: float, here: Path, verbose: bool,
           marks: str | None) -> dict:
    mutated, listing, out = here / "mutant.py", here / "tests.txt", here / "outcome.json"
    mutated.write_text(mutant.apply(source))
    listing.write_text("\n".join(tests) + "\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HOOK), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
               PYTHONDONTWRITEBYTECODE="1", MUTANTS_MODULE=module_name(mutant.module),
               SPECEDGE_CACHE=os.environ.get("SPECEDGE_CACHE", str(CACHE)),
               MUTANTS_ORIGIN=str(ROOT / mutant.module), MUTANTS_SOURCE=str(mutated),
               MUTANTS_TESTS=str(listing), MUTANTS_OUT=str(out))
    files = sorted({t.split("::")[0] for t in tests})
    cmd = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "mutants_select", *files,
           *(["-m", marks] if marks else [])]
    limit = 3 * seconds + 30
    started = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True,
                            stdout=None if verbose else subprocess.DEVNULL,
                            stderr=None if verbose else subprocess.DEVNULL)
    try:
        proc.wait(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        timed_out = True
    took = time.monotonic() - started
    outcome = json.loads(out.read_text()) if out.exists() else {"ran": [], "failed": [], "exit": None}
    if timed_out:
        status = "timeout"
    elif outcome["failed"]:
        status = "killed"
    elif proc.returncode == 0:
        status = "survived"
    elif proc.returncode == 5:
        status = "error"   # no test ran: the listing does not match the tests any more
    else:
        status = "killed"  # the tests did not load (a collection error) or pytest stopped
    return {"id": mutant.id, "module": mutant.module, "line": mutant.line, "scope": mutant.scope,
            "mutation": mutant.mutation, "code": short(source.splitlines()[mutant.line - 1], 100),
            "status": status, "exit": proc.returncode,
            "killed_by": outcome["failed"][0] if outcome["failed"] else None,
            "tests": len(tests), "ran": len(outcome["ran"]), "seconds": round(took, 1),
            "limit": round(limit, 1), "key": mutant.key}


def load_explained() -> list[dict]:
    if not EXPLAINED.exists():
        return []
    import tomllib

    return tomllib.loads(EXPLAINED.read_text()).get("survivor", [])


def explanation(row: dict, explained: list[dict]) -> dict | None:
    for entry in explained:
        if entry["id"] == row["id"]:
            return entry
    return None


def sample(modules: list[str], cov: Covering, per_module: int,
           seed: int) -> tuple[dict, list[tuple[Mutant, list[int]]]]:
    figures, chosen = {}, []
    for module in modules:
        mutants = plant(module)
        covered = [(m, cov.of(m)) for m in mutants]
        covered = [(m, ids) for m, ids in covered if ids]
        rng = random.Random(f"{seed}:{module}")
        picked = sorted(covered, key=lambda mc: mc[0].key)
        if per_module and len(picked) > per_module:
            picked = rng.sample(picked, per_module)
        picked.sort(key=lambda mc: (mc[0].start, mc[0].key))
        figures[module] = {"mutants": len(mutants), "covered": len(covered), "run": len(picked)}
        chosen += picked
    return figures, chosen


def campaign(args: argparse.Namespace) -> None:
    modules = args.module or MODULES
    if args.id:   # only the modules the ids name
        modules = [m for m in modules if any(i.rsplit("-", 1)[0] == Path(m).stem for i in args.id)]
    cov_json = load_coverage(modules)
    cov = Covering(cov_json)
    figures, chosen = sample(modules, cov, 0 if args.id or args.sample_from else args.per_module, args.seed)
    if args.id:
        chosen = [(m, ids) for m, ids in chosen if m.id in args.id]
    if args.sample_from:   # the mutants of an earlier run (its sample, whatever the coverage now)
        keys = {r["key"] for r in json.loads(Path(args.sample_from).read_text())["mutants"]}
        chosen = [(m, ids) for m, ids in chosen if m.key in keys]
        for module in modules:
            figures[module]["run"] = sum(m.module == module for m, _ in chosen)
    explained = load_explained()
    out = Path(args.out)
    done = {}
    if args.resume and out.exists():   # the rows of an interrupted run of the same mutants
        done = {r["key"]: r for r in json.loads(out.read_text())["mutants"]}
    rows = []
    started = time.monotonic()
    killers = hints(args.hints or args.sample_from)
    for n, (mutant, ids) in enumerate(chosen, 1):
        tests = first(killers, mutant, [cov.tests[i] for i in ids])
        seconds = sum(cov.seconds[i] for i in ids)
        if args.tests:
            tests = resolve_tests(args.tests, args.marks)
            seconds = 60.0
        row = done.get(mutant.key)
        if row is None or (args.rerun_survivors and row["status"] == "survived"):
            row = run_one(mutant, tests, seconds, verbose=args.verbose, marks=args.marks)
        code = (ROOT / mutant.module).read_text().splitlines()[mutant.line - 1]
        row = dict(row, line=mutant.line, code=short(code, 100))
        rows.append(row)
        if not (args.id or args.tests):
            save(args, modules, figures, rows, started, out)
        note = ""
        if row["status"] == "survived":
            found = explanation(row, explained)
            note = f"  [{found['kind']}]" if found else "  [UNEXPLAINED]"
        print(f"{n}/{len(chosen)} {row['status']:8} {row['id']} {mutant.module}:{mutant.line} {mutant.scope}: "
              f"{mutant.mutation} ({row['ran']}/{row['tests']} tests, {row['seconds']} s){note}", flush=True)
    if args.id or args.tests:
        if args.record:
            record(out, rows)
        return
    save(args, modules, figures, rows, started, out)
    write_report(json.loads(out.read_text()), explained, out.with_suffix(".md"),
                 json.loads(Path(args.sample_from).read_text()) if args.sample_from else None)
    print(f"{out}, {out.with_suffix('.md')}")


def record(out: Path, rows: list[dict]) -> None:
    """`run --id ID --tests T --record`: a survivor of `out` these tests kill (a test written for it)
    becomes killed there, killed_by that test, first_status survived; `report` lists it apart."""
    report = json.loads(out.read_text())
    by_id = {r["id"]: r for r in report["mutants"]}
    for row in rows:
        old = by_id.get(row["id"])
        if old is not None and old["status"] == "survived" and row["status"] in ("killed", "timeout"):
            old.update(first_status="survived", status=row["status"], killed_by=row["killed_by"])
    for module, f in report["modules"].items():
        f.update(tally([r for r in report["mutants"] if r["module"] == module]))
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


def hints(path: str | None) -> dict[str, list[str]]:
    """From an earlier results file: the test that killed each mutant (by key), and the tests that
    killed mutants of each function (by module::scope), to run first."""
    out: dict[str, list[str]] = defaultdict(list)
    if path:
        for row in json.loads(Path(path).read_text())["mutants"]:
            if row.get("killed_by"):
                out[row["key"]].append(row["killed_by"])
                out[f"{row['module']}::{row['scope']}"].append(row["killed_by"])
    return out


def first(killers: dict[str, list[str]], mutant: Mutant, tests: list[str]) -> list[str]:
    """`tests` (fastest first) with those that killed this mutant, or its function's, before them."""
    covering = set(tests)
    ahead = [t for t in (*killers.get(mutant.key, ()), *killers.get(f"{mutant.module}::{mutant.scope}", ()))
             if t in covering]
    ahead = list(dict.fromkeys(ahead))
    return ahead + [t for t in tests if t not in set(ahead)]


def save(args: argparse.Namespace, modules: list[str], figures: dict, rows: list[dict], started: float,
         out: Path) -> None:
    report = {"seed": args.seed, "per_module": args.per_module, "sample_from": args.sample_from, "commit": commit(),
              "date": time.strftime("%Y-%m-%d"), "took_s": round(time.monotonic() - started),
              "modules": {m: dict(figures[m], **tally([r for r in rows if r["module"] == m])) for m in modules},
              "mutants": rows}
    out.write_text(json.dumps(report, indent=1, ensure_ascii=False) + "\n")


def resolve_tests(given: list[str], marks: str | None = None) -> list[str]:
    """Node ids of the tests named (files or node ids), as pytest collects them."""
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *given,
                           *(["-m", marks] if marks else [])],
                          cwd=ROOT, capture_output=True, text=True, check=False)
    return [line for line in proc.stdout.splitlines() if "::" in line]


def tally(rows: list[dict]) -> dict:
    counts = {s: sum(r["status"] == s for r in rows) for s in ("killed", "timeout", "survived", "error")}
    return counts


def commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return proc.stdout.strip()


def write_report(report: dict, explained: list[dict], path: Path, before: dict | None = None) -> None:
    sampled = (f"the mutants of an earlier run ({report['sample_from']})" if report.get("sample_from") else
               f"{report['per_module'] or 'every'} mutants a module, sampled among those on covered lines")
    lines = [
        "# Mutants",
        "",
        f"Written by `scripts/mutants.py run` (commit {report['commit']}, {report['date']}, seed {report['seed']}, "
        f"{sampled}; {report['took_s'] // 60} min). How it works: [testing.md](testing.md#mutation-testing).",
        "",
        "| module | mutants | on covered lines | run | killed | timeouts | survived | explained |",
        "|---|---|---|---|---|---|---|---|",
    ]
    total = defaultdict(int)
    survivors = [r for r in report["mutants"] if r["status"] == "survived"]
    for module, f in report["modules"].items():
        ok = sum(1 for r in survivors if r["module"] == module and explanation(r, explained))
        lines.append(f"| `{module}` | {f['mutants']} | {f['covered']} | {f['run']} | {f['killed']} | "
                     f"{f['timeout']} | {f['survived']} | {ok} |")
        for k in ("mutants", "covered", "run", "killed", "timeout", "survived"):
            total[k] += f[k]
        total["explained"] += ok
    lines.append(f"| all | {total['mutants']} | {total['covered']} | {total['run']} | {total['killed']} | "
                 f"{total['timeout']} | {total['survived']} | {total['explained']} |")
    errors = [r for r in report["mutants"] if r["status"] == "error"]
    if errors:
        lines += ["", "Not run (no test matched the listing): " + ", ".join(r["id"] for r in errors)]
    lines += ["", "## Survivors", "",
              "Each with why it survives (scripts/mutants_explained.toml); UNEXPLAINED ones need a test or a "
              "reason.", "",
              "| mutant | where | mutation | why |", "|---|---|---|---|"]
    for r in survivors:
        found = explanation(r, explained)
        why = f"{found['kind']}: {found['why']}" if found else "UNEXPLAINED"
        code = r.get("code", "").replace("|", "∣").replace("`", "'")
        lines.append(f"| {r['id']} | `{r['module']}:{r['line']}` `{r['scope']}` | {r['mutation'].replace('|', '∣')} "
                     f"in `{code}` | {' '.join(why.split())} |")
    added = [r for r in report["mutants"] if r.get("first_status") == "survived"]
    if added:   # survivors a test written for them killed since (their row updated from `run --id ID --tests`)
        lines += ["", "## Survivors killed by a test added for them", "",
                  "| mutant | where | mutation | killed by |", "|---|---|---|---|"]
        for r in added:
            lines.append(f"| {r['id']} | `{r['module']}:{r['line']}` `{r['scope']}` | "
                         f"{r['mutation'].replace('|', '∣')} | `{r['killed_by']}` |")
    if before is not None:
        now = {r["key"]: r for r in report["mutants"]}
        earlier = [r for r in before["mutants"] if r["status"] == "survived" and r["key"] in now
                   and now[r["key"]]["status"] in ("killed", "timeout")]
        lines += ["", f"## Survivors of the run before ({before['commit']}, {before['date']}), killed now", "",
                  "| mutant | mutation | killed by |", "|---|---|---|"]
        for r in earlier:
            lines.append(f"| {r['id']} | `{r['module']}` `{r['scope']}`: {r['mutation'].replace('|', '∣')} | "
                         f"`{now[r['key']]['killed_by'] or now[r['key']]['status']}` |")
    path.write_text("\n".join(lines) + "\n")


def show(args: argparse.Namespace) -> None:
    modules = MODULES
    cov = Covering(load_coverage(modules))
    for module in modules:
        for mutant in plant(module):
            if mutant.id not in args.id:
                continue
            source = (ROOT / module).read_text()
            diff = difflib.unified_diff(source.splitlines(), mutant.apply(source).splitlines(), module, module,
                                        lineterm="", n=2)
            print(f"{mutant.id} {module}:{mutant.line} {mutant.scope}: {mutant.mutation}")
            print("\n".join(diff))
            ids = cov.of(mutant)
            print(f"covered by {len(ids)} tests ({sum(cov.seconds[i] for i in ids):.1f} s):")
            for i in ids[:args.max_tests]:
                print(f"  {cov.seconds[i]:6.2f} s  {cov.tests[i]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    c = sub.add_parser("coverage", help="per-test coverage of the modules, once")
    c.add_argument("pytest_args", nargs="*", help="more arguments to pytest")
    r = sub.add_parser("run", help="the campaign")
    r.add_argument("--module", action="append", help="only this module (repeat for more)")
    r.add_argument("--per-module", type=int, default=PER_MODULE,
                   help=f"mutants sampled per module (0: all; {PER_MODULE})")
    r.add_argument("--seed", type=int, default=SEED)
    r.add_argument("--id", action="append", help="only this mutant (repeat for more): nothing written")
    r.add_argument("--tests", nargs="+", help="with --id: run these tests (files or node ids) instead")
    r.add_argument("--marks", help='with --tests: their -m expression (e.g. "reference"; default: the default set)')
    r.add_argument("--out", default=str(RESULTS))
    r.add_argument("--resume", action="store_true", help="keep the outcomes --out already holds")
    r.add_argument("--sample-from", help="run the mutants an earlier results file ran (before and after tests)")
    r.add_argument("--hints", help="an earlier results file: the tests that killed a mutant, or its function's, "
                                   "run first (default: --sample-from's)")
    r.add_argument("--rerun-survivors", action="store_true",
                   help="with --resume: run the survivors again (after tests were added)")
    r.add_argument("--record", action="store_true",
                   help="with --id and --tests: a survivor of --out they kill is recorded as killed there")
    r.add_argument("-v", "--verbose", action="store_true", help="show pytest's output")
    s = sub.add_parser("show", help="a mutant's diff and covering tests")
    s.add_argument("id", nargs="+")
    s.add_argument("--max-tests", type=int, default=15)
    w = sub.add_parser("report", help="write a results file's report again (after explaining survivors)")
    w.add_argument("results", nargs="?", default=str(RESULTS))
    w.add_argument("--before", help="an earlier results file: its survivors killed now are listed")
    p = sub.add_parser("list", help="the mutants sampled, not run")
    p.add_argument("--module", action="append")
    p.add_argument("--per-module", type=int, default=PER_MODULE)
    p.add_argument("--seed", type=int, default=SEED)
    args = parser.parse_args()
    if args.command == "coverage":
        take_coverage(args)
    elif args.command == "run":
        campaign(args)
    elif args.command == "show":
        show(args)
    elif args.command == "report":
        results = Path(args.results)
        write_report(json.loads(results.read_text()), load_explained(), results.with_suffix(".md"),
                     json.loads(Path(args.before).read_text()) if args.before else None)
    else:
        modules = args.module or MODULES
        cov = Covering(load_coverage(modules))
        figures, chosen = sample(modules, cov, args.per_module, args.seed)
        for m, ids in chosen:
            print(f"{m.id} {m.module}:{m.line} {m.scope}: {m.mutation} ({len(ids)} tests)")
        for module, f in figures.items():
            print(f"{module}: {f}")


if __name__ == "__main__":
    main()
