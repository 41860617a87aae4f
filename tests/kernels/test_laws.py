"""The sparse laws (kernels/laws.py) are `probabilities`' laws, and a race over one picks the token a
race over every id picks on the same noise - with a tail too, where the tail's ids can win."""

from __future__ import annotations

import numpy as np
import pytest

from specedge.kernels import laws as laws_module
from specedge.kernels.laws import HEAD_SPAN, Law, Laws, law
from specedge.kernels.noise import KeyedNoise
from specedge.kernels.sampling import SamplingParams, probabilities, race

SETTINGS = [SamplingParams(temperature=0.7), SamplingParams(temperature=1.3),
            SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=0.7, top_k=20, top_p=0.8),
            SamplingParams(temperature=0.7, min_p=0.05), SamplingParams(temperature=1.0, top_k=40, top_p=0.95,
                                                                        min_p=0.05),
            SamplingParams(temperature=2.0, top_p=0.99), SamplingParams(temperature=0.5, top_k=1),
            SamplingParams(temperature=1e-3, top_p=0.5), SamplingParams(temperature=1.0, min_p=1.0)]


def rows(vocab: int = 3000, seed: int = 0) -> list[np.ndarray]:
    """float32 rows of logits as models give them: peaked, flat, tied at the top and at a cut's edge,
    masked by a grammar, and one whose tail beyond the head span holds most of the mass."""
    rng = np.random.default_rng(seed)
    peaked = (rng.standard_normal(vocab) * 2.5).astype(np.float32)
    peaked[7] += 14
    flat = (rng.standard_normal(vocab) * 0.3).astype(np.float32)
    tied = np.round(rng.standard_normal(vocab) * 2).astype(np.float32)  # many exact ties
    masked = peaked.copy()
    masked[rng.random(vocab) < 0.9] = -np.inf
    heavy_tail = np.full(vocab, -HEAD_SPAN - 0.5, dtype=np.float32)
    heavy_tail[:3] = 0.0
    return [peaked, flat, tied, masked, heavy_tail]


@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_a_law_is_the_probabilities_law(params: SamplingParams) -> None:
    for row in rows():
        want = probabilities(row, params)
        got = law(row, params)
        np.testing.assert_allclose(got.dense(len(row)), want, rtol=1e-6, atol=1e-12)
        assert (got.dense(len(row)) > 0).tolist() == (want > 0).tolist()  # the same support, ties at edges too
        assert got.prob(int(np.argmax(want))) == pytest.approx(want.max(), rel=1e-6)
        ids = np.array([0, 7, len(row) - 1, int(np.argmax(want))])
        np.testing.assert_allclose(got.probs_at(ids), want[ids], rtol=1e-6, atol=1e-12)


def test_greedy_is_the_argmax_alone() -> None:
    row = rows()[0]
    got = law(row, SamplingParams())
    assert got.ids.tolist() == [int(np.argmax(row))] and got.prob(int(np.argmax(row))) == 1.0


@pytest.mark.parametrize("span", [HEAD_SPAN, 2.0])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_a_race_over_a_law_is_the_race_over_every_id(params: SamplingParams, span: float,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The same noise, the same token: the head's race with the tail's blocks read where they could
    win equals the dense race over `probabilities` (ties aside, which continuous noise never makes).
    A head of 2 temperatures leaves a tail that wins often."""
    monkeypatch.setattr(laws_module, "HEAD_SPAN", span)
    tail_wins = 0
    for r, row in enumerate(rows(vocab=2000, seed=3)):
        p, sparse = probabilities(row, params), law(row, params)
        for position in range(60):
            noise = KeyedNoise(r, position, len(row))
            token = sparse.race(noise)
            assert token == race(p, noise.dense()), (r, position)
            tail_wins += sparse.tail is not None and token not in sparse.ids
    if span == 2.0 and params.top_k == 0 and params.top_p == 1.0 and params.min_p == 0.0:
        assert tail_wins > 10  # the tail's ids won races, and were found


def test_a_forgotten_tail_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a race that skips the tail picks other tokens than the full race."""
    monkeypatch.setattr(laws_module, "HEAD_SPAN", 2.0)
    row = (np.random.default_rng(2).standard_normal(2000) * 1.5).astype(np.float32)  # most mass beyond 2 of the top
    sparse = law(row, SamplingParams(temperature=1.0))
    headless = Law(sparse.ids, sparse.weights)  # the bug: the tail forgotten
    assert sparse.tail is not None
    differs = sum(headless.race(KeyedNoise(0, i, 2000)) != race(probabilities(row, SamplingParams(temperature=1.0)),
                                                                KeyedNoise(0, i, 2000).dense()) for i in range(100))
    assert differs > 10


def test_laws_of_a_pass_are_computed_when_read() -> None:
    logits = np.stack(rows(vocab=500)[:3])
    laws = Laws(logits, SamplingParams(temperature=0.8, top_p=0.9))
    assert len(laws) == 3 and laws._laws == {}
    np.testing.assert_allclose(laws[-1].dense(500), probabilities(logits[2], laws.params), rtol=1e-6, atol=1e-12)
    assert list(laws._laws) == [2] and laws[2] is laws[-1]
    with pytest.raises(IndexError):
        laws[3]


def test_a_truncated_heads_law_covers_its_ids_only() -> None:
    """A draft scoring the first ids only: its law (and its tail) never names an id beyond them."""
    row = rows(vocab=800)[1][:300]
    q = law(row, SamplingParams(temperature=1.0))
    assert q.prob(500) == 0.0 and q.dense(800)[300:].sum() == 0.0
    assert q.race(KeyedNoise(1, 2, 800)) < 300


TAIL_RUNS = 20_000


def rejection_tokens(p_row: np.ndarray, q_row: np.ndarray, params: SamplingParams, seed: int) -> np.ndarray:
    """The first emitted token of TAIL_RUNS rounds of one draft from q checked against p by the
    rejection rule on sparse laws: the draft if accepted, else the correction."""
    from specedge.kernels.acceptance import accept_rejection

    rng = np.random.default_rng(seed)
    q_law, q = law(q_row, params), probabilities(q_row, params)
    laws = Laws(np.stack([p_row, p_row]), params)
    out = np.empty(TAIL_RUNS, dtype=np.int64)
    for i in range(TAIL_RUNS):
        drafted = int(rng.choice(len(q), p=q))
        result = accept_rejection(np.array([drafted]), [q_law], laws, rng)
        out[i] = drafted if result.n_accepted else result.next_token
    return out


@pytest.mark.parametrize("broken", [False, True])
def test_corrections_beyond_the_heads_follow_the_residual(broken: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Laws with tails (a head of half a temperature: most ids beyond it): the rule's tokens follow p.
    The negative control keeps every id drawn beyond the heads (the residual's max(0, p - q) / p test
    skipped there) and must fail."""
    from specedge.kernels import acceptance
    from tests.stats_tools import fits, power

    monkeypatch.setattr(laws_module, "HEAD_SPAN", 0.5)
    rng = np.random.default_rng(11)
    p_row = (rng.standard_normal(24) * 0.8).astype(np.float32)
    q_row = (p_row + rng.standard_normal(24) * 0.9).astype(np.float32)
    params = SamplingParams(temperature=1.0)
    p = probabilities(p_row, params)
    assert law(p_row, params).tail is not None and len(law(p_row, params).ids) < 12
    if broken:
        real = acceptance.correct

        def keep_all(p_law, q_law, drafted, rng):  # type: ignore[no-untyped-def]
            ids, rest = acceptance.residual(p_law, q_law, drafted)
            if rng.random() * (rest.sum() + acceptance.outside(p_law, ids)) < rest.sum():
                return real(p_law, q_law, drafted, rng)
            return acceptance.draw_beyond(p_law, ids, rng)  # the bug: no (p - q) / p test

        monkeypatch.setattr(acceptance, "correct", keep_all)
    assert power(p, TAIL_RUNS) >= 0.9
    assert fits(rejection_tokens(p_row, q_row, params, seed=5), p)[0] != broken


def test_a_bonus_from_a_law_with_a_tail_follows_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.kernels.acceptance import draw_law
    from tests.stats_tools import fits

    monkeypatch.setattr(laws_module, "HEAD_SPAN", 0.5)
    row = (np.random.default_rng(4).standard_normal(24) * 0.8).astype(np.float32)
    params, rng = SamplingParams(temperature=1.0), np.random.default_rng(0)
    sparse = law(row, params)
    samples = np.array([draw_law(sparse, rng) for _ in range(TAIL_RUNS)])
    assert sparse.tail is not None and np.isin(samples, sparse.ids, invert=True).any()
    assert fits(samples, probabilities(row, params))[0]


def test_corrections_that_give_up_on_the_tail_still_follow_the_residual(monkeypatch: pytest.MonkeyPatch) -> None:
    """`correct` stops drawing beyond the heads after MAX_TAIL_TRIES and reads both rows whole: with one
    try (the dense fallback taken on most tail draws) the rule's tokens still follow p."""
    from specedge.kernels import acceptance
    from tests.stats_tools import fits

    monkeypatch.setattr(laws_module, "HEAD_SPAN", 0.5)
    monkeypatch.setattr(acceptance, "MAX_TAIL_TRIES", 1)
    rng = np.random.default_rng(11)
    p_row = (rng.standard_normal(24) * 0.8).astype(np.float32)
    q_row = (p_row + rng.standard_normal(24) * 0.9).astype(np.float32)
    params = SamplingParams(temperature=1.0)
    assert fits(rejection_tokens(p_row, q_row, params, seed=6), probabilities(p_row, params))[0]


def test_a_correction_reads_the_tail_a_bounded_number_of_times(monkeypatch: pytest.MonkeyPatch) -> None:
    """q equal to p but for a sliver of one head id: the residual lives almost wholly in the head, while
    the tail (where p - q = 0) draws almost every try; the loop gives up after MAX_TAIL_TRIES tail draws
    and the dense residual gives the one id it can draw."""
    from specedge.kernels import acceptance

    monkeypatch.setattr(laws_module, "HEAD_SPAN", 0.5)
    p_row = np.zeros(2000, dtype=np.float32)
    p_row[:2] = 0.6
    q_row = p_row.copy()
    q_row[0] -= 1e-5
    params = SamplingParams(temperature=1.0)
    p_law, q_law = law(p_row, params), law(q_row, params)
    assert p_law.tail is not None
    reads = []
    real = acceptance.draw_beyond
    monkeypatch.setattr(acceptance, "draw_beyond", lambda *args: reads.append(1) or real(*args))
    rng = np.random.default_rng(0)
    tokens = {acceptance.correct(p_law, q_law, 0, rng) for _ in range(20)}
    assert len(reads) <= 20 * acceptance.MAX_TAIL_TRIES and tokens == {0}


@pytest.mark.parametrize("seed", [0, 3, 5, 25])
def test_a_nucleus_of_a_flat_full_size_row_keeps_the_probabilities_ids(seed: int) -> None:
    """A Qwen-sized row (151,936 ids) flat enough that the nucleus holds most of them: top-p 0.9, 0.99
    and 0.999 keep the very ids `probabilities` keeps (a float32 total moved the cut by an id or two
    in these rows)."""
    rng = np.random.default_rng(seed)
    row = (rng.standard_normal(151_936) * rng.uniform(1, 4)).astype(np.float32)
    row[rng.integers(0, len(row), 5)] += rng.uniform(5, 15)
    for top_p in (0.9, 0.99, 0.999):
        for temperature in (0.7, 1.5):
            params = SamplingParams(temperature=temperature, top_p=top_p)
            want = np.flatnonzero(probabilities(row, params) > 0)
            np.testing.assert_array_equal(law(row, params).ids, want, err_msg=str(params))


@pytest.mark.parametrize("allowed", [1, 3, 40, 500])
def test_top_k_of_a_row_a_grammar_masks_keeps_its_allowed_ids(allowed: int) -> None:
    """A grammar leaves `allowed` ids finite (-inf elsewhere): top-k 40 keeps the ids `probabilities`
    keeps, all of them where fewer than k are left, with no overflow on the way."""
    rng = np.random.default_rng(allowed)
    row = np.full(151_936, -np.inf, dtype=np.float32)
    ids = rng.choice(len(row), allowed, replace=False)
    row[ids] = rng.standard_normal(allowed).astype(np.float32) * 2
    params = SamplingParams(temperature=0.7, top_k=40, top_p=0.95)
    with np.errstate(all="raise"):
        got = law(row, params)
    np.testing.assert_array_equal(got.ids, np.flatnonzero(probabilities(row, params) > 0))


@pytest.mark.parametrize("k", [1, 20, 40, 2999])
def test_top_k_far_below_the_top_widens_until_it_holds_k(k: int) -> None:
    """One logit far above the rest (its k-th largest many spans below, ties at the edge): top-k widens
    its span step by step and keeps the ids `probabilities` keeps."""
    rng = np.random.default_rng(k)
    row = np.round(rng.uniform(0, 50, 3000)).astype(np.float32)  # ties
    row[11] = 60.0  # 10 above the rest: outside the first span, inside float64 weights
    params = SamplingParams(temperature=0.7, top_k=k)
    np.testing.assert_array_equal(law(row, params).ids, np.flatnonzero(probabilities(row, params) > 0))


def test_top_p_sums_its_denominator_natively_and_again_only_where_a_cut_is_that_close(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Top-p's denominator comes from the head's weights and one native pass over the tail; the row is
    summed again as `probabilities` sums it only where an id's mass before it lies within that sum's error
    of top_p - and the ids kept are the definition's either way (a flat row whose nucleus runs deep into
    the tail: the native total 2e-8 off moved the cut of top-p 0.999 by an id)."""
    again: list[float] = []
    definition = laws_module.definition_total
    monkeypatch.setattr(laws_module, "definition_total", lambda *a: again.append(1) or definition(*a))
    for row in rows(vocab=5000, seed=4)[:3]:
        for params in (SamplingParams(temperature=0.7, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.95)):
            np.testing.assert_array_equal(law(row, params).ids, np.flatnonzero(probabilities(row, params) > 0))
    assert not again  # the native total decided every cut
    rng = np.random.default_rng(25)
    row = (rng.standard_normal(151_936) * rng.uniform(1, 4)).astype(np.float32)
    row[rng.integers(0, len(row), 5)] += rng.uniform(5, 15)
    params = SamplingParams(temperature=0.7, top_p=0.999)
    np.testing.assert_array_equal(law(row, params).ids, np.flatnonzero(probabilities(row, params) > 0))
    assert len(again) == 1
    weights = np.array([0.5, 0.3, 0.2])
    assert laws_module.cut_within(np.arange(3), weights, 1.0, SamplingParams(temperature=1.0, top_p=0.8), 1e-6) is None
    assert laws_module.cut_within(np.arange(3), weights, 1.0, SamplingParams(temperature=1.0, top_p=0.7),
                                  1e-6).ids.tolist() == [0, 1]
