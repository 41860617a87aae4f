"""Acceptance rules on hand-made distributions, and their output law checked by sampling."""

import numpy as np

from specedge.kernels.acceptance import accept_greedy, accept_sampled
from specedge.kernels.sampling import Draws
from tests.stats_tools import PresetDraws, exponential_noise, fits, power


def test_greedy_accepts_longest_agreeing_prefix() -> None:
    r = accept_greedy(np.array([5, 6, 7]), np.array([5, 6, 9, 1]))
    assert (r.n_accepted, r.next_token) == (2, 9)
    r = accept_greedy(np.array([5, 6, 7]), np.array([5, 6, 7, 1]))
    assert (r.n_accepted, r.next_token) == (3, 1)  # bonus token
    r = accept_greedy(np.array([4]), np.array([5, 2]))
    assert (r.n_accepted, r.next_token) == (0, 5)
    r = accept_greedy(np.array([], dtype=np.int64), np.array([3]))
    assert (r.n_accepted, r.next_token) == (0, 3)


def draft_chain(q: np.ndarray, draws: Draws, start: int) -> np.ndarray:
    """A draft model's tokens: each drawn from its q with the noise of its position."""
    return np.array([draws.sample(q[i], start + i) for i in range(len(q))], dtype=np.int64)


def test_p_equal_q_always_accepts_then_bonus_from_p() -> None:
    p = np.array([[0.2, 0.5, 0.3], [0.1, 0.1, 0.8], [0.3, 0.3, 0.4]])
    for seed in range(200):
        draws = Draws(seed, 3)
        drafts = draft_chain(p[:2], draws, start=10)
        r = accept_sampled(drafts, p, draws, start=10)
        assert r.n_accepted == 2 and r.next_token == draws.sample(p[2], 12)


def test_emitted_tokens_are_the_targets_own_draws_whatever_the_draft() -> None:
    """Accepted drafts and the token after them equal what plain sampling draws at those positions
    with the same seed: a round of any length, with any draft, gives the same tokens."""
    rng = np.random.default_rng(5)
    p = rng.dirichlet(np.ones(6) * 0.5, size=5)
    for seed in range(300):
        plain = [Draws(seed, 6).sample(p[i], 7 + i) for i in range(5)]
        draws = Draws(seed, 6)
        for drafts in (rng.integers(0, 6, 4), draft_chain(p[:4], draws, 7), np.array(plain[:4])):
            r = accept_sampled(drafts, p, draws, start=7)
            assert [*drafts[:r.n_accepted], r.next_token] == plain[:r.n_accepted + 1]
        assert accept_sampled(np.array(plain[:4]), p, draws, start=7).n_accepted == 4


def test_a_one_hot_draft_is_accepted_with_probability_p() -> None:
    """A lookup's token d is accepted exactly when the target draws d, so with probability p(d),
    and a rejection is followed by a token other than d."""
    p = np.array([0.5, 0.5, 0.0])
    outcomes = [accept_sampled(np.array([0]), np.stack([p, p]), Draws(seed, 3), start=0) for seed in range(4000)]
    rejected = [r for r in outcomes if r.n_accepted == 0]
    assert all(r.next_token == 1 for r in rejected)
    assert abs(len(rejected) / len(outcomes) - 0.5) < 0.03


def test_disjoint_supports_always_reject_and_draw_from_p() -> None:
    p = np.array([0.0, 0.0, 0.4, 0.6])
    q = np.array([0.7, 0.3, 0.0, 0.0])
    for seed in range(500):
        draws = Draws(seed, 4)
        r = accept_sampled(draft_chain(q[None], draws, 0), np.stack([p, p]), draws, start=0)
        assert r.n_accepted == 0 and r.next_token in (2, 3)


def test_a_truncated_heads_draft_races_on_the_first_ids_only() -> None:
    q_head = np.array([0.0, 0.5, 0.5])  # a draft that scores the first 3 of 5 ids
    for seed in range(200):
        draws = Draws(seed, 5)
        assert draws.sample(q_head, 3) == draws.sample(np.pad(q_head, (0, 2)), 3) in (1, 2)


def test_output_law_is_p_for_any_q() -> None:
    """Each emitted token of a 2-draft round follows p at its position, whatever q is: 60,000 rounds,
    so that a shift of 1% of the mass is caught at both positions with power >= 0.9
    (tests/stats_tools.power: 1.0 at the first; ~0.98 at the second, which the ~28,000 rounds that
    accepted the first draft reach. 20,000 rounds had power 0.73 at the first, 0.4 at the second)."""
    rng = np.random.default_rng(4)
    vocab, runs = 8, 60_000
    p = rng.dirichlet(np.ones(vocab) * 0.7, size=3)
    q = rng.dirichlet(np.ones(vocab) * 0.7, size=2)
    firsts, seconds, accepted = [], [], 0
    for noise in exponential_noise(runs, 3, vocab, seed=4):
        draws = PresetDraws(noise)
        drafts = draft_chain(q, draws, start=0)
        r = accept_sampled(drafts, p, draws, start=0)
        emitted = [*drafts[:r.n_accepted], r.next_token]
        firsts.append(emitted[0])
        if r.n_accepted >= 1:  # the first draft agreed, so the round emitted a second token
            seconds.append(emitted[1])
        accepted += r.n_accepted > 0
    assert min(power(p[0], len(firsts)), power(p[1], len(seconds))) >= 0.9
    ok, chi_z, cell_z = fits(np.array(firsts), p[0])
    assert ok, (chi_z, cell_z)
    ok, chi_z, cell_z = fits(np.array(seconds), p[1])  # the noise of position 1 alone decides it
    assert ok, (chi_z, cell_z)
    tv = 0.5 * np.abs(p[0] - q[0]).sum()
    assert accepted / runs >= (1 - tv) / (1 + tv) - 0.01  # the coupling's guaranteed agreement
