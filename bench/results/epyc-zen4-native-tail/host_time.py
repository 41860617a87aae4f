"""Host time a round (a round's wall time less its ONNX Runtime passes) of the default pair by sampling
setting and rule, on one kind of bench/prompts-2-per-kind.jsonl: the decoding loop's own cost beside its
passes. Two rounds over the kind's prompts, the second counted.

    .venv/bin/python bench/results/epyc-zen4-native-tail/host_time.py chat
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from specedge.bench import SAMPLING_MATRIX, Job, decode
from specedge.defaults import pair_decoding
from specedge.options import pair_paths
from specedge.runtime import SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.round import decoding
from specedge.runtime.round.drafters import build_drafter

PASSES = [0.0]  # seconds in ONNX Runtime so far
ROUNDS = [0.0, 0]  # host seconds, rounds


def timed_passes(model: OnnxModel) -> None:
    run = model.session.run_with_iobinding

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        try:
            return run(*args, **kwargs)
        finally:
            PASSES[0] += time.perf_counter() - start

    model.session.run_with_iobinding = timed


def timed_rounds() -> None:
    play = decoding.play_round

    def timed(*args, **kwargs):  # type: ignore[no-untyped-def]
        passes, start = PASSES[0], time.perf_counter()
        try:
            return play(*args, **kwargs)
        finally:
            ROUNDS[0] += time.perf_counter() - start - (PASSES[0] - passes)
            ROUNDS[1] += 1

    decoding.play_round = timed


def main() -> None:
    kind = sys.argv[1]
    rows_of = [json.loads(line) for line in Path("bench/prompts-2-per-kind.jsonl").read_text().splitlines() if line]
    prompts = [row for row in rows_of if row["kind"] == kind]
    _, draft_dir = pair_paths("qwen2.5-coder", None, None)
    way = pair_decoding("qwen2.5-coder")
    draft, target = OnnxModel(draft_dir), OnnxModel(way.target)
    rows = probe_rows(target)
    for model in (draft, target):
        timed_passes(model)
    timed_rounds()
    settings = {"greedy": SAMPLING_MATRIX[0], "temperature 0.7": SAMPLING_MATRIX[1],
                "Qwen's defaults": SAMPLING_MATRIX[3]}
    jobs = {}
    for name, params in settings.items():
        for rule in ["race"] if params.greedy else ["race", "rejection"]:
            config = SpecConfig.auto(sampling=params, seed=1 if rule == "race" else None, acceptance=rule)
            jobs[f"{name}, {rule}"] = Job("default", target, build_drafter(draft, ngram=way.ngram), config, rows=rows)
    host = {name: [0.0, 0] for name in jobs}
    for r in range(2):
        for row in prompts:
            for name, job in jobs.items():
                ROUNDS[:] = [0.0, 0]
                decode(job, row, 96)
                if r:
                    host[name][0] += ROUNDS[0]
                    host[name][1] += ROUNDS[1]
    for name, (seconds, count) in host.items():
        print(f"{kind}, {name}: {seconds / count * 1e3:.2f} ms of host time a round over {count} rounds")


if __name__ == "__main__":
    main()
