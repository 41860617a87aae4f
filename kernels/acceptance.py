"""Acceptance rules of speculative decoding, as pure functions; and what a round yields,
E(α,γ) tokens (`expected_tokens`), and at what rate (`round_rate`).

Greedy: accept the longest prefix of the draft on which the target's argmax agrees.
Sampling: the same rule with the target's argmax replaced by the target's own draw at each
position, `Draws.sample(p_i, position)`: the exponential race of p_i on the noise keyed by
(seed, position). The draft drew d_i by racing its q_i on that same noise, so d_i equals the
target's draw as often as the two distributions allow (at least (1 - d) / (1 + d) of the time,
d = TV(p_i, q_i); a little below the min(1, p/q) rule of Leviathan et al. 2023, which
`accept_rejection` implements: docs/cli.md gives the measured gap). What is emitted at a position
is always the target's
own draw from p_i, so a seeded run is token-identical to plain sampling with that seed, for any γ,
any draft, and γ auto whatever it picks; the law of the output is the target's exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from specedge.kernels.laws import Law, as_law
from specedge.kernels.sampling import Draws


@dataclass(frozen=True)
class AcceptResult:
    """n_accepted draft tokens are kept; next_token follows them (correction or bonus)."""

    n_accepted: int
    next_token: int


def accept_greedy(draft_tokens: np.ndarray, target_argmax: Sequence[int] | np.ndarray) -> AcceptResult:
    """draft_tokens [k]; target_argmax [k+1], the target's choice after each verified input (an array,
    or a sequence that reads a row when asked: no row past the first disagreement is read)."""
    for i, drafted in enumerate(draft_tokens):
        choice = int(target_argmax[i])
        if choice != int(drafted):
            return AcceptResult(n_accepted=i, next_token=choice)
    k = len(draft_tokens)
    return AcceptResult(n_accepted=k, next_token=int(target_argmax[k]))


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α,γ) = (1 − α^(γ+1)) / (1 − α): tokens a round of γ drafts yields when each draft is
    accepted with probability α (the target's own token included)."""
    if gamma == 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def round_rate(alpha: float, gamma: int, t_draft: float, t_verify: float) -> float:
    """Tokens per second of rounds of γ drafts at acceptance α: E(α,γ) / (γ·t_draft + t_verify(γ+1))."""
    return expected_tokens(alpha, gamma) / (gamma * t_draft + t_verify)


def accept_sampled(draft_tokens: np.ndarray, p: np.ndarray, draws: Draws, start: int) -> AcceptResult:
    """draft_tokens [k], for positions start .. start+k-1; p [k+1, V], the target's distributions
    for positions start .. start+k. The target draws position by position until its token differs
    from the draft's (a correction) or all k agreed (the next draw is the bonus token); it draws
    no position it does not need."""
    for i, drafted in enumerate(draft_tokens):
        token = draws.sample(p[i], start + i)
        if token != int(drafted):
            return AcceptResult(n_accepted=i, next_token=token)
    k = len(draft_tokens)
    return AcceptResult(n_accepted=k, next_token=draws.sample(p[k], start + k))


# -- the rejection rule (Leviathan et al. 2023; Chen et al. 2023) ----------------------------------
# A draft token d drawn from q is accepted with probability min(1, p(d) / q(d)); on a rejection the
# token is drawn from the residual max(0, p - q), normalised; after every draft is accepted the
# bonus is drawn from p. Each position then accepts exactly 1 - TV(p, q), the most any rule with
# one draft can, and what is emitted has the law p. A deterministic draft (n-gram lookup, a
# predicted output, a forced token) has q = one-hot(d): accepted with probability p(d), its
# residual is p without d. The randomness (one uniform per verified draft, one draw for the
# correction or the bonus) comes from `rng`, apart from whatever drew the drafts.


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """One index of probs [V] (non-negative, not necessarily normalised) drawn in proportion to it."""
    cdf = np.cumsum(probs, dtype=np.float64)
    return min(int(np.searchsorted(cdf, rng.random() * cdf[-1], side="right")), len(cdf) - 1)


def residual(p: Law, q: Law | None, drafted: int) -> tuple[np.ndarray, np.ndarray]:
    """max(0, p - q) (q may cover only the first ids: a truncated head), or p without `drafted`
    where q is None (a deterministic draft: q = one-hot), on the ids either law names and `drafted`,
    ascending: (ids, weights), not normalised. Laws with a tail have more ids where p > q: `correct`
    draws from them apart."""
    ids = np.union1d(p.ids, q.ids if q is not None else [drafted])
    out = p.probs_at(ids)
    if q is None:
        out[ids == drafted] = 0.0
    else:
        out = np.maximum(out - q.probs_at(ids), 0.0)
    return ids, out


def outside(law: Law, ids: np.ndarray) -> float:
    """p's mass beyond `ids` (its tail's, where it has one)."""
    return max(1.0 - float(law.probs_at(ids).sum()), 0.0) if law.tail is not None else 0.0


def correct(p: Law, q: Law | None, drafted: int, rng: np.random.Generator) -> int:
    """The correction after a rejected draft: one id drawn from max(0, p - q), or from p where that is
    zero. Where p has a tail, the ids beyond the two laws' heads are drawn by rejection from p's
    mass there (p - q <= p): one such id in proportion to p, kept with probability (p - q) / p, else
    the whole draw again - each id still has exactly its share of max(0, p - q)."""
    ids, rest = residual(p, q, drafted)
    head, envelope = float(rest.sum()), outside(p, ids)
    if head + envelope <= 0.0:
        return draw_law(p, rng)
    for _ in range(MAX_TAIL_TRIES):
        u = rng.random() * (head + envelope)
        if u < head:
            return pick(ids, rest, u)
        token = draw_beyond(p, ids, rng)
        p_token, q_token = p.prob(token), q.prob(token) if q is not None else 0.0
        if rng.random() * p_token < p_token - q_token:
            return token
    return draw_dense_residual(p, q, drafted, rng)


MAX_TAIL_TRIES = 32  # tail draws before `correct` reads both rows whole (where q covers most of p's tail)


def draw_dense_residual(p: Law, q: Law | None, drafted: int, rng: np.random.Generator) -> int:
    """One id from max(0, p - q) over the whole row (p without `drafted` where q is None), or from p
    where that is zero: exact, and the bound on `correct`'s loop (each attempt it gave up was an
    independent draw, so starting over keeps the law)."""
    dense = p.dense()
    if q is None:
        dense[drafted] = 0.0
    else:
        q_dense = q.dense(len(dense))
        dense = np.maximum(dense - q_dense, 0.0)
    return draw(dense, rng) if dense.sum() > 0.0 else draw_law(p, rng)


def pick(ids: np.ndarray, weights: np.ndarray, u: float) -> int:
    """The id whose share of the cumulative weights holds u (0 <= u < their sum)."""
    cdf = np.cumsum(weights, dtype=np.float64)
    return int(ids[min(int(np.searchsorted(cdf, u, side="right")), len(cdf) - 1)])


def draw_beyond(p: Law, ids: np.ndarray, rng: np.random.Generator) -> int:
    """One id outside `ids` drawn in proportion to p (the whole row read: rare)."""
    dense = p.dense()
    dense[ids[ids < len(dense)]] = 0.0
    return draw(dense, rng)


def draw_law(p: Law, rng: np.random.Generator) -> int:
    """One id drawn from p: its head by the cumulative weights, its tail (where the draw lands there,
    with the tail's mass) from the whole row."""
    head = float(p.weights.sum())
    u = rng.random() * (head + (p.tail.total() if p.tail is not None else 0.0))
    return pick(p.ids, p.weights, u) if u < head else draw_beyond(p, p.ids, rng)


def accepts(p_drafted: float, q_drafted: float, u: float) -> bool:
    """Is a draft with p(d) = p_drafted, q(d) = q_drafted accepted by the uniform u? (u < p/q)"""
    return u * q_drafted < p_drafted


def accept_rejection(draft_tokens: np.ndarray, q: Sequence[Law | np.ndarray | None], p: Sequence[Law] | np.ndarray,
                     rng: np.random.Generator) -> AcceptResult:
    """draft_tokens [k], each drawn from its q[i] (the draft's law after the same sampling transform as
    p: a Law, or probabilities [V']; None: a deterministic draft); p: the target's k+1 laws (Laws, or
    probabilities [k+1, V]). Accept d_i with probability min(1, p_i(d_i) / q_i(d_i)); at the first
    rejection draw the correction from max(0, p_i - q_i); after k acceptances draw the bonus from p_k."""
    for i, drafted in enumerate(int(t) for t in draft_tokens):
        qi = None if q[i] is None else as_law(q[i])
        pi = as_law(p[i])
        q_drafted = 1.0 if qi is None else qi.prob(drafted)
        if accepts(pi.prob(drafted), q_drafted, rng.random()):
            continue
        return AcceptResult(n_accepted=i, next_token=correct(pi, qi, drafted, rng))
    k = len(draft_tokens)
    return AcceptResult(n_accepted=k, next_token=draw_law(as_law(p[k]), rng))


def acceptance_probability(p: np.ndarray, q: np.ndarray | None, drafted: int | None = None) -> float:
    """The chance that the rule accepts a draft at one position: 1 - TV(p, q) for a draft drawn
    from q, p(drafted) for a deterministic one."""
    if q is None:
        return float(p[drafted])
    full = np.zeros_like(p, dtype=np.float64)
    full[:len(q)] = q
    return float(np.minimum(p, full).sum())
