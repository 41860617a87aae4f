"""A/B of two exports of the same target (and their drafts) in the decoding loop: the bench prompts,
greedy, the two ways taking turns prompt by prompt, plain 1-token decoding and the pair's hybrid
drafting (draft + n-gram, γ auto). Prints per prompt kind the median tokens/s of each and their
ratio, whether each export's speculative tokens equal its plain ones, and how often A's and B's
tokens agree (they may differ where B keeps its cache in float16). With --mapped A (or B), that
way's models leave their weights in ONNX Runtime's map of the data file (SPECEDGE_MAPPED_WEIGHTS=1
while they load, runtime/engine/weight_pages.py): the same export twice then compares the two.

    python scripts/attention_ab.py --a TARGET_A DRAFT_A --b TARGET_B DRAFT_B [--mapped A|B] [--prompts FILE]
        [--tokens N]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
from collections import defaultdict
from pathlib import Path

from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.weight_pages import OPT_OUT_ENV


def load(target: Path, draft: Path, mapped: bool = False) -> tuple[Generator, Generator]:
    os.environ[OPT_OUT_ENV] = "1" if mapped else "0"  # read as each model loads
    plain = Generator.load(target, config=SpecConfig(gamma=0), single_steps=True)
    spec = Generator.load(target, draft=draft, ngram=True, config=SpecConfig.auto())
    return plain, spec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--a", nargs=2, type=Path, required=True, metavar=("TARGET", "DRAFT"))
    ap.add_argument("--b", nargs=2, type=Path, required=True, metavar=("TARGET", "DRAFT"))
    ap.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--mapped", choices=("A", "B"), default=None, help="this way's weights stay in the mapped file")
    args = ap.parse_args()
    ways = {"A": load(*args.a, mapped=args.mapped == "A"), "B": load(*args.b, mapped=args.mapped == "B")}
    rates: dict[tuple[str, str, str], list[float]] = defaultdict(list)
    same_spec = {"A": 0, "B": 0}
    agree = total = 0
    prompts = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    for n, item in enumerate(prompts):
        messages = [{"role": "user", "content": item["prompt"]}]
        tokens = {}
        for name in (("A", "B") if n % 2 == 0 else ("B", "A")):
            plain, spec = ways[name]
            ids = plain.encode(messages)
            p = plain.generate(ids, max_new_tokens=args.tokens, ignore_eos=True)
            s = spec.generate(ids, max_new_tokens=args.tokens, ignore_eos=True)
            rates[(item["kind"], name, "plain")].append(p.stats.tokens_per_s)
            rates[(item["kind"], name, "hybrid")].append(s.stats.tokens_per_s)
            same_spec[name] += p.token_ids == s.token_ids
            tokens[name] = p.token_ids
        agree += sum(a == b for a, b in zip(tokens["A"], tokens["B"], strict=False))
        total += len(tokens["A"])
        last = {(w, m): rates[(item["kind"], w, m)][-1] for w in ("A", "B") for m in ("plain", "hybrid")}
        print(f"{n + 1}/{len(prompts)} {item['kind']}: A plain {last['A', 'plain']:.1f} hybrid "
              f"{last['A', 'hybrid']:.1f}; B plain {last['B', 'plain']:.1f} hybrid {last['B', 'hybrid']:.1f} tok/s",
              flush=True)
    print("\nkind   mode    A tok/s  B tok/s  B/A")
    for kind in sorted({k for k, _, _ in rates}):
        for mode in ("plain", "hybrid"):
            a, b = (statistics.median(rates[(kind, w, mode)]) for w in ("A", "B"))
            print(f"{kind:<6} {mode:<7} {a:7.1f}  {b:7.1f}  {b / a:.3f}")
    print(f"speculative = plain: A {same_spec['A']}/{len(prompts)}, B {same_spec['B']}/{len(prompts)}; "
          f"A and B plain tokens agree at {agree}/{total} positions (the same position of each answer)")


if __name__ == "__main__":
    main()
