"""Predict tokens/s of plain and speculative decoding on a device, and choose γ.

A round drafts γ tokens (γ draft passes of width 1) and verifies them in one target pass of width
γ+1; with per-token acceptance α it yields E(α,γ) = (1 - α^(γ+1)) / (1 - α) tokens. A pass takes
its measured time where the device profile has one, else the roofline time
max(bytes / bandwidth, flops / compute).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from specedge.kernels.acceptance import expected_tokens, round_rate

THEORETICAL_EFFICIENCY = 0.7  # streaming reads reach ~70% of a datasheet peak; measured figures are used as is


def efficiency(kind: str) -> float:
    """The fraction of a profile figure that decoding can use."""
    return 1.0 if kind == "measured" else THEORETICAL_EFFICIENCY


@dataclass(frozen=True)
class PassModel:
    """How long a pass of width S takes on a device."""

    bytes_at: Callable[[int], float]  # bytes a pass of width S moves
    flops_at: Callable[[int], float]
    bandwidth_bytes_per_s: float
    flops_per_s: float | None
    measured: dict[int, float] | None = None  # width -> seconds, where measured

    def seconds(self, width: int) -> float:
        if self.measured and width in self.measured:
            return self.measured[width]
        t = self.bytes_at(width) / self.bandwidth_bytes_per_s
        if self.flops_per_s:
            t = max(t, self.flops_at(width) / self.flops_per_s)
        return t


@dataclass(frozen=True)
class GammaPoint:
    gamma: int
    tokens_per_s: float
    speedup: float
    expected_tokens: float


@dataclass(frozen=True)
class Prediction:
    plain_tokens_per_s: float
    points: tuple[GammaPoint, ...]  # γ = 1, 2, ...
    recommended_gamma: int  # 0: decode plainly, no γ beats it
    alpha: float


def predict(target: PassModel, draft: PassModel | None, alpha: float, gammas: Sequence[int]) -> Prediction:
    plain = 1.0 / target.seconds(1)
    points = []
    if draft is not None:
        t_draft = draft.seconds(1)
        for g in gammas:
            rate = round_rate(alpha, g, t_draft, target.seconds(g + 1))
            points.append(GammaPoint(g, rate, rate / plain, expected_tokens(alpha, g)))
    best = max(points, key=lambda p: p.tokens_per_s, default=None)
    recommended = best.gamma if best is not None and best.speedup > 1.0 else 0
    return Prediction(plain, tuple(points), recommended, alpha)
