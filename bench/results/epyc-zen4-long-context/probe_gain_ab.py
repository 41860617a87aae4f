"""A/B in one process: γ auto's probes stopped where the draft's catch-up exceeds a fixed share of a
plain step (`old`: 15%, the rule of section 4) against probes weighed by what drafting could gain
(`new`: runtime/round/gamma.py's `could_pay`), and plain decoding; bench/long_context_bench.py's
prompts, the modes in turns prompt by prompt (order rotated), 64 tokens, greedy.

    .venv/bin/python bench/results/epyc-zen4-long-context/probe_gain_ab.py 512,4096,11000 2 probe-gain-ab.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import long_context_bench as bench

from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round import gamma
from specedge.runtime.round.drafters import build_drafter


def old_could_pay(self: gamma.GammaController, source: str) -> bool:
    """Section 4's rule: no probe where the catch-up exceeds 15% of a plain step."""
    s = self.stats(source)
    if s.t_catch_up is not None and s.t_catch_up > 0.15 * self.verify_seconds(1):
        return False
    alpha = max(gamma.PROBE_ALPHA, s.alpha)
    t_draft = s.t_draft if s.t_draft is not None else 0.0
    return max(gamma.round_rate(alpha, g, t_draft, self.verify_seconds(g + 1)) for g in self.choices) >= self.rate(0)


def main() -> None:
    lengths, rounds, out = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2]), Path(sys.argv[3])
    tp, dp = resolve_model(bench.TARGET, "int4", context=16384), resolve_model(bench.DRAFT, context=16384)
    cfg = dataclasses.replace(SpecConfig.auto(), max_new_tokens=64, ignore_eos=True)
    target = OnnxModel(tp)
    modes = {"plain": Generator(OnnxModel(tp, spin=True), None, SpecConfig(gamma=0, max_new_tokens=64,
                                                                             ignore_eos=True)),
             "old": Generator(target, build_drafter(OnnxModel(dp), True), cfg),
             "new": Generator(target, build_drafter(OnnxModel(dp), True), cfg)}
    new_could_pay, names = gamma.GammaController.could_pay, list(modes)
    chats = bench.prompts(modes["plain"], lengths, ["chat", "edit"])
    runs = []
    for rnd in range(rounds):
        for i, chat in enumerate(chats):
            k = (rnd + i) % len(names)
            for mode in names[k:] + names[:k]:
                gamma.GammaController.could_pay = old_could_pay if mode == "old" else new_could_pay
                r = modes[mode].generate(chat["chat"])
                runs.append({"round": rnd, "length": chat["length"], "kind": chat["kind"], "mode": mode,
                             "tok_s": round(r.stats.tokens_per_s, 2),
                             "tok_pass": round(r.stats.tokens_per_target_pass, 2), "ids": r.token_ids})
                print(json.dumps({key: v for key, v in runs[-1].items() if key != "ids"}), flush=True)
    plain = {(r["length"], r["kind"]): r["ids"] for r in runs if r["mode"] == "plain"}
    print("identical:", all(r["ids"] == plain[(r["length"], r["kind"])] for r in runs))
    for length in lengths:
        for kind in ("chat", "edit"):
            med = {m: statistics.median(r["tok_s"] for r in runs if (r["length"], r["kind"], r["mode"]) ==
                                        (length, kind, m)) for m in names}
            print(length, kind, med, f"old/plain {med['old'] / med['plain']:.2f} new/plain "
                  f"{med['new'] / med['plain']:.2f} new/old {med['new'] / med['old']:.2f}")
    out.write_text(json.dumps([{key: v for key, v in r.items() if key != "ids"} for r in runs], indent=1))


if __name__ == "__main__":
    main()
