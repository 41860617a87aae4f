"""The tail totals and the draft's confidence summed natively (kernels/exp_sum.py, one pass of AVX-512 or
AVX2 over the row: new) against numpy's float32 exp summed in float64 (old), A/B in one process
(bench/sampled_ab.py), under temperature 0.7 and Qwen's defaults.

    .venv/bin/python bench/results/epyc-zen4-native-tail/ab.py bench/prompts-2-per-kind.jsonl 3 OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from specedge.bench import SAMPLING_MATRIX
from specedge.kernels import exp_sum, laws, sampling
from specedge.kernels.sampling import SamplingParams

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository's root

from bench.sampled_ab import run


def numpy_sum(z, top, scale, below=float("inf")):  # type: ignore[no-untyped-def]
    return exp_sum.numpy_sum(z, top, scale, below)


def use(old: bool, params: SamplingParams) -> None:
    laws.exp_sum = sampling.exp_sum = numpy_sum if old else exp_sum.exp_sum


if __name__ == "__main__":
    assert exp_sum.isas(), "the native library is absent: nothing to compare"
    run([SAMPLING_MATRIX[1], SAMPLING_MATRIX[3]], use)  # temperature 0.7; Qwen's defaults
