"""The tail sum (kernels/exp_sum.py, kernels/native/exp_sum.h): every instruction set's path equals the
numpy model bit for bit, and the sum is the one the law's definition asks for."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from specedge.kernels import exp_sum as sums
from specedge.kernels import native

needs_library = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                   reason=native.missing() or "library absent")


def rows(rng: np.random.Generator) -> list[np.ndarray]:
    """Rows of every length up to two blocks of lanes and a vocabulary's, with masked (-inf) and NaN ids."""
    out = [(rng.standard_normal(n) * 4).astype(np.float32) for n in (*range(34), 1000, 151_936)]
    for z in out[20:]:
        z[rng.integers(len(z), size=3)] = -np.inf
        z[rng.integers(len(z))] = np.nan
    return out


@needs_library
def test_every_path_equals_the_model_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    assert sums.isas()[-1] == "portable"
    for z in rows(rng):
        top = float(np.nanmax(z)) if len(z) and not np.isnan(z).all() else 0.0
        for scale, below in ((1.0, math.inf), (1 / 0.7, top - 0.7 * 12), (2.0, top - 1.0), (0.5, -math.inf)):
            want = sums.exp_sum_model(z, top, scale, below)
            for isa in sums.isas():
                assert sums.exp_sum(z, top, scale, below, isa=isa) == want, (isa, len(z), scale, below)


@needs_library
def test_the_sum_is_the_tail_weight_the_law_defines() -> None:
    rng = np.random.default_rng(4)
    z = (rng.standard_normal(151_936) * 3).astype(np.float32)
    z[:8] = -np.inf
    top, t = float(z.max()), 0.7
    below = np.float32(top - t * 12)
    z64 = z.astype(np.float64)
    want = np.exp((z64[z < below] - top) / t).sum()
    assert sums.exp_sum(z, top, 1 / t, float(below)) == pytest.approx(want, rel=1e-6)
    assert sums.numpy_sum(z, top, 1 / t, float(below)) == pytest.approx(want, rel=1e-6)  # the path without the library
    assert sums.exp_sum(z, top, 1.0) == pytest.approx(np.exp(z64 - top).sum(), rel=1e-6)


@needs_library
def test_a_path_this_cpu_lacks_is_one_error() -> None:
    with pytest.raises(ValueError, match="has no path 'sse9'"):
        sums.exp_sum(np.zeros(4, np.float32), 0.0, 1.0, isa="sse9")


def test_without_a_vector_path_numpy_sums(monkeypatch: pytest.MonkeyPatch) -> None:
    z = (np.random.default_rng(5).standard_normal(5000) * 3).astype(np.float32)
    top = float(z.max())
    monkeypatch.setattr(sums, "vector_path", lambda: False)  # a CPU whose only native path is the portable one
    assert sums.exp_sum(z, top, 2.0, top - 1.0) == sums.numpy_sum(z, top, 2.0, top - 1.0)
    monkeypatch.setattr(sums, "_entry", lambda: None)
    assert sums.exp_sum(z, top, 2.0, top - 1.0) == sums.numpy_sum(z, top, 2.0, top - 1.0)
    assert sums.exp_sum(z, top, 1.0) == pytest.approx(np.exp(z.astype(np.float64) - top).sum(), rel=1e-6)
    with pytest.raises(RuntimeError):
        sums.exp_sum(z, top, 1.0, isa="avx2")
