"""The suffix search of the n-gram lookup, a prediction's place and the lookup's memory: where the last
tokens of a context occur in a sequence of tokens."""

from __future__ import annotations

import numpy as np


def suffix_ends(seq: np.ndarray, tail: np.ndarray, longest: int) -> list[np.ndarray]:
    """Where the occurrences in `seq` of the last n tokens of `tail` that have a token after them end
    (ascending), for n = 1, 2, ... up to `longest`, while any occur: one comparison over `seq` for the
    last token, then each longer suffix narrows the previous one's places (the suffix search of the
    n-gram lookup and of a prediction's place; the latest places of the longest suffix are the last
    entry's)."""
    found: list[np.ndarray] = []
    if len(tail) == 0 or len(seq) < 2:
        return found
    ends = np.flatnonzero(seq[:-1] == tail[-1]) + 1
    longest = min(longest, len(tail))
    for n in range(1, longest + 1):
        if n > 1:
            ends = ends[ends >= n]
            ends = ends[seq[ends - n] == tail[-n]]
        if not ends.size:
            break
        found.append(ends)
    return found
