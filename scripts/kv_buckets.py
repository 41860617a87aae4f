"""How the target's KV-cache buffers grow, measured: buckets of 256 slots (as specedge grew them
before) against buckets of 64 that grow by an eighth beyond 8 buckets (`grown_slots`). Exact
attention reads the whole buffer, masked beyond the length, so slack slots cost every pass.

One pass at --cached tokens, the caches taking turns in one process; then the decoding loop over
--prompts, plain and speculative, the two caches taking turns prompt by prompt on one Generator
(tokens compared). Medians and ratios; the CPU is printed first.

    .venv/bin/python scripts/kv_buckets.py [--target qwen2.5-coder-1.5b:int4] [--draft qwen2.5-coder-0.5b] \
        [--cached 520] [--prompts bench/prompts.jsonl] [--max-new-tokens 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from specedge.device_profiles.cpu import cpu_info
from specedge.resolve import resolve_model
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.engine.kv_cache import KVCache

BEFORE, AFTER = 256, 64  # buckets: with 256 grown_slots grows as specedge did before (below 4096 slots)


def time_passes(model: OnnxModel, cached: int, rounds: int) -> None:
    ids = np.random.default_rng(0).integers(100, 30000, cached + 9).tolist()
    caches: dict[int, KVCache] = {}
    for bucket in (BEFORE, AFTER, 32):
        caches[bucket] = model.new_cache(bucket=bucket)
        model.prefill(ids[:cached], caches[bucket])
    times: dict[tuple[int, int], list[float]] = {(b, s): [] for b in caches for s in (1, 9)}
    for r in range(rounds + 2):
        for width in (1, 9):
            order = list(caches.items()) if r % 2 else list(reversed(caches.items()))
            for bucket, cache in order:
                t = time.perf_counter()
                model.forward(ids[cached:cached + width], cache)
                if r >= 2:  # two warm-up rounds
                    times[(bucket, width)].append(time.perf_counter() - t)
    print(f"\none pass at {cached} cached tokens, {rounds} interleaved rounds, medians\n")
    print("| bucket | buffer slots | t(1) ms | t(9) ms | t(1) / bucket 256's | t(9) / bucket 256's |")
    print("|---|---|---|---|---|---|")
    for bucket, cache in caches.items():
        t1, t9 = (statistics.median(times[(bucket, w)]) * 1e3 for w in (1, 9))
        r1, r9 = (statistics.median(a / b for a, b in zip(times[(bucket, w)], times[(BEFORE, w)], strict=True))
                  for w in (1, 9))
        print(f"| {bucket} | {cache.slots} | {t1:.1f} | {t9:.1f} | {r1:.3f} | {r9:.3f} |")


def time_loop(target: Path, draft: Path, prompts: Path, max_new_tokens: int) -> None:
    rows = [json.loads(line) for line in prompts.read_text().splitlines() if line.strip()]
    config = SpecConfig(auto_gamma=True, max_new_tokens=max_new_tokens, ignore_eos=True)
    gens = {"plain": Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=max_new_tokens, ignore_eos=True)),
            "speculative": Generator.load(target, draft=draft, config=config)}
    caches = {name: {b: g.target.new_cache(bucket=b) for b in (BEFORE, AFTER)} for name, g in gens.items()}
    for g in gens.values():
        g.generate("warm up", max_new_tokens=8)
    ratios: dict[str, list[float]] = {name: [] for name in gens}
    same = {name: 0 for name in gens}
    print(f"\nthe decoding loop, {len(rows)} prompts x {max_new_tokens} tokens, tokens/s\n")
    print("| prompt | kind | decoding | bucket 256 | bucket 64 | ratio | tokens identical |")
    print("|---|---|---|---|---|---|---|")
    for i, row in enumerate(rows):
        for name, gen in gens.items():
            speed, tokens = {}, {}
            for bucket in (BEFORE, AFTER) if i % 2 == 0 else (AFTER, BEFORE):
                gen.cache = caches[name][bucket]
                result = gen.generate(row["prompt"], chat=True)
                speed[bucket], tokens[bucket] = result.stats.tokens_per_s, result.token_ids
            ratios[name].append(speed[AFTER] / speed[BEFORE])
            same[name] += tokens[AFTER] == tokens[BEFORE]
            print(f"| {i + 1} | {row['kind']} | {name} | {speed[BEFORE]:.1f} | {speed[AFTER]:.1f} | "
                  f"{ratios[name][-1]:.3f} | {tokens[AFTER] == tokens[BEFORE]} |", flush=True)
    for name in gens:
        print(f"\n{name}: bucket 64 / bucket 256, median over prompts {statistics.median(ratios[name]):.3f} "
              f"(range {min(ratios[name]):.2f}-{max(ratios[name]):.2f}); tokens identical on "
              f"{same[name]}/{len(rows)} prompts")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--target", default="qwen2.5-coder-1.5b:int4")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b")
    parser.add_argument("--cached", type=int, default=520)
    parser.add_argument("--rounds", type=int, default=12)
    parser.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    parser.add_argument("--max-new-tokens", type=int, default=256)
    args = parser.parse_args()
    name, _, quant = args.target.partition(":")
    target, draft = resolve_model(name, quant=quant or None), resolve_model(args.draft)
    print(f"CPU: {cpu_info().label()}")
    time_passes(OnnxModel(target), args.cached, args.rounds)
    time_loop(target, draft, args.prompts, args.max_new_tokens)


if __name__ == "__main__":
    main()
