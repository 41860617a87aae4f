"""A top-p law's cost on a real row, top-p's denominator summed as `probabilities` sums it (old: float64
exps of the whole row) against the head's weights plus one native pass over the tail (new), per row:
the last prompt row of the default pair's target (151,936 ids) and the draft's head (81,920 ids) on a
chat prompt, `timeit` best of 5 x 50; the ids kept are compared too.

    .venv/bin/python bench/results/epyc-zen4-top-p-total/law.py
"""

from __future__ import annotations

import functools
import timeit

import numpy as np

import specedge
from specedge.kernels import laws
from specedge.kernels.sampling import SamplingParams

SETTINGS = {"T 0.7, top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
            "T 1.0, top_p 0.95": SamplingParams(temperature=1.0, top_p=0.95),
            "Qwen's defaults (top_k 20 first)": SamplingParams(temperature=0.7, top_k=20, top_p=0.8)}


def old_total(z, top, temperature, below, head):  # type: ignore[no-untyped-def]
    return laws.definition_total(z, top, temperature), 0.0


def main() -> None:
    model = specedge.load("qwen2.5-coder")
    gen = model.generator
    ids = gen.encode("Explain what a hash table is, briefly.", chat=True)
    target_row = gen.target.prefill(ids, gen.target.new_cache())
    draft = gen.drafter.model.model  # type: ignore[union-attr]
    draft_row = draft.prefill(ids, draft.new_cache())
    new_total = laws.total_weight
    for name, row in (("target", target_row), ("draft", draft_row)):
        for setting, params in SETTINGS.items():
            times, kept = [], []
            for total in (old_total, new_total):
                laws.total_weight = total
                run = functools.partial(laws.law, row, params)
                times.append(min(timeit.repeat(run, number=50, repeat=5)) / 50 * 1e3)
                kept.append(laws.law(row, params).ids)
            laws.total_weight = new_total
            print(f"{name} row ({len(row)} ids), {setting}: old {times[0]:.3f} ms, new {times[1]:.3f} ms, "
                  f"same ids: {np.array_equal(*kept)}")


if __name__ == "__main__":
    main()
