"""The rejection rule of speculative sampling (kernels/acceptance.py: accept_rejection): a draft d
drawn from q accepted with probability min(1, p(d)/q(d)), the correction drawn from max(0, p - q),
the bonus from p; deterministic drafts (q one-hot) accepted with probability p(d).

The law test runs a toy language model - a Markov chain over 6 tokens, the target's next-token
table P and the draft's Q, each row about 0.3 apart in total variation - through speculative
rounds of each drafter (a draft model sampling Q, a deterministic lookup, and hybrid rounds that
alternate the two by position) and γ (1, 4, and an "auto" γ chosen each round from the last
round's acceptance), and compares the joint law of the first two generated tokens (36 cells)
with the chain's own, P(x1 | x0) P(x2 | x1). Three broken rules must fail the same test: a
residual without the max(0, ·), acceptance computed with a q other than the one sampled from, and
a bonus drawn from q. Each law test draws 20,000 generations; `power` states what it catches.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from specedge.kernels import acceptance
from specedge.kernels.acceptance import AcceptResult, accept_rejection, acceptance_probability, draw
from specedge.kernels.laws import Law
from tests.stats_tools import fits_counts, power

V = 6
RUNS = 20_000


def tables(seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(V) * 1.5, size=V)
    q = 0.6 * p + 0.4 * rng.dirichlet(np.ones(V) * 1.5, size=V)  # a draft near the target, not equal
    return p, q


P, Q = tables()
JOINT = (P[0][:, None] * P).reshape(-1)  # x0 = 0: P(x1 | 0) P(x2 | x1), cell x1 * V + x2


def lookup(last: int) -> int:
    """The deterministic drafter's guess: the draft table's likeliest successor."""
    return int(np.argmax(Q[last]))


Rule = Callable[[np.ndarray, Sequence[np.ndarray | None], np.ndarray, np.random.Generator], AcceptResult]


def generate(mode: str, gamma: int | str, rng: np.random.Generator, rule: Rule = accept_rejection,
             q_seen: np.ndarray = Q) -> tuple[int, int]:
    """The first two tokens after x0 = 0, in speculative rounds; q_seen: the draft table the rule is
    told about (Q, unless a test breaks that)."""
    context, out, last_accepted = [0], [], 4
    while len(out) < 2:
        k = gamma if isinstance(gamma, int) else max(1, min(4, last_accepted + 1))  # γ from the past only
        drafts, told = [], []
        last = context[-1]
        for j in range(k):
            if mode == "model" or (mode == "hybrid" and j % 2 == 0):
                token = draw(Q[last], rng)
                told.append(q_seen[last])
            else:
                token = lookup(last)
                told.append(None)
            drafts.append(token)
            last = token
        p = np.stack([P[context[-1]], *(P[d] for d in drafts)])
        result = rule(np.array(drafts), told, p, rng)
        new = [*drafts[:result.n_accepted], result.next_token]
        last_accepted = result.n_accepted
        context += new
        out += new
    return out[0], out[1]


def joint_counts(mode: str, gamma: int | str, seed: int, **kwargs: object) -> np.ndarray:
    rng = np.random.default_rng(seed)
    counts = np.zeros(V * V)
    for _ in range(RUNS):
        x1, x2 = generate(mode, gamma, rng, **kwargs)
        counts[x1 * V + x2] += 1
    return counts


def test_the_law_test_has_power() -> None:
    """20,000 generations catch 1% of the mass moved between two cells of the joint law."""
    assert power(JOINT, RUNS, reps=300) >= 0.9


def test_draft_model_rounds_emit_the_targets_law() -> None:
    ok, chi_z, cell_z = fits_counts(joint_counts("model", 4, seed=1), JOINT)
    assert ok, (chi_z, cell_z)


@pytest.mark.slow
@pytest.mark.parametrize("gamma", [1, 4, "auto"])
@pytest.mark.parametrize("mode", ["model", "lookup", "hybrid"])
def test_every_drafter_and_gamma_emit_the_targets_law(mode: str, gamma: int | str) -> None:
    seed = zlib.crc32(f"{mode}/{gamma}".encode())  # the same seed every run (hash() of a str is not)
    ok, chi_z, cell_z = fits_counts(joint_counts(mode, gamma, seed=seed), JOINT)
    assert ok, (mode, gamma, chi_z, cell_z)


def residual_without_max(p: Law, q: Law | None, drafted: int) -> tuple[np.ndarray, np.ndarray]:
    if q is None:
        return acceptance.residual(p, q, drafted)
    ids = np.arange(V)
    return ids, np.abs(p.probs_at(ids) - q.probs_at(ids))  # the bug: no max(0, ·) (a non-negative stand-in)


def bonus_from_q(draft_tokens, q, p, rng) -> AcceptResult:
    result = accept_rejection(draft_tokens, q, p, rng)
    if result.n_accepted == len(draft_tokens) and q[-1] is not None:  # the bug: the bonus drawn from q
        last = int(draft_tokens[-1])
        return AcceptResult(result.n_accepted, draw(Q[last], rng))
    return result


@pytest.mark.parametrize("bug", ["residual without max", "another q", "bonus from q"])
def test_broken_rules_fail_the_law_test(bug: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative controls: the test above is not blind to the bugs other implementations keep making."""
    kwargs: dict[str, object] = {}
    if bug == "residual without max":
        monkeypatch.setattr(acceptance, "residual", residual_without_max)
    elif bug == "another q":  # acceptance told a q other than the one the draft was sampled from
        kwargs["q_seen"] = 0.5 * Q + 0.5 / V
    else:
        kwargs["rule"] = bonus_from_q
    gamma = 1 if bug == "bonus from q" else 4  # at γ 1 the bonus is the second token of every full accept
    ok, _, _ = fits_counts(joint_counts("model", gamma, seed=7, **kwargs), JOINT)
    assert not ok, bug


@pytest.mark.parametrize("row", range(V))
def test_acceptance_per_position_is_one_minus_tv(row: int) -> None:
    """Accepted share of single drafts from Q[row] against P[row]: 1 - TV within 4.4 sigma at 20,000."""
    rng = np.random.default_rng(row)
    p, q = P[row][None].repeat(2, axis=0), Q[row]
    accepted = sum(accept_rejection(np.array([draw(q, rng)]), [q], p, rng).n_accepted for _ in range(RUNS))
    want = 1 - 0.5 * np.abs(P[row] - Q[row]).sum()
    assert want == pytest.approx(acceptance_probability(P[row], Q[row]))
    assert abs(accepted / RUNS - want) < 4.4 * np.sqrt(want * (1 - want) / RUNS)


def test_a_deterministic_draft_is_accepted_with_probability_p() -> None:
    rng = np.random.default_rng(9)
    p = P[2][None].repeat(2, axis=0)
    drafted = lookup(2)
    hits = sum(accept_rejection(np.array([drafted]), [None], p, rng).n_accepted for _ in range(RUNS))
    want = acceptance_probability(P[2], None, drafted)
    assert abs(hits / RUNS - want) < 4.4 * np.sqrt(want * (1 - want) / RUNS)


def test_p_equal_q_accepts_everything_and_draws_the_bonus_from_p() -> None:
    rng = np.random.default_rng(0)
    p = np.stack([P[0], P[1], P[2]])
    result = accept_rejection(np.array([1, 2]), [P[0], P[1]], p, rng)
    assert result.n_accepted == 2 and 0 <= result.next_token < V


def test_a_truncated_heads_q_covers_the_first_ids_only() -> None:
    """A draft scoring only ids < 4: q has 4 entries; the residual keeps p's mass above them."""
    rng = np.random.default_rng(1)
    p = np.array([[0.1, 0.1, 0.1, 0.1, 0.3, 0.3]] * 2)
    q = np.array([0.25, 0.25, 0.25, 0.25])
    ids, rest = acceptance.residual(Law.of_probs(p[0]), Law.of_probs(q), 0)
    assert ids.tolist() == list(range(6)) and np.allclose(rest, [0, 0, 0, 0, 0.3, 0.3])
    corrections = [accept_rejection(np.array([0]), [q], p, rng) for _ in range(2000)]
    assert all(r.n_accepted == 1 or r.next_token in (4, 5) for r in corrections)
