import numpy as np
import pytest

from specedge.kernels.sampling import SamplingParams, probabilities, sample, softmax

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


def test_top_k_then_top_p_batched_rows() -> None:
    rows = np.stack([LOGITS, LOGITS[::-1]])
    p = probabilities(rows, SamplingParams(temperature=0.7, top_k=3, top_p=0.9))
    np.testing.assert_allclose(p.sum(axis=-1), 1.0)
    assert np.count_nonzero(p[0]) <= 3 and p[0, 0] > 0 and p[1, -1] > 0


def test_invalid_params_are_rejected() -> None:
    for kwargs in ({"temperature": -1.0}, {"top_k": -2}, {"top_p": 0.0}, {"top_p": 1.5}):
        with pytest.raises(ValueError):
            SamplingParams(**kwargs)


def test_sample_frequencies_follow_probs() -> None:
    rng = np.random.default_rng(0)
    p = np.array([0.5, 0.3, 0.2, 0.0])
    draws = np.array([sample(p, rng) for _ in range(20000)])
    freq = np.bincount(draws, minlength=4) / len(draws)
    np.testing.assert_allclose(freq, p, atol=0.015)
    assert freq[3] == 0
