"""Acceptance rules of speculative decoding, as pure functions.

Greedy: accept the longest prefix of the draft on which the target's argmax agrees.
Sampling: the same rule with the target's argmax replaced by the target's own draw at each
position, `Draws.sample(p_i, position)`: the exponential race of p_i on the noise keyed by
(seed, position). The draft drew d_i by racing its q_i on that same noise, so d_i equals the
target's draw as often as the two distributions allow (at least (1 - d) / (1 + d) of the time,
d = TV(p_i, q_i); measured on SmolLM2 fp32 against its int4 draft, 1-4 points below the
min(1, p/q) rule of Leviathan et al. 2023). What is emitted at a position is always the target's
own draw from p_i, so a seeded run is token-identical to plain sampling with that seed, for any γ,
any draft, and γ auto whatever it picks; the law of the output is the target's exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specedge.kernels.sampling import Draws


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
