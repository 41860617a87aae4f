"""A/B in one process: γ auto as it was at commit b8c6033 (`old`: recalled pass and drafting times
blended into this generation's averages; probes stopped where the draft's catch-up exceeds 15% of a plain
step) against runtime/round/gamma.py now (`new`: a recalled time replaced by this generation's first
measurement of it; probes only where what drafting could gain outweighs the catch-up), and plain
decoding; bench/long_context_bench.py's prompts, the modes in turns prompt by prompt (order rotated),
each mode's Generator kept across prompts (so each generation starts from the last one's recall), 64
tokens, greedy.

    .venv/bin/python bench/results/epyc-zen4-long-context/fresh_costs_ab.py 512,4096,11000 3 fresh-costs-ab.json
"""

from __future__ import annotations

import dataclasses
import json
import statistics
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import long_context_bench as bench

from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round import decoding
from specedge.runtime.round.drafters import build_drafter


def old_controller() -> type:
    """GammaController as commit b8c6033 had it, loaded from git as a module of its own."""
    root = Path(__file__).resolve().parents[3]
    source = subprocess.run(["git", "show", "b8c6033:runtime/round/gamma.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("gamma_b8c6033")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, "gamma_b8c6033.py", "exec"), module.__dict__)  # our own file, at a commit of ours
    return module.GammaController


def main() -> None:
    lengths, rounds, out = [int(x) for x in sys.argv[1].split(",")], int(sys.argv[2]), Path(sys.argv[3])
    tp, dp = resolve_model(bench.TARGET, "int4", context=16384), resolve_model(bench.DRAFT, context=16384)
    cfg = dataclasses.replace(SpecConfig.auto(), max_new_tokens=64, ignore_eos=True)
    target = OnnxModel(tp)
    modes = {"plain": Generator(OnnxModel(tp, spin=True), None, SpecConfig(gamma=0, max_new_tokens=64,
                                                                             ignore_eos=True)),
             "old": Generator(target, build_drafter(OnnxModel(dp), True), cfg),
             "new": Generator(target, build_drafter(OnnxModel(dp), True), cfg)}
    controllers, names = {"old": old_controller(), "new": decoding.GammaController}, list(modes)
    chats = bench.prompts(modes["plain"], lengths, ["chat", "edit"])
    runs = []
    for rnd in range(rounds):
        for i, chat in enumerate(chats):
            k = (rnd + i) % len(names)
            for mode in names[k:] + names[:k]:
                decoding.GammaController = controllers.get(mode, controllers["new"])
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
