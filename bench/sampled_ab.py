"""An A/B of two ways of sampled speculative decoding in one process (bench/results/*/ab.py use it).

The default pair as `specedge.load` gives it (the int4 target, its 0.5B draft and the n-gram lookup, γ
auto), each prompt decoded by plain sampling and by the default under each rule (the race, seeded; the
rejection rule), the old and the new way taking turns with plain decoding prompt by prompt, order
rotated, each mode's Generator kept across prompts as chat keeps it; every run is written to the output
JSON, and the medians of the tokens/s ratios taken in turns are printed as a table.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from specedge.bench import Job, decode, rotated, setting_name
from specedge.defaults import pair_decoding
from specedge.kernels.sampling import SamplingParams
from specedge.options import pair_paths
from specedge.runtime import SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.row_groups import probe_rows
from specedge.runtime.round.drafters import build_drafter


def run(settings: Sequence[SamplingParams], switch: Callable[[bool, SamplingParams], None]) -> None:
    """The A/B over argv's prompts (JSONL), rounds and output path: `switch(old, params)` turns the old
    or the new way on before each decode; prints the report."""
    prompts = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    rounds, out = int(sys.argv[2]), Path(sys.argv[3])
    target_dir, draft_dir = pair_paths("qwen2.5-coder", None, None)
    draft = OnnxModel(draft_dir)
    way = pair_decoding("qwen2.5-coder")
    target, plain_target = OnnxModel(way.target), OnnxModel(target_dir, spin=True)  # shared: caches are per Generator
    rows = probe_rows(target)
    jobs = []
    for params in settings:
        name = setting_name(params)
        plain = Job("plain", plain_target, None, SpecConfig(gamma=0, sampling=params, seed=1), setting=name)
        jobs.append((plain, False))
        for rule in ("race", "rejection"):
            for old in (False, True):
                job = Job(f"{'old' if old else 'new'}-{rule}", target, build_drafter(draft, ngram=way.ngram),
                          SpecConfig.auto(sampling=params, seed=1 if rule == "race" else None, acceptance=rule),
                          rows=rows, setting=name)
                jobs.append((job, old))
    runs = []
    for r in range(rounds):
        for i, row in enumerate(prompts):
            for params in settings:
                name = setting_name(params)
                mine = [(j, o) for j, o in jobs if j.setting == name]
                for job, old in rotated(mine, r + i):
                    switch(old, params)
                    res = decode(job, row, 96)
                    runs.append({"round": r, "prompt": i, "kind": row["kind"], "setting": name, "mode": job.mode,
                                 "tokens_per_s": res.stats.tokens_per_s, "tokens": res.token_ids,
                                 "tokens_per_pass": res.stats.tokens_per_target_pass,
                                 "mb_per_token": res.stats.bytes_per_token["total_bytes"] / 1e6})
            print(f"round {r} prompt {i} done", file=sys.stderr, flush=True)
        out.write_text(json.dumps(runs))
    report(runs)


def report(runs: list[dict]) -> None:
    def rate(r: int, i: int, s: str, m: str) -> dict:
        return next(x for x in runs if (x["round"], x["prompt"], x["setting"], x["mode"]) == (r, i, s, m))

    print("| setting | kind | rule | new / plain | old / plain | new / old | tokens a pass new, old "
          "| MB/token new, old |")
    print("|---|---|---|---|---|---|---|---|")
    for s in dict.fromkeys(x["setting"] for x in runs):
        for kind in [*dict.fromkeys(x["kind"] for x in runs), "all"]:
            for rule in ("race", "rejection"):
                keys = sorted({(x["round"], x["prompt"]) for x in runs
                               if x["setting"] == s and kind in ("all", x["kind"])})
                cells = {m: [rate(r, i, s, f"{m}-{rule}") for r, i in keys] for m in ("new", "old")}
                plain = {(r, i): rate(r, i, s, "plain")["tokens_per_s"] for r, i in keys}
                ratio = {m: statistics.median(x["tokens_per_s"] / plain[(x["round"], x["prompt"])] for x in cells[m])
                         for m in cells}
                pair = statistics.median(n["tokens_per_s"] / o["tokens_per_s"]
                                         for n, o in zip(cells["new"], cells["old"], strict=True))
                tpp = [statistics.median(x["tokens_per_pass"] for x in cells[m]) for m in ("new", "old")]
                mb = [statistics.median(x["mb_per_token"] for x in cells[m]) for m in ("new", "old")]
                print(f"| {s} | {kind} | {rule} | {ratio['new']:.2f} | {ratio['old']:.2f} | {pair:.2f} | "
                      f"{tpp[0]:.2f}, {tpp[1]:.2f} | {mb[0]:.0f}, {mb[1]:.0f} |")
    same = all(x["tokens"] == rate(x["round"], x["prompt"], x["setting"], "plain")["tokens"]
               for x in runs if x["mode"].endswith("race"))
    print(f"\nevery race run's tokens equal plain sampling's with the seed: {same}")
