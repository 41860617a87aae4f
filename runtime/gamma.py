"""γ auto: choose the draft length of each round from measured acceptance and measured pass times.

A round of γ drafts costs γ·t_draft + t_verify(γ+1) and yields E(α,γ) = (1 − α^(γ+1)) / (1 − α)
tokens; plain decoding yields 1 token per t_verify(1). The controller keeps decayed counts of
accepted / proposed drafts (α) and moving averages of the pass times it has seen, estimates the
widths it has not seen from a straight line through the ones it has, and picks the γ (0 = plain)
with the most tokens per second. While plain decoding wins it still drafts every `probe_every`
rounds, so a rise in acceptance is noticed.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from specedge.kernels.acceptance import expected_tokens
from specedge.runtime.model import MAX_VERIFY_WIDTH

PRIOR_ALPHA = 0.7
PRIOR_SLOPE = 0.15  # t(S) / t(1) grows by this per extra token until measured
EMA = 0.3


@dataclass
class GammaController:
    choices: tuple[int, ...]  # candidate γ >= 1, from the exported widths
    start: int = 4
    decay: float = 0.97
    probe_every: int = 8
    accepted: float = 0.0
    proposed: float = 0.0
    t_draft: float | None = None  # seconds per drafted token
    t_verify: dict[int, float] = field(default_factory=dict)  # width -> seconds
    plain_rounds: int = 0

    @classmethod
    def for_widths(cls, widths: Sequence[int], start: int = 4, max_width: int = MAX_VERIFY_WIDTH) -> GammaController:
        choices = tuple(w - 1 for w in sorted(widths) if 2 <= w <= max_width)
        return cls(choices=choices, start=min(choices, key=lambda g: abs(g - start)) if choices else 0)

    @property
    def alpha(self) -> float:
        prior = 2.0  # pseudo-counts of the prior
        return (self.accepted + prior * PRIOR_ALPHA) / (self.proposed + prior)

    def verify_seconds(self, width: int) -> float:
        if width in self.t_verify:
            return self.t_verify[width]
        points = sorted(self.t_verify.items())
        if len(points) >= 2:  # least-squares line through the measured widths
            n = len(points)
            mx = sum(w for w, _ in points) / n
            my = sum(t for _, t in points) / n
            var = sum((w - mx) ** 2 for w, _ in points)
            slope = sum((w - mx) * (t - my) for w, t in points) / var if var else 0.0
            return max(my + slope * (width - mx), 1e-6)
        w0, t0 = points[0]
        base = t0 / (1 + PRIOR_SLOPE * (w0 - 1))
        return base * (1 + PRIOR_SLOPE * (width - 1))

    def rate(self, gamma: int) -> float:
        """Predicted tokens per second at this γ (0: plain decoding)."""
        if gamma == 0:
            return 1.0 / self.verify_seconds(1)
        t_draft = self.t_draft if self.t_draft is not None else 0.0
        return expected_tokens(self.alpha, gamma) / (gamma * t_draft + self.verify_seconds(gamma + 1))

    def choose(self) -> int:
        if not self.choices:
            return 0
        if not self.t_verify or self.t_draft is None:
            return self.start
        best = max(self.choices, key=self.rate)
        if self.rate(best) >= self.rate(0):
            return best
        self.plain_rounds += 1
        if self.plain_rounds % self.probe_every == 0:
            return best
        return 0

    def observe(self, proposed: int, accepted: int, draft_seconds: float, verify_seconds: float) -> None:
        """Record a round: proposed / accepted drafts, time spent drafting them, and the verification
        pass of width proposed + 1."""
        if proposed:
            self.accepted = self.decay * self.accepted + accepted
            self.proposed = self.decay * self.proposed + proposed
            per_token = draft_seconds / proposed
            self.t_draft = per_token if self.t_draft is None else (1 - EMA) * self.t_draft + EMA * per_token
        width = proposed + 1
        old = self.t_verify.get(width)
        self.t_verify[width] = verify_seconds if old is None else (1 - EMA) * old + EMA * verify_seconds
