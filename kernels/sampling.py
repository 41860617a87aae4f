"""Logits → probabilities under the sampling transforms (temperature, top-k, top-p).

The transformed distribution *is* the distribution the user asked for: the target's p and the
draft's q are both built here, so acceptance compares exactly the distributions tokens were
drawn from.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen. temperature == 0 means greedy (argmax)."""

    temperature: float = 0.0
    top_k: int = 0  # 0: no top-k cut
    top_p: float = 1.0  # 1.0: no nucleus cut

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def argmax(logits: np.ndarray) -> np.ndarray:
    """Index of the largest logit along the last axis (ties: lowest index)."""
    return np.argmax(logits, axis=-1)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Numerically stable softmax along the last axis, in float64."""
    z = logits.astype(np.float64)
    z = z - np.max(z, axis=-1, keepdims=True)
    e = np.exp(z)
    return e / np.sum(e, axis=-1, keepdims=True)


def _top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """True where a logit is among the k largest of its row (ties at the edge are kept)."""
    if k <= 0 or k >= logits.shape[-1]:
        return np.ones(logits.shape, dtype=bool)
    kth = np.partition(logits, -k, axis=-1)[..., -k : -k + 1]  # [..., 1]
    return logits >= kth


def _top_p_mask(probs: np.ndarray, top_p: float) -> np.ndarray:
    """True for the smallest set of most likely tokens whose mass reaches top_p."""
    if top_p >= 1.0:
        return probs > 0
    order = np.argsort(-probs, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(probs, order, axis=-1)
    mass_before = np.cumsum(sorted_p, axis=-1) - sorted_p
    keep_sorted = mass_before < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    return keep & (probs > 0)


def probabilities(logits: np.ndarray, params: SamplingParams) -> np.ndarray:
    """The distribution a token is drawn from: temperature, then top-k, then top-p.

    logits: [..., V]. Returns float64 probabilities of the same shape, each row summing to 1.
    Greedy params give the one-hot distribution of the argmax.
    """
    if params.greedy:
        out = np.zeros(logits.shape, dtype=np.float64)
        np.put_along_axis(out, argmax(logits)[..., None], 1.0, axis=-1)
        return out
    scaled = logits.astype(np.float64) / params.temperature
    scaled = np.where(_top_k_mask(scaled, params.top_k), scaled, -np.inf)
    probs = softmax(scaled)
    if params.top_p < 1.0:
        probs = np.where(_top_p_mask(probs, params.top_p), probs, 0.0)
        probs = probs / np.sum(probs, axis=-1, keepdims=True)
    return probs


def sample(probs: np.ndarray, rng: np.random.Generator) -> int:
    """Draw one index from a probability vector [V] by inverse CDF."""
    cdf = np.cumsum(probs)
    u = rng.random() * cdf[-1]
    return int(min(np.searchsorted(cdf, u, side="right"), probs.shape[-1] - 1))
