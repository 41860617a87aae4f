"""4 streams sharing passes in one process (`Streams`, 4 slots) against the same requests one after another, on
the default pair exported at 4096 and at 16384 tokens, the two pairs taking turns round by round (the first
round warms both and is not counted): the 4 first chat prompts of bench/prompts.jsonl, 192 tokens, greedy under
repetition_penalty 1.05 (what a server gives a greedy request under Qwen's defaults).

    .venv/bin/python bench/results/epyc-zen4-parallel/in_process.py ROUNDS
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import specedge
from specedge.kernels.penalties import Penalties
from specedge.kernels.sampling import SamplingParams
from specedge.runtime.streams.slots import Streams

CONTEXTS = (4096, 16384)


def chat_prompts(n: int) -> list[str]:
    rows = [json.loads(line) for line in Path("bench/prompts.jsonl").read_text().splitlines() if line]
    return [row["prompt"] for row in rows if row["kind"] == "chat"][:n]


def main() -> None:
    rounds = int(sys.argv[1])
    prompts = chat_prompts(4)
    kw = {"chat": True, "sampling": SamplingParams(penalties=Penalties(repetition=1.05)), "max_new_tokens": 192,
          "ignore_eos": True}
    setups = {}
    for context in CONTEXTS:
        gen = specedge.load("qwen2.5-coder", context=context).generator
        setups[context] = (gen, Streams(gen, 4))
    rates: dict[int, list[tuple[float, float]]] = {c: [] for c in CONTEXTS}
    for r in range(rounds + 1):
        for context in (CONTEXTS if r % 2 == 0 else CONTEXTS[::-1]):
            gen, streams = setups[context]
            start = time.perf_counter()
            together = streams.generate(prompts, **kw)
            at_once = sum(len(o.token_ids) for o in together) / (time.perf_counter() - start)
            start = time.perf_counter()
            alone = [gen.generate(p, **kw) for p in prompts]
            one_by_one = sum(len(o.token_ids) for o in alone) / (time.perf_counter() - start)
            assert [o.token_ids for o in together] == [o.token_ids for o in alone]
            print(f"round {r}, {context} tokens: at once {at_once:.1f} tok/s, one after another {one_by_one:.1f}, "
                  f"γ {[o.stats.gamma for o in together]}", flush=True)
            if r:
                rates[context].append((at_once, one_by_one))
    for context, pairs in rates.items():
        print(f"{context} tokens: at once {statistics.median(a for a, _ in pairs):.1f} tok/s, one after another "
              f"{statistics.median(b for _, b in pairs):.1f}, ratio {statistics.median(a / b for a, b in pairs):.2f}")


if __name__ == "__main__":
    main()
