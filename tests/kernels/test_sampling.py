import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.sampling import (
    Draws,
    SamplingParams,
    probabilities,
    race,
    softmax,
    top_probability,
)
from tests.stats_tools import fits, power, shifted

LOGITS = np.array([2.0, 1.0, 0.5, 0.0, -1.0, -3.0])


def test_greedy_is_one_hot_of_argmax() -> None:
    p = probabilities(LOGITS, SamplingParams())
    assert p.tolist() == [1.0, 0, 0, 0, 0, 0]


def test_temperature_one_is_softmax_and_temperature_scales() -> None:
    np.testing.assert_allclose(probabilities(LOGITS, SamplingParams(temperature=1.0)), softmax(LOGITS))
    np.testing.assert_allclose(probabilities(LOGITS, SamplingParams(temperature=0.5)), softmax(LOGITS * 2))


def test_top_k_keeps_k_largest_renormalised() -> None:
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_k=2))
    e = np.exp(LOGITS[:2])
    np.testing.assert_allclose(p[:2], e / e.sum())
    assert np.all(p[2:] == 0)


def test_top_p_keeps_smallest_prefix_reaching_p() -> None:
    full = softmax(LOGITS)  # sorted descending already
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=0.8))
    n_keep = int(np.searchsorted(np.cumsum(full), 0.8) + 1)
    assert np.count_nonzero(p) == n_keep
    np.testing.assert_allclose(p[:n_keep], full[:n_keep] / full[:n_keep].sum())


def test_min_p_drops_tokens_below_a_fraction_of_the_likeliest() -> None:
    full = softmax(LOGITS)
    p = probabilities(LOGITS, SamplingParams(temperature=1.0, min_p=0.2))
    kept = full >= 0.2 * full.max()
    assert kept.tolist() == [True, True, True, False, False, False]
    np.testing.assert_allclose(p, np.where(kept, full, 0) / full[kept].sum())
    assert probabilities(LOGITS, SamplingParams(temperature=1.0, min_p=1.0)).tolist() == [1.0, 0, 0, 0, 0, 0]
    for top_p in (0.5, 0.9):  # the two cuts keep prefixes of one order: the law is the same either way
        both = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=top_p, min_p=0.2))
        nucleus = probabilities(LOGITS, SamplingParams(temperature=1.0, top_p=top_p))
        kept_both = (nucleus > 0) & kept
        np.testing.assert_allclose(both, np.where(kept_both, full, 0) / full[kept_both].sum())


def test_top_k_then_top_p_batched_rows() -> None:
    rows = np.stack([LOGITS, LOGITS[::-1]])
    p = probabilities(rows, SamplingParams(temperature=0.7, top_k=3, top_p=0.9))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0)
    assert np.count_nonzero(p[0]) <= 3 and p[0, 0] > 0 and p[1, -1] > 0


@pytest.mark.parametrize("kwargs", [
    {"temperature": -1.0}, {"temperature": float("nan")}, {"temperature": float("inf")}, {"temperature": "0.7"},
    {"top_k": -2}, {"top_k": 2.5}, {"top_k": True},
    {"top_p": 0.0}, {"top_p": 1.5}, {"top_p": float("nan")}, {"top_p": -0.1},
    {"min_p": -0.1}, {"min_p": 1.5}, {"min_p": float("nan")}, {"min_p": "0.1"},
])
def test_invalid_params_are_rejected_with_what_to_do(kwargs: dict[str, object]) -> None:
    with pytest.raises(SpecEdgeError) as e:
        SamplingParams(**kwargs)
    name = next(iter(kwargs))
    assert name in e.value.problem and e.value.fix


def test_any_positive_temperature_gives_a_distribution() -> None:
    """A temperature far below the logits' gaps used to overflow into NaN (and pick the last id)."""
    for t in (1e-300, 5e-324, 1e-3, 1e6):
        p = probabilities(LOGITS, SamplingParams(temperature=t))
        assert np.all(np.isfinite(p)) and abs(p.sum() - 1) < 1e-12 and int(np.argmax(p)) == 0
    np.testing.assert_allclose(probabilities(LOGITS, SamplingParams(temperature=1e-300)), [1, 0, 0, 0, 0, 0])


RACE_LAW = np.array([0.5, 0.3, 0.2, 0.0])
RACE_DRAWS = 40_000  # power 0.91 against a 1% shift of RACE_LAW (20,000: 0.57)


def wrong_race(p: np.ndarray, noise: np.ndarray) -> int:
    """A broken race: noise multiplied by p instead of divided (the argmin then favours the unlikely)."""
    with np.errstate(divide="ignore"):
        return int(np.argmin(np.where(p > 0, noise * p, np.inf)))


@pytest.mark.parametrize("rule", ["race", "broken race"])
def test_a_race_on_fresh_noise_follows_probs(rule: str) -> None:
    """RACE_DRAWS races against the exact law by the suite's test (power >= 0.9 against a 1% shift, not a
    hand-set tolerance); the broken race through the same test fails it (the negative control)."""
    assert power(RACE_LAW, RACE_DRAWS) >= 0.9
    rng = np.random.default_rng(0)
    pick = race if rule == "race" else wrong_race
    draws = np.array([pick(RACE_LAW, rng.standard_exponential(len(RACE_LAW))) for _ in range(RACE_DRAWS)])
    assert fits(draws, RACE_LAW)[0] == (rule == "race")


def test_race_never_picks_a_zero_probability_token() -> None:
    p = np.array([0.0, 1.0, 0.0])
    assert race(p, np.array([0.0, 5.0, 0.0])) == 1  # zero noise on a zero-probability id: no NaN win


def test_draws_are_keyed_by_seed_and_position_not_by_order() -> None:
    """The noise of a position is the same whoever asks first, however many positions were asked
    before, and after it was evicted from the draws' short memory."""
    a, b = Draws(7, 50, keep=2), Draws(7, 50, keep=2)
    first = a.noise(10).copy()
    for position in (3, 11, 12, 13):
        b.noise(position)
    np.testing.assert_array_equal(b.noise(10), first)
    np.testing.assert_array_equal(a.noise(10), first)
    assert not np.array_equal(a.noise(11), first)
    assert not np.array_equal(Draws(8, 50).noise(10), first)
    assert Draws(None, 50).seed != Draws(None, 50).seed  # no seed: a fresh one each time


def test_keyed_draws_follow_probs() -> None:
    draws = Draws(3, 4, keep=1)
    samples = np.array([draws.sample(RACE_LAW, i) for i in range(RACE_DRAWS)])
    assert fits(samples, RACE_LAW)[0] and not np.any(samples == 3)
    assert not fits(samples, shifted(RACE_LAW))[0]  # the same draws are not taken for a law 1% away


def test_keyed_noise_is_pinned() -> None:
    """What a seed gives must not drift with numpy's releases or a refactoring: these values are
    part of the promise that a seed reproduces a run (kernels/noise.py)."""
    np.testing.assert_allclose(Draws(0, 3).noise(0), [0.2870755199907489, 1.303199365309439, 5.025529371209983],
                               rtol=1e-15)
    noise = Draws(42, 151936).position_noise(1000)
    np.testing.assert_allclose(noise.at(np.array([0, 151935])), [2.220481807246197, 1.5265849936627547], rtol=1e-15)


def test_top_probability_is_the_softmax_maximum_and_ignores_masked_ids() -> None:
    logits = np.random.default_rng(3).normal(size=1000).astype(np.float32) * 4
    assert top_probability(logits) == pytest.approx(softmax(logits).max(), rel=1e-5)
    masked = logits.copy()
    masked[10:] = -np.inf  # a grammar's mask: only the first 10 ids allowed
    assert top_probability(masked) == pytest.approx(softmax(logits[:10]).max(), rel=1e-5)
    assert top_probability(np.zeros(4, np.float32)) == pytest.approx(0.25)
