"""The repetition penalty's ids kept as a generation's context grows (kernels/penalties.py `SeenIds`: new)
against `np.unique` over the whole context each round, for the target's rows and again for the draft's
(old), A/B in one process at long contexts.

The default (the 0.5B draft + n-gram lookup, γ auto) over the pair exported for 16K tokens, greedy under
repetition_penalty 1.05, on chats carrying N tokens of this repository's Python source
(bench/long_context_bench.py's prompts), 64 tokens, old and new taking turns prompt by prompt, each its
own Generator (cache); every run's tokens compared between the two.

    .venv/bin/python bench/results/epyc-zen4-penalty-memo/ab.py [ROUNDS] [LENGTH ...]
"""

from __future__ import annotations

import dataclasses
import statistics
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # bench/

from context_bench import DRAFT, TARGET
from long_context_bench import prompts

from specedge.device_profiles.cpu import cpu_info
from specedge.kernels.penalties import Penalties, SeenIds
from specedge.kernels.sampling import SamplingParams
from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round.drafters import build_drafter

KEPT = SeenIds.of


def unique_each_round(self: SeenIds, context):  # type: ignore[no-untyped-def]
    return np.unique(np.asarray(context, dtype=np.int64))


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    lengths = [int(x) for x in sys.argv[2:]] or [11000]
    target_path, draft_path = resolve_model(TARGET, "int4", context=16384), resolve_model(DRAFT, context=16384)
    config = dataclasses.replace(SpecConfig.auto(sampling=SamplingParams(penalties=Penalties(repetition=1.05))),
                                 max_new_tokens=64, ignore_eos=True)
    target, draft = OnnxModel(target_path), OnnxModel(draft_path)
    modes = {name: Generator(target, build_drafter(draft, True), config) for name in ("old", "new")}
    chats = prompts(modes["old"], lengths, ["chat", "edit"])
    runs = []
    for r in range(rounds + 1):  # round 0 prefills each mode's cache: not counted
        for i, chat in enumerate(chats):
            for name in (["old", "new"] if (r + i) % 2 else ["new", "old"]):
                SeenIds.of = unique_each_round if name == "old" else KEPT  # type: ignore[method-assign]
                res = modes[name].generate(chat["chat"])
                if r:
                    runs.append({"round": r, "length": chat["length"], "kind": chat["kind"], "mode": name,
                                 "tok_s": res.stats.tokens_per_s, "tokens": res.token_ids})
        print(f"round {r} done", file=sys.stderr, flush=True)
    print(f"CPU: {cpu_info().label()}; {rounds} rounds, 64 tokens, greedy, repetition_penalty 1.05")
    print("| tokens | kind | old tok/s | new tok/s | new / old (median of the pairs) | same tokens |")
    print("|---|---|---|---|---|---|")
    for length in lengths:
        for kind in ("chat", "edit"):
            sel = {m: [x for x in runs if (x["length"], x["kind"], x["mode"]) == (length, kind, m)]
                   for m in ("old", "new")}
            pairs = [n["tok_s"] / o["tok_s"] for o, n in zip(sel["old"], sel["new"], strict=True)]
            same = all(o["tokens"] == n["tokens"] for o, n in zip(sel["old"], sel["new"], strict=True))
            medians = [statistics.median(x["tok_s"] for x in sel[m]) for m in ("old", "new")]
            ratio = statistics.median(pairs)
            print(f"| {length} | {kind} | {medians[0]:.1f} | {medians[1]:.1f} | {ratio:.3f} | {same} |")


if __name__ == "__main__":
    main()
