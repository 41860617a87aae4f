"""How a pass's time grows with the context it attends to, timed on the model itself.

A pass reads every cached entry of its rows' context: over 11K tokens a 1-row step of the default
1.5B target takes 42 ms against 29 ms over 512 (a 2-vCPU Zen 4), a 5-row verification 90 against 36,
and its draft's step 19 against 11 - nearly linear in rows x cached tokens. `growth_per_token` times
1-row passes over a cache of `depth` entries against passes over an empty one, in turns, and returns
the seconds each cached token adds to a row; γ auto weighs a round at any context length by it
(runtime/round/gamma.py's `Growth`), so that times measured over a short chat still price a round over
a long one.
"""

from __future__ import annotations

import statistics
import time

import numpy as np

from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import OnnxModel

GROWTH_DEPTH = 4096  # cached tokens the deep passes attend to (fewer where the context is shorter)
GROWTH_REPEATS = 3  # timed passes at each depth, after one warm-up each


def zero_filled(model: OnnxModel, length: int) -> KVCache:
    """A cache holding `length` entries (zeros: what attention reads costs the same whatever they hold)."""
    cache = model.new_cache()
    if length:
        cache.reserve(length)
        m = model.manifest
        zeros = [] if cache.in_place else [np.zeros((1, m.num_kv_heads, length, m.head_dim), np.float32)] * m.num_layers
        cache.commit(zeros, zeros, [0] * length)
    return cache


def growth_per_token(model: OnnxModel, depth: int = GROWTH_DEPTH, repeats: int = GROWTH_REPEATS) -> float:
    """Seconds a row's pass grows by per cached token: (t(depth) - t(1)) / (depth - 1) of 1-row passes,
    medians, the two depths in turns; 0 where the context holds fewer than 256 tokens."""
    depth = min(depth, model.manifest.context - 2)
    if depth < 256:
        return 0.0
    caches = (zero_filled(model, 1), zero_filled(model, depth))
    times: tuple[list[float], list[float]] = ([], [])
    for i in range(repeats + 1):
        for cache, timed in zip(caches, times, strict=True):
            start = time.perf_counter()
            model.forward([0], cache, all_logits=False)
            if i:  # the first pass of each cache warms it
                timed.append(time.perf_counter() - start)
    return max(statistics.median(times[1]) - statistics.median(times[0]), 0.0) / (depth - 1)
