"""A row's sampling law on the tokens that can be drawn, computed without touching the vocabulary
where the law does not need it; and the keyed noise the exponential race reads at given ids.

`law(logits, params)` is `probabilities(logits, params)` (kernels/sampling.py: the definition, in
float64 over the whole vocabulary) as a sparse `Law`: the ids a token can be drawn from and their
weights exp((z - z_max) / T) (the likeliest weighs 1). Only the ids whose logit lies within
`HEAD_SPAN` temperatures of the largest are looked at; the cuts (top-k, top-p, min-p) keep subsets
of those (top-p widens the span until the nucleus is provably inside). With no cut every token can
be drawn: the ids beyond the span are the law's `Tail`, read from the logits row only when a draw
could land there. The transforms apply in the order `probabilities` gives: temperature, top-k,
top-p, min-p.

A race over a law (`Law.race`, on the keyed noise of kernels/noise.py) reads the noise of the head's
ids and, with a tail, the members of the few blocks of the noise whose minimum is low enough to beat
the head's best: it returns exactly the token a race over every id returns.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from specedge.kernels.exp_sum import exp_sum
from specedge.kernels.noise import NOISE_BLOCK, DenseNoise, KeyedNoise
from specedge.kernels.sampling import SamplingParams

HEAD_SPAN = 12.0  # temperatures below the largest logit: ids beyond weigh < e^-12 of the likeliest


# -- the law ---------------------------------------------------------------------------------------
class Tail:
    """The ids of a law with no cut that lie beyond its head: every one of them weighs less than
    `bound`; their weights are read from the row of logits (a copy: the session's buffers are
    rewritten by the next pass) when a draw might land among them."""

    def __init__(self, logits: np.ndarray, top: float, temperature: float, below: float) -> None:
        self.logits = np.array(logits, dtype=np.float32)  # [V]
        self.top, self.temperature, self.below = top, temperature, below  # tail ids: logit < below
        self.bound = math.exp((float(below) - top) / temperature) * (1 + 1e-9) if math.isfinite(below) else 0.0
        self._total: float | None = None

    def weights(self, ids: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore", under="ignore"):
            return np.exp((self.logits[ids].astype(np.float64) - self.top) / self.temperature)

    def total(self) -> float:
        """The weight of the tail ids together (kernels/exp_sum.py: one native pass over the row)."""
        if self._total is None:
            self._total = exp_sum(self.logits, self.top, 1.0 / self.temperature, float(self.below))
        return self._total


class Law:
    """A sampling law over a vocabulary: the ids it can draw (`ids`, ascending) with their weights
    (p = weight / total), and with no cut the `tail`, every other id, whose weights are summed
    only when a normalised probability is asked for."""

    def __init__(self, ids: np.ndarray, weights: np.ndarray, tail: Tail | None = None) -> None:
        self.ids = ids  # int64 [m], ascending
        self.weights = weights  # float64 [m], > 0
        self.tail = tail

    @classmethod
    def of_probs(cls, probs: np.ndarray) -> Law:
        """The law of a probability vector [V] (its non-zero entries)."""
        probs = np.asarray(probs, dtype=np.float64)
        ids = np.flatnonzero(probs > 0)
        return cls(ids, probs[ids])

    @property
    def total(self) -> float:
        return float(self.weights.sum()) + (self.tail.total() if self.tail is not None else 0.0)

    def prob(self, token: int) -> float:
        """p(token)."""
        return float(self.probs_at(np.array([token], dtype=np.int64))[0])

    def probs_at(self, ids: np.ndarray) -> np.ndarray:
        """p of each id (int64 [n], any ids: those the law cannot draw have 0) -> float64 [n]."""
        at = np.minimum(np.searchsorted(self.ids, ids), max(len(self.ids) - 1, 0))
        head = (self.ids[at] == ids) if len(self.ids) else np.zeros(len(ids), dtype=bool)
        out = np.where(head, self.weights[at] if len(self.ids) else 0.0, 0.0)
        tail = self.tail
        if tail is not None:
            rest = ~head & (ids >= 0) & (ids < len(tail.logits))
            rest[rest] = tail.logits[ids[rest]] < tail.below
            out[rest] = tail.weights(ids[rest])
        return out / self.total

    def dense(self, vocab: int | None = None) -> np.ndarray:
        """The probabilities of every id, float64 [vocab] (default: the ids the law covers)."""
        size = vocab if vocab is not None else (len(self.tail.logits) if self.tail is not None
                                                else int(self.ids[-1]) + 1 if len(self.ids) else 0)
        out = np.zeros(size, dtype=np.float64)
        if self.tail is not None:
            rest = np.flatnonzero(self.tail.logits[:size] < self.tail.below)
            out[rest] = self.tail.weights(rest)
        keep = self.ids < size
        out[self.ids[keep]] = self.weights[keep]
        return out / self.total

    def race(self, noise: KeyedNoise | DenseNoise) -> int:
        """The id winning the race argmin noise_i / p_i over every id the law can draw (ties: the
        lowest id), as a race over the whole vocabulary would: tail ids are read only in blocks whose
        smallest noise could beat the head's best."""
        with np.errstate(divide="ignore"):
            score = noise.at(self.ids) / self.weights
        best_score = float(score.min())
        best = int(self.ids[score == best_score].min())
        tail = self.tail
        if tail is None or tail.bound == 0.0:
            return best
        blocks = np.flatnonzero(noise.block_floor < best_score * tail.bound)
        if blocks.size == 0:
            return best
        ids = (blocks[:, None] * NOISE_BLOCK + np.arange(NOISE_BLOCK)).ravel()
        ids = ids[ids < len(tail.logits)]
        ids = ids[tail.logits[ids] < tail.below]  # the head's ids were raced above
        if ids.size == 0:
            return best
        with np.errstate(divide="ignore"):
            score = noise.at(ids) / tail.weights(ids)
        j = int(np.argmin(score))
        if score[j] < best_score or (score[j] == best_score and ids[j] < best):
            return int(ids[j])
        return best


def law(logits: np.ndarray, params: SamplingParams) -> Law:
    """The law `probabilities(logits, params)` gives a row of logits [V] (float32 or float64; -inf
    where a grammar refuses), as a sparse Law. Greedy: the argmax alone."""
    z = np.asarray(logits)
    if params.greedy:
        return Law(np.array([int(np.argmax(z))], dtype=np.int64), np.ones(1))
    top, t = float(z.max()), params.temperature
    if params.top_k and params.top_k < len(z):
        ids = top_k(z, top, params.top_k)
        weights = weigh(z, ids, top, t)
        return cut(ids, weights, float(weights.sum()), params)
    if params.top_p < 1.0 or params.min_p > 0.0:
        return nucleus(z, top, params)
    below = head_edge(z, top, t, HEAD_SPAN)
    ids = np.flatnonzero(z >= below)
    weights = weigh(z, ids, top, t)
    keep = weights > 0
    return Law(ids[keep], weights[keep], Tail(z, top, t, below))


def top_k(z: np.ndarray, top: float, k: int) -> np.ndarray:
    """The ids of the k largest logits, ties at the edge kept (ascending): the k-th largest found
    among the logits within a span of the largest, widened until it holds k of them. A row a grammar
    masks (-inf) with fewer than k ids left keeps those ids."""
    lowest = float(z.min())
    if lowest == -math.inf:
        allowed = np.flatnonzero(z > -np.inf)
        if len(allowed) <= k:
            return allowed
        lowest = float(z[allowed].min())
    span = 8.0
    while True:
        edge = top - span
        near = np.flatnonzero(z >= z.dtype.type(edge)) if edge > lowest else np.arange(len(z))
        if len(near) >= k or edge <= lowest:
            kth = np.partition(z[near], -k)[-k] if len(near) >= k else z[near].min()
            return near[z[near] >= kth]
        span *= 1.5  # each widening reads the row once more; a coarser step partitions thousands of ids


def head_edge(z: np.ndarray, top: float, temperature: float, span: float) -> np.floating:
    """The logit below which ids weigh less than e^-span, in the row's own precision."""
    return z.dtype.type(top - temperature * span) if math.isfinite(top - temperature * span) else z.dtype.type(top)


def weigh(z: np.ndarray, ids: np.ndarray, top: float, temperature: float) -> np.ndarray:
    """exp((z - top) / T) of the ids, float64 (as `probabilities` scales them)."""
    with np.errstate(over="ignore", under="ignore"):
        return np.exp((z[ids].astype(np.float64) - top) / temperature)


def nucleus(z: np.ndarray, top: float, params: SamplingParams) -> Law:
    """top-p and min-p without top-k: the ids within a span of the largest logit, widened until
    they hold the nucleus (or every id), then cut as `probabilities` cuts. Top-p's denominator is
    first summed natively (`total_weight`); where the cut falls within that sum's error of an id's
    edge, it is summed again as `probabilities` sums it, so the ids kept are the definition's."""
    t = params.temperature
    # min-p keeps ids weighing >= min_p: a span a little wider than -log(min_p) holds them all
    span = HEAD_SPAN if params.min_p == 0.0 else -math.log(params.min_p) + 0.01
    total, error = None, 0.0
    while True:
        below = head_edge(z, top, t, span)
        ids = np.flatnonzero(z >= below)
        weights = weigh(z, ids, top, t)
        whole = len(ids) == len(z) or not math.isfinite(float(below))
        if params.top_p < 1.0 and total is None:
            total, error = total_weight(z, top, t, below, weights)
        # min-p keeps a prefix of the nucleus's order within the span: the nucleus may run past it
        if total is None or whole or params.min_p > 0.0 or weights.sum() >= params.top_p * total * (1 + error):
            law = cut_within(ids, weights, total if total is not None else float(weights.sum()), params, error)
            # a cut within the sum's error: the row summed again (the head holds the nucleus under that
            # total too: it held top_p of the native total grown by its error bound)
            return law if law is not None else cut(ids, weights, definition_total(z, top, t), params)
        span *= 4


# The native exp's relative error on a term it does not zero, the float32 subtraction and scale
# included (measured <= 4.1e-6 at x = -40, where it is largest), and the weight a term it zeroes
# (x < -40) may have had: what bounds the error of a total summed natively.
TERM_ERROR = 1e-5
ZEROED_WEIGHT = math.exp(-40.0)


def total_weight(z: np.ndarray, top: float, temperature: float, below: np.floating, head: np.ndarray
                 ) -> tuple[float, float]:
    """The weight of every id of the row, top-p's denominator, and a bound on its relative error: the
    head's weights (float64, as `probabilities` weighs them) plus the ids below `below`, summed in one
    native pass (kernels/exp_sum.py: float32 exps added in float64), whose error is at most TERM_ERROR of
    their share plus what the pass zeroes. A row not float32 is summed as `probabilities` sums it."""
    if z.dtype != np.float32 or not math.isfinite(top) or not math.isfinite(float(below)):
        return definition_total(z, top, temperature), 0.0
    tail = exp_sum(z, top, 1.0 / temperature, float(below))
    total = float(head.sum()) + tail
    return total, (TERM_ERROR * tail + len(z) * ZEROED_WEIGHT) / total


def definition_total(z: np.ndarray, top: float, temperature: float) -> float:
    """Top-p's denominator as `probabilities` sums it: float64 exps of the whole row (a float32 sum's
    error moves the cut of a flat row by an id or two)."""
    with np.errstate(over="ignore", under="ignore"):
        return float(np.exp((z.astype(np.float64) - top) / temperature).sum())


def cut(ids: np.ndarray, weights: np.ndarray, total: float, params: SamplingParams) -> Law:
    """top-p then min-p over candidate ids that hold the nucleus (and all ties at their edge);
    `total`: the weight of every id the law had before these cuts."""
    law = cut_within(ids, weights, total, params, 0.0)
    assert law is not None  # an exact total: every id's side of the cut is known
    return law


def cut_within(ids: np.ndarray, weights: np.ndarray, total: float, params: SamplingParams, error: float
               ) -> Law | None:
    """`cut` with a total known to within a relative `error`: None where an id's mass before it lies
    that close to top_p (its side of the cut is not known)."""
    keep = weights > 0
    ids, weights = ids[keep], weights[keep]
    if params.top_p < 1.0:
        order = np.lexsort((ids, -weights))  # likeliest first, ties by the lower id (the full sort's order)
        mass_before = (np.cumsum(weights[order]) - weights[order]) / total
        if error and np.any(np.abs(mass_before - params.top_p) <= 2 * error * params.top_p):
            return None
        order = order[mass_before < params.top_p]
        kept = np.sort(order)
        ids, weights = ids[kept], weights[kept]
    if params.min_p > 0.0:
        keep = weights >= params.min_p * weights.max()
        ids, weights = ids[keep], weights[keep]
    return Law(ids, weights)


def as_law(p: Law | np.ndarray) -> Law:
    """A Law as it is, a probability vector [V] as the law of its non-zero entries."""
    return p if isinstance(p, Law) else Law.of_probs(p)


class Laws(Sequence[Law]):
    """The laws of the rows of a pass's logits [R, V] (an array, or a sequence that reads a row when
    asked: runtime/round/decoding.py's ReadRows), each computed when first asked for (the race stops at
    the first position where the target's token differs from the draft's)."""

    def __init__(self, logits: Sequence[np.ndarray] | np.ndarray, params: SamplingParams) -> None:
        self.logits = logits
        self.params = params
        self._laws: dict[int, Law] = {}

    def __len__(self) -> int:
        return len(self.logits)

    def __getitem__(self, i):  # type: ignore[no-untyped-def, override]
        if not -len(self) <= i < len(self):
            raise IndexError(i)
        i %= len(self)
        if i not in self._laws:
            self._laws[i] = law(self.logits[i], self.params)
        return self._laws[i]
