"""A goodness-of-fit check for sampled tokens against an exact distribution."""

from __future__ import annotations

import numpy as np

ALPHA_Z = 4.4  # two-sided per-cell threshold; with up to ~30 cells a false alarm is < 1 in 3000


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
    1% mass shift between a likely and a less likely token at 20,000 draws
    (tests/kernels/test_stats_tools.py shows it).
    """
    n = len(samples)
    counts = np.bincount(samples, minlength=len(probs)).astype(np.float64)
    if np.any(counts[probs == 0] > 0):
        return False, np.inf, np.inf
    obs, exp = merged_counts(counts, n * probs)
    p = exp / n
    cell_z = np.abs(obs - exp) / np.sqrt(n * p * (1 - p) + 1e-12)
    chi2 = float(np.sum((obs - exp) ** 2 / exp))
    df = len(obs) - 1
    chi_z = (chi2 - df) / np.sqrt(2 * max(df, 1))
    return bool(cell_z.max() < ALPHA_Z and chi_z < ALPHA_Z), chi_z, float(cell_z.max())
