"""A goodness-of-fit check for sampled tokens against an exact distribution, its power, and
noise drawn for many runs at once."""

from __future__ import annotations

import numpy as np

from specedge.kernels.noise import DenseNoise
from specedge.kernels.sampling import Draws

ALPHA_Z = 4.4  # two-sided per-cell threshold; with up to ~30 cells a false alarm is < 1 in 3000
SHIFT = 0.01  # the mass a test must see moved: from the likeliest token to a middling one


def merged_counts(counts: np.ndarray, expected: np.ndarray, min_expected: float = 20.0):
    """Merge cells with small expected counts into one, so the normal approximation holds."""
    small = expected < min_expected
    obs = np.append(counts[~small], counts[small].sum())
    exp = np.append(expected[~small], expected[small].sum())
    keep = exp > 0
    return obs[keep], exp[keep]


def fits(samples: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    """(passes, chi-square z-score, max per-cell z) of samples against the law `probs`.

    Two checks, both must pass: no cell is off by more than ALPHA_Z standard deviations, and the
    chi-square statistic is within 4.4 standard deviations of its mean (df). Together they flag a
    1% mass shift between a likely and a less likely token at 20,000 draws with power >= 0.94
    (`power`; tests/kernels/test_stats_tools.py shows it), a false alarm about 1 in 1000.
    """
    return fits_counts(np.bincount(samples, minlength=len(probs)).astype(np.float64), probs)


def fits_counts(counts: np.ndarray, probs: np.ndarray) -> tuple[bool, float, float]:
    """`fits` over the counts of each token [V]."""
    n = counts.sum()
    if np.any(counts[probs == 0] > 0):
        return False, np.inf, np.inf
    obs, exp = merged_counts(counts, n * probs)
    p = exp / n
    cell_z = np.abs(obs - exp) / np.sqrt(n * p * (1 - p) + 1e-12)
    chi2 = float(np.sum((obs - exp) ** 2 / exp))
    df = len(obs) - 1
    chi_z = (chi2 - df) / np.sqrt(2 * max(df, 1))
    return bool(cell_z.max() < ALPHA_Z and chi_z < ALPHA_Z), chi_z, float(cell_z.max())


def shifted(law: np.ndarray, shift: float = SHIFT) -> np.ndarray:
    """`law` with `shift` of mass moved from its likeliest token to the median one of its support
    (a total-variation distance of `shift`)."""
    support = np.flatnonzero(law > 0)
    order = support[np.argsort(law[support], kind="stable")]
    biased = law.copy()
    biased[order[-1]] -= shift
    biased[order[len(order) // 2]] += shift
    return biased


def power(law: np.ndarray, n: int, shift: float = SHIFT, reps: int = 1000, seed: int = 0) -> float:
    """The share of `reps` runs of n draws from `shifted(law, shift)` that `fits` rejects against law."""
    rng = np.random.default_rng(seed)
    biased = shifted(law, shift)
    return float(np.mean([not fits_counts(rng.multinomial(n, biased).astype(np.float64), law)[0]
                          for _ in range(reps)]))


def exponential_noise(runs: int, positions: int, vocab: int, seed: int) -> np.ndarray:
    """[runs, positions, vocab] i.i.d. Exp(1): the noise of many runs drawn in one call."""
    return np.random.default_rng(seed).standard_exponential((runs, positions, vocab))


class PresetDraws(Draws):
    """`Draws` of one run whose noise is given: row j is the noise of position start + j. The
    acceptance functions race on it as on keyed noise (whose own law tests/kernels/test_sampling.py
    checks), and the noise of 20,000 runs is one numpy call instead of 20,000 keyed streams."""

    def __init__(self, noise: np.ndarray, start: int = 0) -> None:
        super().__init__(0, noise.shape[-1])
        self.rows = noise
        self.start = start

    def position_noise(self, position: int) -> DenseNoise:  # type: ignore[override]
        return DenseNoise(self.rows[position - self.start])
