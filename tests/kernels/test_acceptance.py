"""Acceptance rules on hand-made distributions, and their output law checked by sampling."""

import numpy as np

from specedge.kernels.acceptance import accept_greedy, accept_sampled, residual
from tests.stats_tools import fits


def test_greedy_accepts_longest_agreeing_prefix() -> None:
    r = accept_greedy(np.array([5, 6, 7]), np.array([5, 6, 9, 1]))
    assert (r.n_accepted, r.next_token) == (2, 9)
    r = accept_greedy(np.array([5, 6, 7]), np.array([5, 6, 7, 1]))
    assert (r.n_accepted, r.next_token) == (3, 1)  # bonus token
    r = accept_greedy(np.array([4]), np.array([5, 2]))
    assert (r.n_accepted, r.next_token) == (0, 5)
    r = accept_greedy(np.array([], dtype=np.int64), np.array([3]))
    assert (r.n_accepted, r.next_token) == (0, 3)


def test_p_equal_q_always_accepts_then_bonus_from_p() -> None:
    rng = np.random.default_rng(0)
    p = np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.0, 0.0, 1.0]])
    for _ in range(200):
        r = accept_sampled(np.array([1, 2]), p[:2], p, rng)
        assert r.n_accepted == 2 and r.next_token == 2


def test_q_zero_where_p_positive_residual_is_the_missing_mass() -> None:
    p = np.array([0.5, 0.5, 0.0])
    q = np.array([1.0, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, q), [0.0, 1.0, 0.0])
    rng = np.random.default_rng(1)
    outcomes = [accept_sampled(np.array([0]), q[None], np.stack([p, p]), rng) for _ in range(4000)]
    rejected = [r for r in outcomes if r.n_accepted == 0]
    assert all(r.next_token == 1 for r in rejected)
    assert abs(len(rejected) / len(outcomes) - 0.5) < 0.03  # accept with p(0)/q(0) = 0.5


def test_disjoint_supports_always_reject_and_draw_from_p() -> None:
    p = np.array([0.0, 0.0, 0.4, 0.6])
    q = np.array([0.7, 0.3, 0.0, 0.0])
    np.testing.assert_allclose(residual(p, q), p)
    rng = np.random.default_rng(2)
    for _ in range(500):
        r = accept_sampled(np.array([0]), q[None], np.stack([p, p]), rng)
        assert r.n_accepted == 0 and r.next_token in (2, 3)


def test_one_hot_distributions() -> None:
    rng = np.random.default_rng(3)
    same = np.array([0.0, 1.0, 0.0])
    r = accept_sampled(np.array([1]), same[None], np.stack([same, same]), rng)
    assert (r.n_accepted, r.next_token) == (1, 1)
    other = np.array([0.0, 0.0, 1.0])
    r = accept_sampled(np.array([1]), same[None], np.stack([other, same]), rng)
    assert (r.n_accepted, r.next_token) == (0, 2)


def test_output_law_is_p_for_any_q() -> None:
    """The first emitted token of a round is distributed as p[0], whatever q is (20,000 draws)."""
    rng = np.random.default_rng(4)
    vocab = 8
    p = rng.dirichlet(np.ones(vocab) * 0.7, size=3)
    q = rng.dirichlet(np.ones(vocab) * 0.7, size=2)
    firsts = []
    for _ in range(20000):
        drafts = np.array([rng.choice(vocab, p=q[0]), rng.choice(vocab, p=q[1])])
        r = accept_sampled(drafts, q, p, rng)
        firsts.append(drafts[0] if r.n_accepted > 0 else r.next_token)
    ok, chi_z, cell_z = fits(np.array(firsts), p[0])
    assert ok, (chi_z, cell_z)
