"""Would drafting overlapped with verification pay on this CPU? Times one round of γ draft steps
and a (γ+1)-row verification pass back to back (each with every core, as specedge runs them), and
the same two at once in two threads (each session on its share of the cores, so neither waits
for the other's threads), over a cache of 512 tokens; medians of --repeats.

    .venv/bin/python scripts/overlap.py [--target qwen2.5-coder-1.5b:int4] [--draft qwen2.5-coder-0.5b]

Overlapped drafting (the draft works on the next round while the target verifies this one) can
only gain where the overlapped pair takes less than the back-to-back pair: on a machine whose
decoding is bound by memory bandwidth both passes share the same bus, so the sum is the floor.
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
import time
from collections.abc import Callable

from specedge.device_profiles.cpu import cpu_info
from specedge.options import artifact_arg
from specedge.runtime import OnnxModel
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.engine.rows import ONE_ROW, RowPolicy

CONTEXT = 512


def prefilled(model: OnnxModel, rows: RowPolicy):
    cache = model.new_cache()
    model.prefill([100 + i % 50 for i in range(CONTEXT)], cache, rows)
    return cache


def median_seconds(work: Callable[[], object], repeats: int) -> float:
    work()
    runs = []
    for _ in range(repeats):
        start = time.perf_counter()
        work()
        runs.append(time.perf_counter() - start)
    return statistics.median(runs)


def both_at_once(first: Callable[[], object], second: Callable[[], object]) -> None:
    thread = threading.Thread(target=second)
    thread.start()
    first()
    thread.join()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-1.5b:int4")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--gammas", default="1,3,5")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    target_path, draft_path = artifact_arg(args.target), artifact_arg(args.draft)
    cores = os.cpu_count() or 1
    split = max(cores // 2, 1)
    target, draft = OnnxModel(target_path), OnnxModel(draft_path)
    target_half, draft_half = OnnxModel(target_path, threads=split), OnnxModel(draft_path, threads=split)
    rows = probe_rows(target)
    caches = {m: prefilled(m, rows if m in (target, target_half) else ONE_ROW)
              for m in (target, draft, target_half, draft_half)}

    def verify(model: OnnxModel, width: int) -> Callable[[], object]:
        return lambda: model.forward([200] * width, caches[model], all_logits=True, rows=rows)

    def drafts(model: OnnxModel, gamma: int) -> Callable[[], object]:
        return lambda: [model.forward([200], caches[model]) for _ in range(gamma)]

    print(f"CPU: {cpu_info().label()}; target {target_path.name} (rows in groups of {rows.group}), "
          f"draft {draft_path.name}; {cores} cores, {split} per session when overlapped")
    print("| γ | drafts, all cores | verify γ+1, all cores | back to back | overlapped (drafts, verify, both) "
          "| overlapped / back to back |")
    print("|---|---|---|---|---|---|")
    for gamma in map(int, args.gammas.split(",")):
        width = gamma + 1 + (-(gamma + 1) % rows.group)
        t_draft = median_seconds(drafts(draft, gamma), args.repeats)
        t_verify = median_seconds(verify(target, width), args.repeats)
        serial = median_seconds(lambda g=gamma, w=width: (drafts(draft, g)(), verify(target, w)()), args.repeats)
        d_half = median_seconds(drafts(draft_half, gamma), args.repeats)
        v_half = median_seconds(verify(target_half, width), args.repeats)
        overlapped = median_seconds(lambda g=gamma, w=width: both_at_once(verify(target_half, w),
                                                                            drafts(draft_half, g)), args.repeats)
        print(f"| {gamma} | {t_draft * 1e3:.1f} ms | {t_verify * 1e3:.1f} ms | {serial * 1e3:.1f} ms | "
              f"{d_half * 1e3:.1f}, {v_half * 1e3:.1f}, {overlapped * 1e3:.1f} ms | {overlapped / serial:.2f} |")


if __name__ == "__main__":
    main()
