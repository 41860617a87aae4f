"""The target's own log-probabilities of the tokens it emits, and of its most likely alternatives.

They are read from the very logits rows the tokens were chosen from - the verification pass's
row for a token a draft proposed and the target accepted, the target's own step otherwise - so
they are the same under speculation as in plain decoding (for a row-exact target). They are the
model's distribution itself: log-softmax of the logits at temperature 1, before top-k, top-p or a
grammar's mask (what OpenAI's `logprobs` and vLLM's default report), whatever the sampling.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20  # as the OpenAI API documents


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()  # the `n` most likely tokens at this position, most likely first


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log p along the last axis, in float64."""
    z = logits.astype(np.float64)
    z -= np.max(z, axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


def top_tokens(logp: np.ndarray, n: int) -> tuple[tuple[int, float], ...]:
    """The n most likely tokens of one row of log-probabilities, most likely first (ties: lower id)."""
    if n <= 0:
        return ()
    best = np.argpartition(-logp, n - 1)[:n] if n < logp.shape[-1] else np.arange(logp.shape[-1])
    order = best[np.lexsort((best, -logp[best]))]
    return tuple((int(t), float(logp[t])) for t in order)


def token_logprobs(rows: np.ndarray, tokens: Sequence[int], top: int = 0) -> list[TokenLogprob]:
    """Each token's log-probability under its row of logits [len(tokens), V], with `top` alternatives."""
    out = []
    for row, token in zip(rows, tokens, strict=True):
        logp = log_softmax(row)
        out.append(TokenLogprob(int(token), float(logp[token]), top_tokens(logp, top)))
    return out


class LogprobRecorder:
    """Collects the log-probabilities of the tokens decoding emits, in order (the decoding loop's
    `on_logits` callback)."""

    def __init__(self, top: int) -> None:
        self.top = top
        self.logprobs: list[TokenLogprob] = []

    def __call__(self, rows: np.ndarray, tokens: Sequence[int]) -> None:
        self.logprobs += token_logprobs(rows[:len(tokens)], tokens, self.top)
