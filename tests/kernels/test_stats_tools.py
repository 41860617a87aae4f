"""The goodness-of-fit check has teeth: it flags a 1% shift of probability mass at 20,000 draws."""

import numpy as np

from tests.stats_tools import fits


def test_catches_one_percent_shift_and_passes_the_true_law() -> None:
    rng = np.random.default_rng(0)
    law = rng.dirichlet(np.ones(16))
    order = np.argsort(law)
    biased = law.copy()
    biased[order[-1]] -= 0.01  # the most likely token loses 1% to a less likely one
    target = order[len(order) // 2]
    biased[target] += 0.01
    caught = passed = 0
    for _ in range(50):
        caught += not fits(rng.choice(16, size=20000, p=biased), law)[0]
        passed += fits(rng.choice(16, size=20000, p=law), law)[0]
    assert passed == 50
    assert caught >= 48, caught
