"""The keyed noise of the race (kernels/noise.py): i.i.d. Exp(1) per id, keyed by (seed, position,
id), whose blocks' minima are known without their members. A construction that gets the blocks'
law wrong must fail the same checks (the negative controls)."""

from __future__ import annotations

import numpy as np
import pytest

from specedge.kernels import noise as noise_module
from specedge.kernels.noise import NOISE_BLOCK, DenseNoise, KeyedNoise, uniforms

KS_LIMIT = 1.95  # sqrt(n) x the Kolmogorov-Smirnov distance: exceeded by chance once in ~1000 runs


def ks_exponential(values: np.ndarray) -> float:
    """sqrt(n) x the largest gap between the empirical distribution and Exp(1)'s."""
    x = np.sort(values)
    n = len(x)
    cdf = 1.0 - np.exp(-x)
    gap = max(np.max(np.arange(1, n + 1) / n - cdf), np.max(cdf - np.arange(n) / n))
    return float(np.sqrt(n) * gap)


def pooled(vocab: int, positions: int, seed: int = 5) -> np.ndarray:
    """[positions, vocab] noise of consecutive positions."""
    return np.stack([KeyedNoise(seed, p, vocab).dense() for p in range(positions)])


def test_every_id_is_exponential() -> None:
    """Each id's noise (the block's minimum slot or another, the last short block too) is Exp(1)."""
    values = pooled(NOISE_BLOCK * 3 + 100, 400)
    for column in (0, 1, NOISE_BLOCK - 1, NOISE_BLOCK * 3 + 99):  # a first, middle, last and a short block's
        assert ks_exponential(values[:, column]) < KS_LIMIT, column
    assert ks_exponential(values.ravel()[::7]) < KS_LIMIT


def test_a_blocks_values_are_independent() -> None:
    """Within a block: the minimum of b values is Exp(b) (b x min is Exp(1)), the second smallest
    gap is Exp(b - 1), and neighbours do not correlate."""
    values = pooled(NOISE_BLOCK * 2, 2000)
    block = np.sort(values[:, :NOISE_BLOCK], axis=1)
    assert ks_exponential(NOISE_BLOCK * block[:, 0]) < KS_LIMIT
    assert ks_exponential((NOISE_BLOCK - 1) * (block[:, 1] - block[:, 0])) < KS_LIMIT
    r = np.corrcoef(values[:, 10], values[:, 11])[0, 1]
    assert abs(r) < 4 / np.sqrt(len(values))


def test_a_wrong_block_law_fails_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Negative control: a block minimum drawn as a plain uniform (not Beta(1, b)) must fail."""
    real = KeyedNoise.__init__

    def wrong(self: KeyedNoise, seed: int, position: int, vocab: int, purpose: int = 0) -> None:
        real(self, seed, position, vocab, purpose)
        self.low = uniforms(self.keys[0], np.arange(len(self.low))) / 10  # the bug: not a minimum of b
        self.block_floor = noise_module.exponentials(self.low)

    monkeypatch.setattr(KeyedNoise, "__init__", wrong)
    values = pooled(NOISE_BLOCK, 1000)
    assert ks_exponential(NOISE_BLOCK * values.min(axis=1)) > KS_LIMIT


def test_noise_is_a_function_of_seed_position_and_id() -> None:
    a, b = KeyedNoise(3, 17, 1000), KeyedNoise(3, 17, 1000)
    ids = np.array([999, 5, 300, 5])
    np.testing.assert_array_equal(a.at(ids), b.dense()[ids])  # in any order, any subset
    assert not np.array_equal(KeyedNoise(3, 18, 1000).dense(), a.dense())
    assert not np.array_equal(KeyedNoise(4, 17, 1000).dense(), a.dense())
    np.testing.assert_array_equal(KeyedNoise(3, 17, 2000).at(ids[:3]), a.at(ids[:3]))  # the vocabulary's size aside


@pytest.mark.parametrize("make", [lambda v: KeyedNoise(9, 4, v), lambda v: DenseNoise(np.random.default_rng(1)
                                                                                       .standard_exponential(v))])
def test_the_block_floor_is_each_blocks_smallest_value(make) -> None:  # type: ignore[no-untyped-def]
    vocab = NOISE_BLOCK * 4 + 17
    noise = make(vocab)
    values = noise.dense()
    least = np.minimum.reduceat(values, np.arange(0, vocab, NOISE_BLOCK))
    assert np.all(noise.block_floor <= least)  # a bound where the last block is short (its other ids unread)
    np.testing.assert_array_equal(noise.block_floor[:-1], least[:-1])
