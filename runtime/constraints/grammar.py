"""Grammars for constrained decoding - JSON schema, any JSON object, a regex, Lark or GBNF - through
llguidance (chosen over xgrammar by measurement, docs/server.md: no torch or other dependency, a
grammar built and a mask computed well within a decoding step, and stricter JSON-schema coverage:
it refuses a keyword it cannot enforce where xgrammar ignored several).

`GrammarConstraint` is the runtime's `Constraint` (runtime/constraints/guide.py) over one llguidance
matcher: a request's grammar state. Its masks leave out the ids no real token has (a GGUF's
`[PAD...]` filler entries) and allow the end-of-sequence ids once the grammar may end. An EOS is
never fed to the matcher (the text ends there; llguidance counts an EOS after a finished grammar
as no step, so a rollback over it would undo the token before).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from specedge.core.errors import SpecEdgeError

if TYPE_CHECKING:
    from tokenizers import Tokenizer

KINDS = ("json_schema", "json_object", "regex", "lark", "gbnf")
PAD = re.compile(r"\[PAD\d+\]")  # a GGUF vocabulary's filler entries up to the model's vocabulary size
COMPACT = {"whitespace_flexible": False}  # JSON without optional whitespace: more tokens are forced
MAX_GRAMMAR_CHARS = 1 << 20


@dataclass(frozen=True)
class Grammar:
    """What the output must match: kind is one of KINDS; source the schema (a dict or JSON text),
    the regex, or the grammar's text (unused for json_object)."""

    kind: str
    source: str | Mapping[str, Any] = ""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SpecEdgeError(f"unknown grammar kind {self.kind!r}", f"use one of {', '.join(KINDS)}")
        size = len(self.source) if isinstance(self.source, str) else len(json.dumps(self.source))
        if size > MAX_GRAMMAR_CHARS:
            raise SpecEdgeError(f"the {self.kind} is {size} characters long, more than {MAX_GRAMMAR_CHARS}",
                                "pass a smaller grammar")


def llguidance_module():  # type: ignore[no-untyped-def]
    try:
        import llguidance
        import llguidance.numpy
    except ImportError:
        raise SpecEdgeError("constrained decoding needs llguidance, which is not installed",
                            "pip install llguidance (or specedge's serve extra)") from None
    return llguidance


def grammar_text(grammar: Grammar) -> str:
    """llguidance's grammar for `grammar`, checked (without a vocabulary): one line naming what is wrong."""
    llg = llguidance_module()
    try:
        text = llguidance_grammar(llg, grammar)
        problem = llg.LLMatcher.validate_grammar(text)
    except (ValueError, TypeError, RecursionError) as e:
        problem = str(e)
    if problem:
        raise SpecEdgeError(f"the {grammar.kind} cannot be used: {one_line(problem)}", f"pass a valid {grammar.kind}")
    return text


def llguidance_grammar(llg: Any, grammar: Grammar) -> str:
    if grammar.kind == "json_object":
        return llg.LLMatcher.grammar_from_json_schema({"type": "object"}, overrides=COMPACT)
    if grammar.kind == "json_schema":
        schema = json.loads(grammar.source) if isinstance(grammar.source, str) else dict(grammar.source)
        if not isinstance(schema, dict):
            raise ValueError("a JSON schema is an object")
        return llg.LLMatcher.grammar_from_json_schema(schema, overrides=COMPACT)
    return llg.grammar_from(grammar.kind, str(grammar.source))


def one_line(error: object, limit: int = 300) -> str:
    """llguidance's message in one line: its first line (what is wrong), not the parser's state dump after it."""
    first = next((line for line in str(error).splitlines() if line.strip()), "")
    return " ".join(first.split())[:limit]


class GrammarFault(RuntimeError):
    """The grammar refused a token in the middle of decoding, after its own mask allowed it: a fault
    of specedge, never of the request. The message is one short line; `detail` keeps llguidance's
    own account (its parser state) for the log."""

    def __init__(self, detail: str) -> None:
        super().__init__("the grammar engine refused a token its own mask allowed, so decoding stopped "
                         "(a fault of specedge; the server's log has the details)")
        self.detail = detail


@dataclass
class Vocabulary:
    """A model's tokens as llguidance reads them, built once per tokenizer (about 1 s for 152k)."""

    tokenizer: Any  # llguidance.LLTokenizer
    real: np.ndarray  # bool [vocab]: an id a real token has
    words: np.ndarray = field(init=False)  # `real` packed as llguidance's int32 bitmask words

    def __post_init__(self) -> None:
        self.words = np.packbits(self.real, bitorder="little").view(np.int32)

    @classmethod
    def of(cls, tokenizer: Tokenizer, vocab_size: int, eos_ids: Sequence[int]) -> Vocabulary:
        """The vocabulary of a model's tokenizer (`TextCodec.tokenizer`), scored over vocab_size ids."""
        llg = llguidance_module()
        tok = llg.LLTokenizer(tokenizer.to_str(), n_vocab=vocab_size, eos_token=list(eos_ids))
        real = np.zeros(-(-vocab_size // 32) * 32, dtype=bool)
        ids = [i for token, i in tokenizer.get_vocab(with_added_tokens=True).items()
               if i < vocab_size and PAD.fullmatch(token) is None]
        real[ids] = True
        return cls(tok, real)

    def compile(self, grammar: Grammar) -> str:
        text = grammar_text(grammar)
        problem = llguidance_module().LLMatcher.validate_grammar(text, self.tokenizer)
        if problem:
            raise SpecEdgeError(f"the {grammar.kind} cannot be used: {one_line(problem)}",
                                f"pass a valid {grammar.kind}")
        return text


def unsatisfiable(constraint: GrammarConstraint, room: int) -> str:
    """Why no output of at most `room` tokens can follow a fresh grammar state ("": one can): none at
    all (only the end allowed, and the grammar not finished - a schema that only refers to itself),
    or more fixed tokens before it may end than there is room for (a regex such as a{1000000})."""
    if not constraint.matcher.is_accepting():
        allowed = constraint.allowed()  # a new array each call: ours to change
        allowed[[e for e in constraint.eos if e < len(allowed)]] = False
        if not allowed.any():
            return "admits no output: no text can follow it (a schema that refers only to itself, say)"
    if len(forced := constraint.forced()) >= room:
        return (f"fixes {len(forced)} tokens or more before any output may end, more than the {room} the "
                "request may decode (max_tokens, or the model's context)")
    return ""


class GrammarConstraint:
    """One request's grammar state over a model's vocabulary (runtime/constraints/guide.py's Constraint)."""

    def __init__(self, vocabulary: Vocabulary, grammar: Grammar, eos_ids: Sequence[int]) -> None:
        llg = llguidance_module()
        self.vocabulary = vocabulary
        self.vocab_size = len(vocabulary.real)
        self.matcher = llg.LLMatcher(vocabulary.tokenizer, vocabulary.compile(grammar), log_level=0)
        self.eos = frozenset(int(t) for t in eos_ids)
        self.fed: list[bool] = []  # per token consumed: whether the matcher saw it (an EOS it does not)
        self.bitmask = llg.numpy.allocate_token_bitmask(1, self.vocab_size)
        self.check()

    def check(self) -> None:
        if self.matcher.is_error():
            raise GrammarFault(" ".join(self.matcher.get_error().split())[:2000])

    def allowed(self) -> np.ndarray:
        llguidance_module().numpy.fill_next_token_bitmask(self.matcher, self.bitmask)
        words = self.bitmask[0] & self.vocabulary.words[:self.bitmask.shape[1]]
        return np.unpackbits(words.view(np.uint8), bitorder="little").view(bool)

    def forced(self) -> list[int]:
        return [int(t) for t in self.matcher.compute_ff_tokens()]

    def advance(self, token: int) -> None:
        fed = token not in self.eos
        if fed and not self.matcher.consume_token(int(token)):
            self.check()
            raise GrammarFault(f"token {token} refused")
        self.fed.append(fed)

    def rollback(self, n: int) -> None:
        if n <= 0:
            return
        undone = sum(self.fed[-n:])
        del self.fed[-n:]
        if undone and not self.matcher.rollback(undone):
            self.check()
