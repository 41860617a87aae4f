"""γ auto with the per-draft rule (the draft model drafts as far as each draft pays, runtime/round/gamma.py)
against γ auto alone (each round drafts γ auto's γ): the same Generator, the two taking turns prompt by
prompt (which goes first alternates), greedy, `--tokens` tokens; every pair of answers must be the same
tokens. Prints each prompt's decoding tokens/s and ratio, then per kind the median ratio, and the
geometric mean over all prompts.

    .venv/bin/python bench/draft_rule_ab.py [--prompts bench/prompts.jsonl] [--ngram] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
from pathlib import Path

from specedge.bench import load_prompts
from specedge.device_profiles.cpu import cpu_info
from specedge.models.registry import DEFAULT_PAIR
from specedge.options import pair_paths
from specedge.runtime import Generator, SpecConfig


def run_pair(gen: Generator, prompt: str, first_on: bool) -> dict[bool, object]:
    """Both ways on one prompt, in the order given; the results by per_draft."""
    results = {}
    for on in (first_on, not first_on):
        gen.config = dataclasses.replace(gen.config, per_draft=on)
        results[on] = gen.generate(prompt, chat=True)
    return results


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    ap.add_argument("--pair", default=DEFAULT_PAIR)
    ap.add_argument("--ngram", action="store_true", help="the n-gram lookup beside the draft (hybrid drafting)")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    target, draft = pair_paths(args.pair, None, None, None)
    config = SpecConfig(auto_gamma=True, max_new_tokens=args.tokens, ignore_eos=True)
    gen = Generator.load(target, draft=draft, ngram=args.ngram, config=config)
    rows = load_prompts(args.prompts)
    gen.generate(rows[0]["prompt"], chat=True)  # warm up
    samples = []
    for r in range(args.rounds):
        for i, row in enumerate(rows):
            res = run_pair(gen, row["prompt"], first_on=(i + r) % 2 == 0)
            off, on = res[False], res[True]
            if off.token_ids != on.token_ids:
                print(f"prompt {i}: the two ways gave different tokens", file=sys.stderr)
                return 1
            ratio = on.stats.tokens_per_s / off.stats.tokens_per_s
            samples.append({"kind": row["kind"], "prompt": i, "off": off.stats.tokens_per_s,
                            "on": on.stats.tokens_per_s, "ratio": ratio,
                            "drafts_per_pass": [s.stats.drafted / max(1, s.stats.target_calls) for s in (off, on)],
                            "tokens_per_pass": [s.stats.tokens_per_target_pass for s in (off, on)]})
            print(f"{r}.{i} {row['kind']}: γ auto alone {off.stats.tokens_per_s:.1f}, per draft "
                  f"{on.stats.tokens_per_s:.1f} tok/s ({ratio:.3f}x)", flush=True)
    kinds = {k: statistics.median(s["ratio"] for s in samples if s["kind"] == k)
             for k in dict.fromkeys(s["kind"] for s in samples)}
    geomean = statistics.geometric_mean(s["ratio"] for s in samples)
    print(f"\nCPU: {cpu_info().label()}; drafter: {'draft + n-gram' if args.ngram else 'draft'}; per draft / "
          f"γ auto alone, median per kind: " + ", ".join(f"{k} {v:.3f}x" for k, v in kinds.items())
          + f"; geometric mean {geomean:.3f}x; tokens identical on {len(samples)}/{len(samples)}")
    if args.out:
        args.out.write_text(json.dumps({"cpu": cpu_info().label(), "ngram": args.ngram, "kinds": kinds,
                                        "geomean": geomean, "samples": samples}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
