"""A/B of the n-gram lookup's memory of earlier answers (runtime/round/lookup_memory.py), in one process,
on and off taking turns prompt by prompt (order rotated), the default pair as `specedge.load` gives it.

For each prompt of bench/prompts-2-per-kind.jsonl and each setting (greedy; temperature 0.7 without a
seed, the rejection rule), 96 tokens:
- "new prompt": the memory holds the other prompts' answers (on) or nothing (off): what a memory of
  unrelated answers costs or gains;
- "asked again": the same prompt once more right after (regenerate, an agent's retry): on, the
  first answer is in the memory.

    .venv/bin/python bench/results/epyc-zen4-lookup-memory/ab.py ROUNDS
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

import specedge
from specedge.kernels.sampling import SamplingParams
from specedge.runtime.round.lookup_memory import LookupMemory

SETTINGS = {"greedy": SamplingParams(), "temperature 0.7": SamplingParams(temperature=0.7)}


def main() -> None:
    rounds = int(sys.argv[1])
    rows = [json.loads(line) for line in Path("bench/prompts-2-per-kind.jsonl").read_text().splitlines() if line]
    gen = specedge.load("qwen2.5-coder").generator
    answers = {i: gen.generate(row["prompt"], chat=True, max_new_tokens=96).token_ids for i, row in enumerate(rows)}
    cells: dict[tuple[str, str, str, str], list[float]] = {}
    same: list[bool] = []
    for r in range(rounds):
        for i, row in enumerate(rows):
            for mode in (["on", "off"] if (r + i) % 2 == 0 else ["off", "on"]):
                for setting, params in SETTINGS.items():
                    memory = None
                    if mode == "on":
                        memory = LookupMemory()
                        for j, answer in answers.items():
                            if j != i:
                                memory.add(answer)
                    gen.lookup_memory = memory
                    kw = {"chat": True, "max_new_tokens": 96, "sampling": params}
                    first = gen.generate(row["prompt"], **kw)
                    again = gen.generate(row["prompt"], **kw)
                    if setting == "greedy":
                        same.append(first.token_ids == again.token_ids == answers[i])
                    for case, result in (("new prompt", first), ("asked again", again)):
                        cells.setdefault((case, setting, row["kind"], mode), []).append(result.stats.tokens_per_s)
                        cells.setdefault((case, setting, "all", mode), []).append(result.stats.tokens_per_s)
            print(f"round {r} prompt {i} done", flush=True)
    print(f"greedy answers identical to the first decoding in every run: {all(same)} ({len(same)} runs)")
    print("| case | setting | kind | on tok/s | off tok/s | on / off (median of pairs) |")
    print("|---|---|---|---|---|---|")
    for (case, setting, kind, mode), on in sorted(cells.items()):
        if mode != "on":
            continue
        off = cells[(case, setting, kind, "off")]
        ratio = statistics.median(a / b for a, b in zip(on, off, strict=True))
        print(f"| {case} | {setting} | {kind} | {statistics.median(on):.1f} | {statistics.median(off):.1f} | "
              f"{ratio:.2f} |")
    gen.lookup_memory = None


if __name__ == "__main__":
    main()
