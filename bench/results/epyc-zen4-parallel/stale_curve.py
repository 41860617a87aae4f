"""γ auto among 4 streams when the pass curve's plain width was measured while memory was slow: two
`Streams` of the default pair at 16384 tokens, one whose curve keeps a width's own average however long
ago it ran (`stale` never reached: before runtime/streams/pass_curve.py's rule) and one with the rule,
and plain decoding, the three in turns, rotated round by round (the first round warms them and is not
counted): the 4 first chat prompts of bench/prompts.jsonl, 192 tokens, greedy under repetition_penalty
1.05 (a server's greedy request under Qwen's defaults), outputs asserted identical.

    .venv/bin/python bench/results/epyc-zen4-parallel/stale_curve.py ROUNDS [slow]

With `slow`, each auto run starts with its curve's 4-row time 1.3x what it was (as one run's slow spell
of memory left it: 34.5 -> 43.9 ms), so the plain steps of 4 streams look dearer than they are.
"""

from __future__ import annotations

import collections
import json
import statistics
import sys
import time
from pathlib import Path

import specedge
from specedge.kernels.penalties import Penalties
from specedge.kernels.sampling import SamplingParams
from specedge.runtime.streams.slots import Streams

SLOW = 1.3


def chat_prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in Path("bench/prompts.jsonl").read_text().splitlines() if line]
    return [row["prompt"] for row in rows if row["kind"] == "chat"][:n]


def main() -> None:
    rounds, slow = int(sys.argv[1]), sys.argv[2:] == ["slow"]
    prompts = chat_prompts(4)
    gen = specedge.load("qwen2.5-coder", context=16384).generator
    before, after = Streams(gen, 4), Streams(gen, 4)
    before.generators[0].costs.target.curve.stale = 10**9
    kw = {"chat": True, "sampling": SamplingParams(penalties=Penalties(repetition=1.05)), "max_new_tokens": 192,
          "ignore_eos": True}
    modes = {"before": (before, {}), "after": (after, {}), "plain": (after, {"gamma": 0})}
    rates: dict[str, list[float]] = {m: [] for m in modes}
    reference = None
    for r in range(rounds + 1):
        for name in list(modes)[r % 3:] + list(modes)[:r % 3]:
            streams, overrides = modes[name]
            if slow and name != "plain":
                streams.generators[0].costs.target.curve.seconds_at[4] *= SLOW
            start = time.perf_counter()
            out = streams.generate(prompts, **kw, **overrides)
            rate = sum(len(o.token_ids) for o in out) / (time.perf_counter() - start)
            ids = [o.token_ids for o in out]
            reference = reference or ids
            assert ids == reference, name
            gammas: collections.Counter[int] = collections.Counter()
            for o in out:
                gammas.update(o.stats.gamma_counts)
            print(f"round {r}, {name}: {rate:.1f} tok/s, rounds by γ {dict(sorted(gammas.items()))}", flush=True)
            if r:
                rates[name].append(rate)
    for name, values in rates.items():
        print(f"{name}: median {statistics.median(values):.1f} tok/s", [round(v, 1) for v in values])
    for name in ("before", "after"):
        ratio = statistics.median(a / b for a, b in zip(rates[name], rates["plain"], strict=True))
        print(f"{name} / plain: {ratio:.3f}")


if __name__ == "__main__":
    main()
