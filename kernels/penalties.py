"""Logit transforms that read the tokens before a row: `logit_bias`, `repetition_penalty`,
`presence_penalty` and `frequency_penalty`, applied to a row of logits before the sampling
transforms (kernels/sampling.py: temperature, top-k, top-p, min-p).

In this order, each as the API that named it defines it:
1. logit_bias (OpenAI): a token's bias is added to its logit.
2. repetition_penalty r (transformers, CTRL): a token of the context - the prompt and the answer so
   far, or with `last_n` its last n tokens (llama.cpp's repeat_last_n) - has its logit divided by r
   where positive, multiplied by r where not.
3. presence_penalty and frequency_penalty (OpenAI): a token generated c times so far (the answer
   only, not the prompt) has presence * (c > 0) + frequency * c subtracted from its logit.

Each row of a verification pass is transformed by the tokens before its own position (the drafts
before it included), as plain decoding would transform that row, so speculation stays lossless;
the draft proposes under the same transforms.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from specedge.core.errors import SpecEdgeError

BIAS_LIMIT = 100.0  # OpenAI's range for a logit_bias value: [-100, 100]
PENALTY_LIMIT = 2.0  # OpenAI's range for presence and frequency penalties: [-2, 2]


def _real(value: object) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(float(value))


@dataclass(frozen=True)
class Penalties:
    presence: float = 0.0
    frequency: float = 0.0
    repetition: float = 1.0
    last_n: int = 0  # repetition over the context's last n tokens (0: all of it)
    bias: tuple[tuple[int, float], ...] = ()  # (token id, bias), as logit_bias maps them

    def __post_init__(self) -> None:
        for name, value in (("presence_penalty", self.presence), ("frequency_penalty", self.frequency)):
            if not (_real(value) and -PENALTY_LIMIT <= value <= PENALTY_LIMIT):
                raise SpecEdgeError(f"{name} must be a number from -2 to 2, got {value!r}",
                                    f"pass a {name} such as 0.5, or 0 for none")
        if not (_real(self.repetition) and self.repetition > 0):
            raise SpecEdgeError(f"repetition_penalty must be a number > 0, got {self.repetition!r}",
                                "pass a repetition_penalty such as 1.1, or 1 for none")
        if isinstance(self.last_n, bool) or not isinstance(self.last_n, numbers.Integral) or self.last_n < 0:
            raise SpecEdgeError(f"repeat_last_n must be an integer >= 0, got {self.last_n!r}",
                                "pass repeat_last_n 64, or 0 for the whole context")
        for token, value in self.bias:
            if isinstance(token, bool) or not isinstance(token, numbers.Integral) or token < 0:
                raise SpecEdgeError(f"logit_bias has the key {token!r}, not a token id",
                                    'map token ids to biases, e.g. {"1234": -100}')
            if not (_real(value) and -BIAS_LIMIT <= value <= BIAS_LIMIT):
                raise SpecEdgeError(f"logit_bias of token {token} must be a number from -100 to 100, got {value!r}",
                                    "pass a bias from -100 (never) to 100 (always)")

    @property
    def active(self) -> bool:
        return bool(self.bias) or self.counts or self.repetition != 1

    @property
    def counts(self) -> bool:
        """The presence or frequency penalty applies: the answer's tokens are counted."""
        return self.presence != 0 or self.frequency != 0

    def check_vocabulary(self, vocab: int) -> None:
        """Refuse a logit_bias key outside the model's vocabulary of `vocab` ids."""
        for token, _ in self.bias:
            if token >= vocab:
                raise SpecEdgeError(f"logit_bias names token {token}, outside the model's vocabulary of {vocab} ids",
                                    f"pass token ids from 0 to {vocab - 1}")

    def apply(self, logits: np.ndarray, context: Sequence[int], answer_from: int) -> np.ndarray:
        """The row [V] (float32) under the bias and penalties, given the tokens before it: `context`,
        of which those from index `answer_from` on are the answer so far. A copy where anything
        applies (the row itself otherwise: the pass's buffer is left as the model wrote it)."""
        return self.bind(context, answer_from)(logits, ())

    def bind(self, context: Sequence[int], answer_from: int, seen_ids: SeenIds | None = None) -> Shape:
        """`apply` for rows that follow `context` and then a few more tokens each: shape(row, extra) is
        apply(row, [*context, *extra], answer_from), the context read once (a verification pass's rows,
        a round's drafts: the context may be 10K tokens, the extras a few). `seen_ids`: the distinct ids
        of the generation's context kept as it grows, so a round reads only its new tokens."""
        whole = self.repetition != 1 and not self.last_n
        if not self.active:
            seen = np.empty(0, dtype=np.int64)
        elif whole:
            seen = seen_ids.of(context) if seen_ids is not None else np.unique(np.asarray(context, dtype=np.int64))
        else:
            seen = np.asarray(context[-self.last_n:] if self.repetition != 1 else [], dtype=np.int64)
        answer = np.asarray(context[answer_from:] if self.counts else [], dtype=np.int64)  # read only if counted
        return Shape(self, seen, answer, len(context), answer_from, whole)

    def edits(self, logits: np.ndarray, seen: np.ndarray, answer: np.ndarray, distinct: bool
              ) -> tuple[np.ndarray, np.ndarray]:
        """What the bias and penalties change in a row: the ids they touch (no id twice) and those ids'
        new logits (float32), computed as a dense copy of the row would compute them, operation for
        operation: the bias, the repetition penalty over the ids in `seen` (`distinct`: no id twice, so
        not sorted again: a 10K-token context's ids are read once a pass, not once a row), then the
        presence and frequency penalties over the tokens of `answer`."""
        vocab = logits.shape[-1]
        biased = np.unique(np.asarray([t for t, _ in self.bias if t < vocab], dtype=np.int64)) if self.bias else None
        repeated = None
        if self.repetition != 1:
            repeated = seen[seen < vocab] if distinct else np.unique(seen[seen < vocab])
        answered, counts = np.unique(answer[answer < vocab], return_counts=True) if self.counts else (None, None)
        groups = [g for g in (biased, repeated, answered) if g is not None]
        if not groups:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.float32)
        ids = groups[0] if len(groups) == 1 else np.unique(np.concatenate(groups))

        def at(group: np.ndarray) -> np.ndarray | slice:  # where a group's ids lie among `ids`
            return slice(None) if len(groups) == 1 else np.searchsorted(ids, group)

        values = np.asarray(logits[ids], dtype=np.float32)
        for token, value in self.bias:
            if token < vocab:
                values[np.searchsorted(ids, token)] += np.float32(value)  # ids sorted: the bias's are
        if repeated is not None:
            where = at(repeated)
            row = values[where]
            values[where] = np.where(row > 0, row / np.float32(self.repetition), row * np.float32(self.repetition))
        if answered is not None:
            values[at(answered)] -= np.float32(self.presence) + np.float32(self.frequency) * counts.astype(np.float32)
        return ids, values


@dataclass(frozen=True)
class Shape:
    """A row under the penalties of what it follows - `context` (bound once) and `extra` tokens after it:
    shape(row, extra) is a shaped copy of the row; `shape.applied(row, extra)` the same row for the
    time of a block without a copy (the few ids the penalties touch written into the row and put back
    after), and shape.argmax(row, extra) its argmax so: a server applies the model's default repetition
    penalty to every request, and a copy of a 150K-id row costs more than its argmax."""

    penalties: Penalties
    seen: np.ndarray  # the repetition penalty's ids over the context (distinct where `whole`)
    answer: np.ndarray  # the answer so far: presence and frequency count its tokens
    length: int  # the context's length
    answer_from: int
    whole: bool  # the repetition penalty reads the whole context (no window): `seen` holds no id twice

    @property
    def active(self) -> bool:
        return self.penalties.active

    def __call__(self, logits: np.ndarray, extra: Sequence[int] = ()) -> np.ndarray:
        """The row under the bias and penalties of the context and then `extra`: a copy where anything
        applies (the row itself otherwise)."""
        if not self.penalties.active:
            return logits
        ids, values = self.edits(logits, extra)
        out = np.array(logits, dtype=np.float32)
        out[ids] = values
        return out

    def argmax(self, logits: np.ndarray, extra: Sequence[int] = ()) -> int:
        """argmax(shape(row, extra)) (ties: the lowest id), the row left as it was."""
        with self.applied(logits, extra) as shaped:
            return int(np.argmax(shaped))

    @contextmanager
    def applied(self, logits: np.ndarray, extra: Sequence[int] = ()) -> Iterator[np.ndarray]:
        """shape(row, extra) for the time of the block, written into the row itself (a float32 row one
        may write: the few ids the penalties touch, put back after the block; a shaped copy otherwise):
        read it inside the block and keep nothing that points into it."""
        if not self.penalties.active:
            yield logits
            return
        if logits.dtype != np.float32 or not logits.flags.writeable:
            yield self(logits, extra)
            return
        ids, values = self.edits(logits, extra)
        kept = logits[ids]
        try:
            logits[ids] = values
            yield logits
        finally:
            logits[ids] = kept

    def edits(self, logits: np.ndarray, extra: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """The ids the penalties touch in this row and their new logits (`Penalties.edits`)."""
        penalties, seen, answer = self.penalties, self.seen, self.answer
        more = np.asarray(extra, dtype=np.int64)
        if more.size:
            if penalties.repetition != 1:
                seen = with_new(seen, more) if self.whole else np.concatenate([seen, more])[-penalties.last_n:]
            if penalties.counts:  # the extras that are part of the answer
                answer = np.concatenate([answer, more[max(self.answer_from - self.length, 0):]])
        return penalties.edits(logits, seen, answer, distinct=self.whole)


class SeenIds:
    """The distinct ids of one generation's context, sorted, kept as the context grows: the repetition
    penalty's set, which `np.unique` over the whole context gave each round (1.9 ms at 16K tokens on a Zen 4
    core, twice a round: the draft's rows and the target's). A context that does not extend the last one
    (another generation) is read whole again."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.ids = np.empty(0, dtype=np.int64)

    def of(self, context: Sequence[int]) -> np.ndarray:
        n = len(self.tokens)
        head = context[:n]
        if n > len(context) or (head if isinstance(head, list) else list(head)) != self.tokens:
            self.tokens, self.ids, n = [], np.empty(0, dtype=np.int64), 0
        fresh = absent(self.ids, np.asarray(context[n:], dtype=np.int64))
        if len(fresh):
            self.ids = np.insert(self.ids, np.searchsorted(self.ids, fresh), fresh)
        self.tokens.extend(context[n:])
        return self.ids


def with_new(distinct: np.ndarray, more: np.ndarray) -> np.ndarray:
    """The ids of `distinct` (sorted, no id twice), then those of `more` (a few) not among them, once
    each: their union without sorting the many again."""
    return np.concatenate([distinct, absent(distinct, more)])


def absent(distinct: np.ndarray, more: np.ndarray) -> np.ndarray:
    """The ids of `more` not in `distinct` (sorted, no id twice), once each, ascending: a binary search
    each, the many never sorted again."""
    more = np.unique(more)
    if not len(distinct):
        return more
    at = np.minimum(np.searchsorted(distinct, more), len(distinct) - 1)  # past the end: the largest, not it
    return more[distinct[at] != more]


NONE = Penalties()
