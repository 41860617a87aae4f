"""Drafters propose the next tokens for the target to verify, behind one interface.

- DraftModelDrafter: a small model with its own KV cache, one token per pass.
- NgramDrafter: prompt lookup, no model: the continuation of the latest earlier occurrence of
  the context's last n tokens (or of a longer n in earlier answers: runtime/round/lookup_memory.py).
- PredictionDrafter: the caller's prediction of the output (predicted outputs), looked up the
  same way; PredictedDrafter takes it beside a request's other drafter.
- HybridDrafter: the n-gram lookup where it finds a long enough match, else the draft model.
When sampling, the draft model draws the token at each position from its q with that
position's noise in `Draws`, the noise the target draws its own token with there, so a draft
agrees with the target's draw as often as q and p allow (kernels/acceptance.py); the n-gram
drafter proposes deterministically. `sources(context)` names where this round's drafts could
come from ("ngram", "model", "prediction"), best first, so γ auto can judge each source on its own record;
`propose(..., source=...)` takes drafts from the one it picked. The draft model may also be given
`go_on(drafted, confidence)`, asked after each draft whether to draft another (`confidence`: the
product, over its drafts so far, of the largest probability of the draft's untempered softmax at each,
sampled or greedy;
runtime/round/gamma.py's rule): a round then ends early where the draft is unsure, and runs longer where
it is sure. The rule reads only the draft's distributions at the tokens it drew, so the verified law
is the target's still.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

import numpy as np

from specedge.kernels.laws import Law, law
from specedge.kernels.penalties import SeenIds, Shape
from specedge.kernels.sampling import Draws, SamplingParams, argmax, top_probability
from specedge.runtime.constraints.guide import Guide, mask_rows
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.traffic import Traffic
from specedge.runtime.round.lookup_memory import LookupMemory
from specedge.runtime.round.suffix_search import suffix_ends
from specedge.runtime.round.token_array import TokenArray

Stop = Callable[[], str]  # asked before a pass: a reason to stop ("": go on)

GoOn = Callable[[int, float], bool]  # (tokens drafted, the draft's confidence in them) -> draft another


@dataclass
class Draft:
    tokens: list[int]
    calls: int = 0  # model passes spent on this draft
    traffic: Traffic = field(default_factory=Traffic)  # bytes those passes moved
    # sampling: the distribution each token was drawn from (the draft model's transformed q), None for a
    # deterministic token (lookup, pad guesses): what the rejection rule accepts against
    q: list[Law | None] = field(default_factory=list)
    source: str = ""  # where the tokens came from: "model", "ngram", "prediction" ("" none)
    forced: list[bool] = field(default_factory=list)  # per token: a grammar forced it (no pass drew it)
    guesses: int = 0  # the last `guesses` tokens are prompt-lookup guesses in a row group's pad rows, not drafts
    caught_up: int = 0  # context tokens a draft model first fed besides the pending one (after plain steps or lookups)

    def forced_in(self, n: int) -> int:
        """How many of the first n tokens a grammar forced."""
        return sum(self.forced[:n])

    def q_of(self, i: int) -> Law | None:
        return self.q[i] if i < len(self.q) else None


@dataclass(frozen=True)
class Ask:
    """What a round asks of a drafter: up to k tokens, from `source` (None: the drafter's first
    choice); a sampled token at position len(context) + j drawn from its law with `draws` at that
    position; every token consumed by `guide` (a grammar's masks, runtime/constraints/guide.py) where there
    is one; `go_on` asked after each token a model drafts whether to draft another (others ignore it)."""

    k: int
    params: SamplingParams
    draws: Draws
    source: str | None = None
    guide: Guide | None = None
    go_on: GoOn | None = None
    answer_from: int = 0  # where the answer begins in the context: params.penalties count its tokens
    seen_ids: SeenIds | None = None  # the generation's distinct context ids, kept as it grows (kernels/penalties.py)

    def shaper(self, context: Sequence[int]) -> Shape:
        """shape(row, drafts): a draft's row under the bias and penalties of the tokens before it, the
        context and the drafts before it (the law the target's row gets); the context read once."""
        return self.params.penalties.bind(context, self.answer_from, self.seen_ids)


class Drafter(Protocol):
    name: str

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        """Start a generation whose context (prompt + first token) is given; `stop`, asked before
        each pass a drafter runs to begin (a draft model's prefill chunks), ends it with the reason
        it returns (DecodingStopped)."""

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        """Where drafts for this context can come from, best first (empty: none this round)."""

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        """Up to ask.k tokens to follow context, as `Ask` says."""

    def keep(self, committed: int) -> None:
        """The first `committed` tokens of the context are final; forget anything beyond."""


class EarlierDrafter:
    """A drafter written to an earlier protocol - propose(context, k, params, draws, source=, guide=,
    go_on=) before `Ask`, begin(context) before its `stop` - asked through the one of now (`adapt`).
    go_on is passed only where the round has one, so a drafter written before it was added is asked
    as it was."""

    def __init__(self, drafter: Any) -> None:
        self.drafter = drafter
        self.name: str = getattr(drafter, "name", type(drafter).__name__)
        self.asks = takes(drafter.propose, "ask")
        self.stops = takes(drafter.begin, "stop")

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        if self.stops:
            self.drafter.begin(context, stop)
        else:
            self.drafter.begin(context)

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        return tuple(self.drafter.sources(context))

    def keep(self, committed: int) -> None:
        self.drafter.keep(committed)

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        if self.asks:
            return cast(Draft, self.drafter.propose(context, ask))
        extra = {"go_on": ask.go_on} if ask.go_on is not None else {}
        draft: Draft = self.drafter.propose(context, ask.k, ask.params, ask.draws, source=ask.source, guide=ask.guide,
                                            **extra)
        return draft


def adapt(drafter: Any) -> Any:
    """A drafter as the round asks it: one written to the protocol of now as it is, an earlier one
    through `EarlierDrafter` (None stays None)."""
    if drafter is None or (takes(drafter.propose, "ask") and takes(drafter.begin, "stop")):
        return drafter
    return EarlierDrafter(drafter)


def takes(method: Callable[..., object], name: str) -> bool:
    return name in inspect.signature(method).parameters


class NgramDrafter:
    name = "ngram"

    def __init__(self, *, max_ngram: int = 8, min_ngram: int = 1, memory: LookupMemory | None = None) -> None:
        self.max_ngram = max_ngram  # a long suffix finds the right place to copy from in code
        self.min_ngram = min_ngram
        self.tokens = TokenArray()  # the context as an array, converted as it grows
        self.memory = memory  # earlier answers (runtime/round/lookup_memory.py), searched where they match longer

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        pass

    def keep(self, committed: int) -> None:
        pass

    def match(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        """Up to k tokens following the latest earlier occurrence of the longest suffix n-gram in the
        context - or in the memory of earlier answers where a longer suffix occurs there - and that n
        (0: no match)."""
        with self.tokens.lock:
            arr = self.tokens.of(context)
            found = suffix_ends(arr, arr, min(self.max_ngram, len(arr) - 1))
            tokens, n = (arr[int(found[-1][-1]):][:k].tolist(), len(found)) if found else ([], 0)
            if self.memory is not None and n < self.max_ngram and len(self.memory):
                remembered, m = self.memory.match(arr[-self.max_ngram:], k, self.max_ngram)
                if m > n and remembered:  # a longer suffix says better where the text goes on
                    tokens, n = remembered, m
        return (tokens, n) if n >= max(self.min_ngram, 1) else ([], 0)

    def lookup(self, context: Sequence[int], k: int) -> list[int]:
        """Continuation of the latest earlier match of the longest suffix n-gram."""
        return self.match(context, k)[0]

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        return ("ngram",) if self.lookup(context, 1) else ()

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        return Draft(tokens=guided(self.lookup(context, ask.k) if ask.k > 0 else [], ask.guide), source="ngram")


class DraftModelDrafter:
    name = "draft-model"

    def __init__(self, model: OnnxModel) -> None:
        self.model = model
        self.cache = model.new_cache()

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        """Prefill the draft's cache with the context but its last token (fed by propose)."""
        if len(context) > 1:
            self.model.prefill(context[:-1], self.cache, stop=stop)
        else:
            self.cache.reset()

    def keep(self, committed: int) -> None:
        self.cache.truncate(committed)

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        return ("model",)

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        k, params, draws, guide, go_on = ask.k, ask.params, ask.draws, ask.guide, ask.go_on
        k = min(k, self.model.manifest.context - len(context) + 1)
        unseen = len(context) - self.cache.length - 1
        feed = self.model.catch_up(context, self.cache)  # the tokens the draft has not seen, pending last
        tokens: list[int] = []
        qs: list[Law | None] = []
        forced: list[bool] = []
        traffic = Traffic()
        calls = 0
        # for go_on: the product over the drafts of the largest probability of the draft's softmax at each
        # (untempered and uncut, sampled or greedy: a law cut by top-p or top-k is sure of one id where its
        # draws are accepted half the time - bench/results/epyc-zen4-draft-temperature)
        confidence = 1.0
        shape = ask.shaper(context)
        while len(tokens) < k:
            out = self.model.forward(feed, self.cache, all_logits=False)
            traffic.add(out.traffic)
            calls += 1
            self.cache.commit(out.new_keys, out.new_values, feed)
            row = out.logits[-1]
            with shape.applied(row, tokens) as shaped:  # the penalties written into the row while it is read
                logits = shaped if guide is None else mask_rows(shaped[None], [guide.allowed()])[0]
                if guide is not None and not np.isfinite(logits).any():
                    break  # its head scores none of the tokens the grammar allows here (a truncated head)
                if params.greedy:
                    token = int(out.next_ids[-1]) if logits is row and not shape.active else int(argmax(logits))
                else:  # a truncated head's q covers the first ids only: the others have probability 0
                    q = law(logits, params)  # keeps nothing of the row (kernels/laws.py copies a tail's logits)
                    token = draws.sample(q, len(context) + len(tokens))  # drawn from this very q (the race is exact)
                    qs.append(q)
                if go_on is not None:
                    confidence *= top_probability(logits)
            tokens.append(token)
            forced.append(False)
            feed = [token]
            if guide is not None:
                guide.advance(token)  # allowed: drawn under its mask
                free = guide.follow(guide.constraint.forced()[:k - len(tokens)])  # no pass draws these
                tokens += free
                qs += [None] * len(free) if qs else []
                forced += [True] * len(free)
                feed += free
            if go_on is not None and len(tokens) < k and not go_on(len(tokens), confidence):
                break
        return Draft(tokens=tokens, calls=calls, traffic=traffic, q=qs, source="model", forced=forced,
                     caught_up=max(unseen, 0))


class HybridDrafter:
    """Prompt lookup where the context has a match, the draft model elsewhere - per round.

    The lookup is taken whenever the context's last `min_match` tokens or more occurred before
    (a shorter match is too common to say where the text repeats): it costs no model pass, and
    in code being edited or quoted it is right for long runs. Elsewhere the draft model
    proposes; it catches up on the tokens it skipped in its next pass. γ auto sizes each round
    from the record of the source the round uses, and falls back to plain decoding when
    neither pays.
    """

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: DraftModelDrafter, min_match: int = 3) -> None:
        self.ngram = ngram
        self.model = adapt(model)
        self.min_match = min_match

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        self.model.begin(context, stop)

    def keep(self, committed: int) -> None:
        self.model.keep(committed)

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        tokens, n = self.ngram.match(context, 1)
        return ("ngram",) if tokens and n >= self.min_match else ("model",)

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        if (ask.source or self.sources(context)[0]) == "ngram":
            return self.ngram.propose(context, ask)
        return self.model.propose(context, ask)


class PredictionDrafter:
    """A caller's prediction of the output (OpenAI's predicted outputs: the file an edit keeps
    most of) as drafts: the continuation of the place in the prediction where the context's last
    tokens occur - the longest such suffix, `min_match` to `max_ngram` tokens, at the first
    occurrence from where the previous round left off (an edit keeps the file's order). Deterministic drafts, verified
    like any others: the output is the target's whatever the prediction says."""

    name = "prediction"

    def __init__(self, prediction: Sequence[int], max_ngram: int = 8, min_match: int = 3) -> None:
        self.tokens = np.asarray(list(prediction), dtype=np.int64)
        self.max_ngram = max_ngram
        self.min_match = min_match  # a shorter match is too common to say where the output is (as HybridDrafter's)
        self.cursor = 0  # where in the prediction the last proposal started

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        self.cursor = 0

    def keep(self, committed: int) -> None:
        pass

    def place(self, context: Sequence[int]) -> int:
        """Where in the prediction the context continues (-1: nowhere)."""
        tail = np.asarray(context[-self.max_ngram:], dtype=np.int64)
        found = suffix_ends(self.tokens, tail, len(tail))
        if len(found) < max(self.min_match, 1):
            return -1
        ends = found[-1]
        ahead = ends[ends >= self.cursor]
        return int(ahead[0] if ahead.size else ends[-1])

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        return ("prediction",) if self.place(context) >= 0 else ()

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        start = self.place(context)
        if start < 0 or ask.k <= 0:
            return Draft(tokens=[], source="prediction")
        self.cursor = start
        return Draft(tokens=guided(self.tokens[start:start + ask.k].tolist(), ask.guide), source="prediction")


class PredictedDrafter:
    """The caller's prediction where the context continues it, else the request's other drafter
    (if any), per round: γ auto judges each source on its own record."""

    def __init__(self, prediction: PredictionDrafter, other: Drafter | None) -> None:
        self.prediction = prediction
        self.other = adapt(other)
        self.name = f"prediction+{other.name}" if other is not None else "prediction"

    def begin(self, context: Sequence[int], stop: Stop | None = None) -> None:
        self.prediction.begin(context)
        if self.other is not None:
            self.other.begin(context, stop)

    def keep(self, committed: int) -> None:
        if self.other is not None:
            self.other.keep(committed)

    def sources(self, context: Sequence[int]) -> tuple[str, ...]:
        return self.prediction.sources(context) + (self.other.sources(context) if self.other is not None else ())

    def propose(self, context: Sequence[int], ask: Ask) -> Draft:
        if self.other is None or (ask.source or next(iter(self.sources(context)), "")) == "prediction":
            return self.prediction.propose(context, ask)
        return self.other.propose(context, ask)


def guided(tokens: list[int], guide: Guide | None) -> list[int]:
    """Deterministic drafts up to the first one the grammar does not allow (consumed by the guide)."""
    return tokens if guide is None else guide.follow(tokens)


def build_drafter(draft: OnnxModel | None, ngram: bool) -> Drafter | None:
    """The drafter of a draft model and/or the n-gram lookup: hybrid with both, None with neither."""
    model = DraftModelDrafter(draft) if draft is not None else None
    lookup = NgramDrafter() if ngram else None
    if model is not None and lookup is not None:
        return HybridDrafter(lookup, model)
    return model or lookup
