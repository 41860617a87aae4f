"""Passes of two builds taking turns in one process (bench/results/*/ab.py use it): each (build, pass)
key runs its model's pass of `rows` tokens over its own cache, every key once a round, the order
reversed every other round (the first round warms up); then the medians of the new / old ratios of the
passes taken in the same round, with each side's median time, as a markdown table.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable, Mapping

from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import OnnxModel

Pass = tuple[OnnxModel, int, KVCache]  # the model, the pass's rows, its cache


def time_in_turns(passes: Mapping[tuple[str, str], Pass], rounds: int) -> dict[tuple[str, str], list[float]]:
    """ms of each (build, pass name) key's pass, one a round, `rounds` rounds after a warm-up round."""
    times: dict[tuple[str, str], list[float]] = {key: [] for key in passes}
    for r in range(rounds + 1):
        for key in list(passes) if r % 2 else reversed(list(passes)):
            model, rows, cache = passes[key]
            start = time.perf_counter()
            model.forward([1] * rows, cache)
            if r:
                times[key].append((time.perf_counter() - start) * 1e3)
    return times


def ratio_table(times: Mapping[tuple[str, str], list[float]], old: str = "old", new: str = "new") -> Iterable[str]:
    yield f"| pass | {old} ms | {new} ms | {new} / {old} (median of the pairs taken in turn) |"
    yield "|---|---|---|---|"
    for name in dict.fromkeys(n for _, n in times):
        o, n = times[(old, name)], times[(new, name)]
        pair = statistics.median(b / a for a, b in zip(o, n, strict=True))
        yield f"| {name} | {statistics.median(o):.2f} | {statistics.median(n):.2f} | {pair:.3f} |"
