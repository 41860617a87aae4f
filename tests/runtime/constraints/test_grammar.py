"""Grammars through llguidance: JSON schema, JSON object, regex and Lark constrain every token,
losslessly under speculation, and a grammar that cannot be used is one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.constraints.grammar import Grammar, GrammarConstraint, Vocabulary

pytest.importorskip("llguidance")

SCHEMA = {"type": "object", "properties": {"kind": {"enum": ["alpha", "beta"]}, "n": {"type": "integer"},
                                           "tag": {"const": "fixed-string"}},
          "required": ["kind", "n", "tag"], "additionalProperties": False}
GRAMMARS = {
    "json_schema": Grammar("json_schema", SCHEMA),
    "json_object": Grammar("json_object"),
    "regex": Grammar("regex", r"[a-f]{2,5}(-[0-9]{2}){1,3}"),
    "lark": Grammar("lark", 'start: "x" NUM ("," NUM)*\nNUM: /[0-9]{1,3}/'),
}
PROMPT = "def fib(n):\n    return"


def load(target: Path, draft: Path | None = None, **config: object) -> Generator:
    return Generator.load(target, draft=draft, ngram=draft is not None,
                          config=SpecConfig(max_new_tokens=40, **config))  # type: ignore[arg-type]


def constrained(gen: Generator, grammar: Grammar, **overrides: object):  # type: ignore[no-untyped-def]
    m = gen.target.manifest
    vocabulary = Vocabulary.of(gen.codec.tokenizer, m.vocab_size, m.eos_token_ids)
    return gen.generate(PROMPT, constraint=GrammarConstraint(vocabulary, grammar, m.eos_token_ids), **overrides)


@pytest.mark.parametrize("name", GRAMMARS)
def test_greedy_constrained_speculation_equals_constrained_plain(tiny_llama: tuple[Path, Path, Path],
                                                                  name: str) -> None:
    _, target, draft = tiny_llama
    plain = constrained(load(target, gamma=0), GRAMMARS[name])
    spec = constrained(load(target, draft, gamma=4, auto_gamma=True), GRAMMARS[name])
    assert spec.token_ids == plain.token_ids and spec.text == plain.text
    if plain.stats.stop_reason == "eos":  # the grammar was finished: the whole text matches it
        if name == "regex":
            assert re.fullmatch(r"[a-f]{2,5}(-[0-9]{2}){1,3}", plain.text)
        elif name != "lark":
            json.loads(plain.text)


def test_a_schemas_fixed_strings_are_forced_free(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Keys, quotes, braces and the const value are forced: verified in the passes, never drafted."""
    _, target, draft = tiny_llama
    result = constrained(load(target, draft, gamma=4), GRAMMARS["json_schema"])
    assert result.text.startswith('{"kind":"') and result.stats.forced >= 5


def test_sampled_constrained_speculation_with_a_seed_gives_plain_samplings_tokens(
        tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, draft = tiny_llama
    params = SamplingParams(temperature=0.9)
    for seed in range(3):
        plain = constrained(load(target, gamma=0, sampling=params), GRAMMARS["regex"], seed=seed)
        spec = constrained(load(target, draft, gamma=4, sampling=params), GRAMMARS["regex"], seed=seed)
        assert spec.token_ids == plain.token_ids


@pytest.mark.parametrize("grammar, words", [
    (Grammar("regex", "[a-"), "regex"),
    (Grammar("json_schema", {"type": "array", "uniqueItems": True}), "uniqueItems"),
    (Grammar("json_schema", "{not json"), "json_schema"),
    (Grammar("lark", "start: undefined_rule"), "lark"),
])
def test_a_grammar_that_cannot_be_used_is_one_line(tiny_llama: tuple[Path, Path, Path], grammar: Grammar,
                                                   words: str) -> None:
    gen = load(tiny_llama[1], gamma=0)
    with pytest.raises(SpecEdgeError, match=words) as e:
        constrained(gen, grammar)
    assert "\n" not in str(e.value)


def test_an_unknown_kind_is_refused() -> None:
    with pytest.raises(SpecEdgeError, match="unknown grammar kind"):
        Grammar("yaml", "x")
