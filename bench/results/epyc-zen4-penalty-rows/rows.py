"""What reading a greedy verification pass's rows under repetition_penalty 1.05 costs the host, old (every
row shaped into a copy, stacked, argmaxed) against new (ReadRows: each row's argmax with the penalties
written into the row and put back), per pass of R rows over a context of N tokens; random rows of the
1.5B's 151,936 ids, `timeit` best of 5 x 50. "first disagrees": the first draft is wrong (one row read);
"all agree": every row read.

    .venv/bin/python bench/results/epyc-zen4-penalty-rows/rows.py
"""

from __future__ import annotations

import functools
import timeit

import numpy as np

from specedge.kernels.acceptance import accept_greedy
from specedge.kernels.penalties import Penalties, SeenIds
from specedge.kernels.sampling import argmax
from specedge.runtime.round.decoding import ReadRows

VOCAB = 151_936
PENALTIES = Penalties(repetition=1.05)


def old_read(logits: np.ndarray, context: list[int], before: int, seen: SeenIds, tokens: np.ndarray) -> None:
    shape = PENALTIES.bind(context[:before], 100, seen)
    shaped = np.stack([shape(row, context[before:before + i]) for i, row in enumerate(logits)])
    accept_greedy(tokens, argmax(shaped))


def new_read(logits: np.ndarray, context: list[int], before: int, seen: SeenIds, tokens: np.ndarray) -> None:
    shape = PENALTIES.bind(context[:before], 100, seen)
    accept_greedy(tokens, ReadRows(logits, None, shape, context[before:]).choices)


def main() -> None:
    rng = np.random.default_rng(0)
    for n_ctx in (600, 5000):
        for rows in (1, 5):
            logits = rng.standard_normal((rows, VOCAB)).astype(np.float32)
            context = rng.integers(0, VOCAB, n_ctx).tolist()
            seen = SeenIds()
            seen.of(context[:-rows])
            before = len(context) - rows + 1
            agree = [int(np.argmax(PENALTIES.apply(logits[i], context[:before + i], 100))) for i in range(rows - 1)]
            for case, tokens in (("first disagrees", np.array(context[before:], dtype=np.int64)),
                                 ("all agree", np.array(agree, dtype=np.int64))):
                args = (logits, context, before, seen, tokens)
                ms = [min(timeit.repeat(functools.partial(f, *args), number=50, repeat=5)) / 50 * 1e3
                      for f in (old_read, new_read)]
                print(f"{n_ctx} tokens, {rows} rows, {case}: old {ms[0]:.3f} ms, new {ms[1]:.3f} ms")


if __name__ == "__main__":
    main()
