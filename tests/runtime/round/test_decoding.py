"""A pass's rows as the law reads them (runtime/round/decoding.py: ReadRows), read when the rule reaches them."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from specedge.kernels.acceptance import accept_greedy
from specedge.kernels.penalties import Penalties, Shape
from specedge.runtime.round.decoding import ReadRows


class Spy:
    """A Shape that records which rows were shaped (copied) and which were argmaxed in place."""

    def __init__(self, shape: Shape) -> None:
        self.shape = shape
        self.copied: list[int] = []
        self.argmaxed: list[int] = []

    def __call__(self, logits: np.ndarray, extra: Sequence[int] = ()) -> np.ndarray:
        self.copied.append(len(extra))
        return self.shape(logits, extra)

    def argmax(self, logits: np.ndarray, extra: Sequence[int] = ()) -> int:
        self.argmaxed.append(len(extra))
        return self.shape.argmax(logits, extra)


def test_rows_read_are_each_row_under_the_penalties_of_the_drafts_before_it() -> None:
    rng = np.random.default_rng(3)
    penalties = Penalties(repetition=1.5, presence=0.5)
    context, drafts = rng.integers(0, 50, 40).tolist(), [7, 8, 9]
    logits = rng.normal(0, 4, (4, 50)).astype(np.float32)
    shape = penalties.bind(context, 30)
    rows = ReadRows(logits.copy(), None, shape, drafts)
    for i in (2, 0, 3, 1, -1):
        want = penalties.apply(logits[i], [*context, *drafts[:i % 4]], 30)
        assert np.array_equal(rows[i], want)
        assert rows.choice(i % 4) == int(np.argmax(want)) == rows.choices[i]
    assert np.array_equal(rows.logits, logits)  # the pass's rows as the model wrote them


def test_greedy_reads_no_row_past_the_first_disagreement_and_copies_none() -> None:
    rng = np.random.default_rng(4)
    context = rng.integers(0, 60, 30).tolist()
    shape = Penalties(repetition=1.2).bind(context, 20)
    logits = rng.normal(0, 4, (5, 60)).astype(np.float32)
    spy = Spy(shape)
    rows = ReadRows(logits, None, spy, [1, 2, 3, 4])  # type: ignore[arg-type]
    wrong = (rows.choice(1) + 1) % 60
    result = accept_greedy(np.array([rows.choice(0), wrong, 5, 6]), rows.choices)
    assert (result.n_accepted, result.next_token) == (1, rows.choice(1))
    assert spy.copied == [] and set(spy.argmaxed) == {0, 1}  # rows 2-4 never read


def test_rows_needing_no_shaping_are_the_pass_and_its_argmaxes() -> None:
    logits = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::-1].copy()
    rows = ReadRows(logits, np.array([0, 0, 0]))
    assert rows[1] is not None and np.array_equal(rows[1], logits[1])
    assert list(rows.choices) == [0, 0, 0]
