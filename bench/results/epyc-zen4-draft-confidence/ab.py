"""How far the draft drafts under sampling: its confidence from its untempered softmax (new) against the
largest probability of its sampled law, cut by top-k/top-p/min-p and tempered (old), A/B in one process
(bench/sampled_ab.py), under every sampled setting of the matrix.

    .venv/bin/python bench/results/epyc-zen4-draft-confidence/ab.py bench/prompts-2-per-kind.jsonl 3 OUT.json
"""

from __future__ import annotations

import sys
from pathlib import Path

from specedge.bench import SAMPLING_MATRIX
from specedge.kernels.laws import law
from specedge.kernels.sampling import SamplingParams
from specedge.runtime.round import drafters

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository's root

from bench.sampled_ab import run

NEW = drafters.top_probability
CURRENT: dict = {}  # the job running now: which confidence, under which setting


def confidence(logits):  # type: ignore[no-untyped-def]
    if CURRENT["old"] and not CURRENT["params"].greedy:
        q = law(logits, CURRENT["params"])
        return float(q.weights.max()) / q.total
    return NEW(logits)


def use(old: bool, params: SamplingParams) -> None:
    CURRENT.update(old=old, params=params)


if __name__ == "__main__":
    drafters.top_probability = confidence
    run([s for s in SAMPLING_MATRIX if not s.greedy], use)
