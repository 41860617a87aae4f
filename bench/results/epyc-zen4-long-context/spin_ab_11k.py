"""Section 7's run in turns at one length: plain decoding (spinning), the default, and the default with
a spinning target; the prefix reused after each mode's first run; 64 tokens, greedy; medians over the
rounds after the first.

    .venv/bin/python bench/results/epyc-zen4-long-context/spin_ab_11k.py 11000 6
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from long_context_bench import DRAFT, TARGET, prompts

from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round.drafters import build_drafter


def main() -> None:
    length, rounds = int(sys.argv[1]), int(sys.argv[2])
    tp, dp = resolve_model(TARGET, "int4", context=16384), resolve_model(DRAFT, context=16384)
    modes = {"plain": Generator(OnnxModel(tp, threads=2, spin=True), None, SpecConfig(gamma=0)),
             "default": Generator(OnnxModel(tp, threads=2), build_drafter(OnnxModel(dp, threads=2), True),
                                  SpecConfig.auto()),
             "default-spin": Generator(OnnxModel(tp, threads=2, spin=True),
                                       build_drafter(OnnxModel(dp, threads=2), True), SpecConfig.auto())}
    ids = modes["plain"].encode(prompts(modes["plain"], [length], ["chat"])[0]["chat"], chat=True)
    names, speeds = list(modes), {m: [] for m in modes}
    for rnd in range(rounds):
        for mode in names[rnd % 3:] + names[:rnd % 3]:
            s = modes[mode].generate(ids, max_new_tokens=64, ignore_eos=True).stats
            print(json.dumps({"mode": mode, "round": rnd, "tok_s": round(s.tokens_per_s, 2), "gammas": s.gamma_counts,
                              "draft_calls": s.draft_calls, "drafted": s.drafted, "accepted": s.accepted,
                              "draft_s": round(s.time_draft_s, 3), "verify_s": round(s.time_verify_s, 3)}),
                  flush=True)
            if rnd > 0:
                speeds[mode].append(s.tokens_per_s)
    for mode, v in speeds.items():
        print(mode, round(statistics.median(v), 2), [round(x, 1) for x in v])


if __name__ == "__main__":
    main()
