"""TokenArray: whatever the next context is - the last one grown, the last one with its tail
replaced (a lookup over context + drafts, then the round's commit), shorter, or another - the array
is that context's tokens."""

from __future__ import annotations

import numpy as np

from specedge.runtime.round.token_array import REWIND, TokenArray


def test_every_next_context_comes_out_as_its_tokens() -> None:
    rng = np.random.default_rng(3)
    mirror, context = TokenArray(), []
    for step in range(600):
        kind = step % 5
        if kind == 0:  # grows
            context = context + rng.integers(0, 50, int(rng.integers(0, 40))).tolist()
        elif kind == 1:  # its tail replaced, within the rewind
            cut = max(0, len(context) - int(rng.integers(0, REWIND)))
            context = context[:cut] + rng.integers(0, 50, int(rng.integers(1, 9))).tolist()
        elif kind == 2:  # differs further back than the rewind
            if len(context) > REWIND + 2:
                context = list(context)
                context[len(context) - REWIND - 2] += 1
        elif kind == 3:  # shorter
            context = context[:int(rng.integers(0, len(context) + 1))]
        else:  # another context altogether
            context = rng.integers(0, 50, int(rng.integers(0, 300))).tolist() if step % 50 == 4 else context
        got = mirror.of(context)
        assert got.dtype == np.int64 and got.tolist() == context, step


def test_a_grown_context_keeps_what_was_converted() -> None:
    mirror = TokenArray()
    mirror.of(list(range(2000)))
    assert mirror._kept([*range(2000), 7, 8]) == 2000  # only the 2 new tokens are converted
    assert mirror._kept([*range(1990), 5]) == 2000 - REWIND  # a tail replaced: converted from the rewind
    assert mirror._kept([1, *range(1, 2000)]) == 0
