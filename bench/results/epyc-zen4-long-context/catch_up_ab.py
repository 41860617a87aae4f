"""A/B in one process: the default with probes whatever their catch-up costs (old: CATCH_UP_SHARE = inf)
against the new rule, plus plain; long_context_bench's prompts, modes in turns."""
import dataclasses, json, statistics, sys
sys.path.insert(0, "/work/main/bench")
import long_context_bench as L
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round.drafters import build_drafter
from specedge.runtime.round import gamma as G
from specedge.resolve import resolve_model
lengths = [int(x) for x in sys.argv[1].split(",")]; rounds = int(sys.argv[2]); out = sys.argv[3]
tp, dp = resolve_model(L.TARGET, "int4", context=16384), resolve_model(L.DRAFT, context=16384)
cfg = dataclasses.replace(SpecConfig.auto(), max_new_tokens=64, ignore_eos=True)
target = OnnxModel(tp)
modes = {"plain": Generator(OnnxModel(tp, spin=True), None, SpecConfig(gamma=0, max_new_tokens=64, ignore_eos=True)),
         "old": Generator(target, build_drafter(OnnxModel(dp), True), cfg),
         "new": Generator(target, build_drafter(OnnxModel(dp), True), cfg)}
share = G.CATCH_UP_SHARE
chats = L.prompts(modes["plain"], lengths, ["chat", "edit"])
runs, names = [], list(modes)
for rnd in range(rounds):
    for i, chat in enumerate(chats):
        k = (rnd + i) % 3
        for mode in names[k:] + names[:k]:
            G.CATCH_UP_SHARE = float("inf") if mode == "old" else share
            r = modes[mode].generate(chat["chat"])
            run = {"round": rnd, "length": chat["length"], "kind": chat["kind"], "mode": mode,
                   "tok_s": round(r.stats.tokens_per_s, 2), "tok_pass": round(r.stats.tokens_per_target_pass, 2),
                   "ids": r.token_ids}
            runs.append(run)
            print(json.dumps({k2: v for k2, v in run.items() if k2 != "ids"}), flush=True)
same = all(r["ids"] == next(x["ids"] for x in runs if x["mode"] == "plain" and x["length"] == r["length"] and x["kind"] == r["kind"]) for r in runs)
print("identical:", same)
for length in lengths:
    for kind in ("chat", "edit"):
        med = {m: statistics.median([r["tok_s"] for r in runs if (r["length"], r["kind"], r["mode"]) == (length, kind, m)]) for m in names}
        print(length, kind, med, "old/plain %.2f new/plain %.2f new/old %.2f" % (med["old"] / med["plain"], med["new"] / med["plain"], med["new"] / med["old"]))
json.dump([{k2: v for k2, v in r.items() if k2 != "ids"} for r in runs], open(out, "w"), indent=1)
