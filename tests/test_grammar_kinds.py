"""Every grammar kind specedge promises - a JSON schema, any JSON object, a regex, a Lark grammar, a
GBNF grammar - through the Python API, the CLI and the server, on a tiny random model: the output
ends where the grammar ends (EOS, never the token limit) and an independent checker accepts it
(jsonschema, json, re.fullmatch, lark's own parser, and for GBNF a regex of the same language that
only a correctly read grammar meets). Any JSON object has no end a random model must reach: it
runs on SmolLM2 asked for one (slow set)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import jsonschema
import lark
import pytest

import specedge
from specedge.runtime import Generator, SpecConfig
from tests.serve.conftest import openai_client, served_here

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {
    "kind": {"enum": ["alpha", "beta", "gamma"]}, "n": {"type": "integer", "minimum": 0, "maximum": 99},
    "tags": {"type": "array", "items": {"enum": ["x", "y"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["kind", "n", "tags", "ok"], "additionalProperties": False}
REGEX = r"[a-f]{2,5}(-[0-9]{2}){1,3}"
LARK = 'start: "x" NUM ("," NUM){0,3} ";"\nNUM: /[0-9]{1,3}/\n'
LARK_FOR_LARK = 'start: "x" NUM ("," NUM)~0..3 ";"\nNUM: /[0-9]{1,3}/\n'  # the same language in lark's own syntax
GBNF = 'root ::= "(" item ("|" item){0,2} ")"\nitem ::= [a-c] [0-9]\n'
GBNF_LANGUAGE = r"\([a-c][0-9](\|[a-c][0-9]){0,2}\)"
TOKENS = 200  # a byte a token: room for any of the grammars' outputs, so each must end by its grammar


def check_schema(text: str) -> None:
    jsonschema.validate(json.loads(text), SCHEMA)


KINDS: dict[str, tuple[specedge.Grammar, Callable[[str], None]]] = {
    "json_schema": (specedge.Grammar("json_schema", SCHEMA), check_schema),
    "regex": (specedge.Grammar("regex", REGEX), lambda text: re.fullmatch(REGEX, text) or pytest.fail(text)),
    "lark": (specedge.Grammar("lark", LARK), lambda text: lark.Lark(LARK_FOR_LARK).parse(text)),
    "gbnf": (specedge.Grammar("gbnf", GBNF), lambda text: re.fullmatch(GBNF_LANGUAGE, text) or pytest.fail(text)),
}


@pytest.mark.parametrize("kind", KINDS)
def test_the_python_api(tiny_llama: tuple[Path, Path, Path], kind: str) -> None:
    grammar, check = KINDS[kind]
    model = specedge.load(tiny_llama[1], draft=tiny_llama[2], ngram=True)
    for temperature in (0.0, 0.9):
        reply = model.generate("hello", grammar=grammar, max_tokens=TOKENS, temperature=temperature, seed=5)
        assert reply.finish_reason == "stop", (kind, reply.text)
        check(reply.text)


@pytest.mark.parametrize("kind", KINDS)
def test_the_server(tiny_llama: tuple[Path, Path, Path], kind: str) -> None:
    grammar, check = KINDS[kind]
    fmt = ({"type": "json_schema", "json_schema": {"name": "t", "schema": SCHEMA}} if kind == "json_schema" else
           {"type": "regex", "regex": REGEX} if kind == "regex" else
           {"type": "grammar", "grammar": str(grammar.source), "syntax": kind})
    gen = Generator.load(tiny_llama[1], draft=tiny_llama[2], config=SpecConfig(gamma=4, auto_gamma=True))
    with served_here(gen) as http:
        reply = openai_client(http).chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}],
                                                            response_format=fmt, max_tokens=TOKENS, temperature=0)
    assert reply.choices[0].finish_reason == "stop", reply
    check(reply.choices[0].message.content)


@pytest.mark.parametrize("kind", ["json_schema", "regex", "lark", "gbnf"])
def test_the_cli(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, kind: str) -> None:
    check = KINDS[kind][1]
    flag = {"json_schema": ["--json-schema", "s.json"], "regex": ["--regex", REGEX], "lark": ["--grammar", "g.lark"],
            "gbnf": ["--grammar", "g.gbnf"]}[kind]
    (tmp_path / "s.json").write_text(json.dumps(SCHEMA))
    (tmp_path / "g.lark").write_text(LARK)
    (tmp_path / "g.gbnf").write_text(GBNF)
    done = subprocess.run([sys.executable, "-m", "specedge", "generate", "--target", str(tiny_llama[1]), "--draft",
                           str(tiny_llama[2]), "--prompt", "hello", "--max-new-tokens", str(TOKENS), "--json", *flag],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    assert out["stop_reason"] == "eos", out
    check(out["text"])


@pytest.mark.slow
def test_any_json_object_on_a_real_model(smollm2: dict[str, Path]) -> None:
    """json_object through the API and the server, on SmolLM2 asked for an object: it ends, and parses."""
    ask = [{"role": "user", "content": "Describe a cat as a JSON object with a name and an age."}]
    model = specedge.load(smollm2["fp32"], draft=smollm2["int4"])
    reply = model.chat(ask, grammar={"type": "object"}, max_tokens=300)
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.text), dict)
    with served_here(model.generator) as http:
        served = openai_client(http).chat.completions.create(model="tiny", messages=ask, max_tokens=300,
                                                             response_format={"type": "json_object"}, temperature=0)
    assert served.choices[0].finish_reason == "stop" and isinstance(json.loads(served.choices[0].message.content), dict)


def test_a_wrong_gbnf_reading_would_be_caught() -> None:
    """The GBNF check's negative control: texts a grammar misread (repetition bounds, the separator,
    the brackets) would give are refused by it."""
    for wrong in ("(a1|b2|c3|a4)", "(a1,b2)", "a1|b2", "(d1)", "()"):
        assert re.fullmatch(GBNF_LANGUAGE, wrong) is None
    with pytest.raises(lark.exceptions.LarkError):
        lark.Lark(LARK_FOR_LARK).parse("x1,2,3,4,5;")
    with pytest.raises(jsonschema.ValidationError):
        check_schema('{"kind": "alpha", "n": 100, "tags": [], "ok": true}')
