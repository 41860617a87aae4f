"""What a shared pass costs by its width (rows), as the passes measure it: γ auto's price of a wider
round among several streams (runtime/streams/slots.py's SharedCosts) and a prefill chunk's share of its
pass (runtime/streams/prefill_pace.py).

Each width keeps a moving average of its passes. The host's memory speed moves while it runs (a 2-vCPU
Zen 4 VM ran the same plain decoding at 25.6 and 49.7 tokens/s within one bench), and a width not run
lately keeps what it took then: among 4 streams drafting one token each, every pass is 8 rows wide, and
a 4-row time measured while memory was slow stayed as it was, so plain steps looked 30% dearer than they
were and γ auto kept the streams drafting at 0.83-0.90x the plain steps' aggregate rate
(bench/results/epyc-zen4-parallel/stale_curve.py). So a width not measured in the last STALE_PASSES
passes is read off its first measurement (the curve's shape: the widths' probes at start, taken
together) scaled as the widths measured lately moved from theirs.
"""

from __future__ import annotations

import itertools
import statistics

CURVE_EMA = 0.2
STALE_PASSES = 32  # passes after which a width's own average gives way to the shape, scaled


class PassCurve:
    """Seconds a pass takes by its width: each width's moving average (or, not measured lately, its
    first measurement scaled by the fresh widths' drift), straight lines between the widths measured
    and past the widest."""

    def __init__(self, stale: int = STALE_PASSES) -> None:
        self.stale = stale  # passes after which a width not run since is read off the shape
        self.seconds_at: dict[int, float] = {}  # width -> moving average of its passes
        self.first_at: dict[int, float] = {}  # width -> its first pass
        self.seen_at: dict[int, int] = {}  # width -> the count of passes when it last ran
        self.passes = 0
        self._points: tuple[int, list[tuple[int, float]]] = (0, [])  # `now`, in order, as of a count of passes

    def observe(self, width: int, seconds: float) -> None:
        passes = self.passes + 1  # counted last: `points` worked out meanwhile is worked out again
        old = self.seconds_at.get(width)
        self.seconds_at[width] = seconds if old is None else (1 - CURVE_EMA) * old + CURVE_EMA * seconds
        self.first_at.setdefault(width, seconds)
        self.seen_at[width] = passes
        self.passes = passes

    def now(self) -> dict[int, float]:
        """Each width's seconds as of now: its average where it ran in the last `stale` passes,
        else its first pass times the median drift (average over first pass) of the widths that did."""
        passes, seen = self.passes, dict(self.seen_at)  # copies taken in the reverse of observe's order:
        first, average = dict(self.first_at), dict(self.seconds_at)  # a width seen meanwhile is whole
        fresh = [w for w, at in seen.items() if passes - at < self.stale]
        if len(fresh) == len(seen):
            return average
        drift = statistics.median(average[w] / first[w] for w in fresh) if fresh else 1.0
        return {w: average[w] if w in fresh else first[w] * drift for w in seen}

    def points(self) -> list[tuple[int, float]]:
        """`now` by width, worked out once a pass: γ auto asks for many widths between two passes."""
        passes, (at, points) = self.passes, self._points
        if at != passes:
            points = sorted(self.now().items())
            self._points = (passes, points)
        return points

    def seconds(self, width: int) -> float:
        """0.0 while nothing is measured."""
        points = self.points()
        if not points:
            return 0.0
        if width <= points[0][0]:
            return points[0][1]
        for (w0, t0), (w1, t1) in itertools.pairwise(points):
            if width <= w1:
                return t0 + (t1 - t0) * (width - w0) / (w1 - w0)
        if len(points) == 1:
            return points[0][1]
        (w0, t0), (w1, t1) = points[-2:]
        return t1 + max(t1 - t0, 0.0) / (w1 - w0) * (width - w1)
