"""Acceptance rules of speculative decoding, as pure functions.

Greedy: accept the longest prefix of the draft on which the target's argmax agrees.
Sampling (Leviathan et al. 2023, Chen et al. 2023): accept draft token d_i with probability
min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from norm(max(0, p_i - q_i)); after a
full accept draw the bonus token from p_gamma. q_i must be the distribution d_i was drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specedge.kernels.sampling import sample


@dataclass(frozen=True)
class AcceptResult:
    """n_accepted draft tokens are kept; next_token follows them (correction or bonus)."""

    n_accepted: int
    next_token: int


def accept_greedy(draft_tokens: np.ndarray, target_argmax: np.ndarray) -> AcceptResult:
    """draft_tokens [k]; target_argmax [k+1], the target's choice after each verified input."""
    k = len(draft_tokens)
    mismatch = np.flatnonzero(draft_tokens != target_argmax[:k])
    n = int(mismatch[0]) if mismatch.size else k
    return AcceptResult(n_accepted=n, next_token=int(target_argmax[n]))


def expected_tokens(alpha: float, gamma: int) -> float:
    """E(α,γ) = (1 − α^(γ+1)) / (1 − α): tokens a round of γ drafts yields when each draft is
    accepted with probability α (the target's own token included)."""
    if gamma == 0:
        return 1.0
    if alpha >= 1.0:
        return gamma + 1.0
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def residual(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """norm(max(0, p - q)): where the target wants more mass than the draft gave. p, q: [V]."""
    r = np.maximum(p - q, 0.0)
    total = r.sum()
    if total <= 0.0:  # p == q up to rounding: rejection had probability ~0; p is the right law
        return p
    return r / total


def accept_sampled(
    draft_tokens: np.ndarray,
    q: np.ndarray,
    p: np.ndarray,
    rng: np.random.Generator,
) -> AcceptResult:
    """draft_tokens [k]; q [k, V] the draft's distributions; p [k+1, V] the target's."""
    k = len(draft_tokens)
    for i in range(k):
        d = int(draft_tokens[i])
        p_d, q_d = p[i, d], q[i, d]
        if q_d > 0.0 and rng.random() * q_d < p_d:  # u < p/q without dividing
            continue
        return AcceptResult(n_accepted=i, next_token=sample(residual(p[i], q[i]), rng))
    return AcceptResult(n_accepted=k, next_token=sample(p[k], rng))
