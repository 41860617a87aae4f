"""Greedy speculative output equals greedy plain decoding on the default pair; tokens/s of both.

    .venv/bin/python scripts/check_default_pair.py [--pair qwen2.5-coder] [--max-new-tokens 128]
"""

from __future__ import annotations

import argparse
import statistics

from specedge.defaults import pair_artifacts
from specedge.runtime import Generator, SpecConfig

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Rename the variable `x` to `count` in this code:\n\ndef f(x):\n    x = x + 1\n    return x * 2\n",
    "Explain in two sentences what a hash map is.",
    "Write a SQL query that selects the ten newest rows of a table `events` by `created_at`.",
    "Add type hints to this function:\n\ndef area(w, h):\n    return w * h\n",
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pair", default="qwen2.5-coder")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--gamma", type=int, default=None, help="a fixed γ (default: γ auto, as chat decodes)")
    args = parser.parse_args()
    target, draft = pair_artifacts(args.pair)
    gamma = args.gamma or SpecConfig.gamma
    # each as a user gets it: plain decoding's session runs alone (its threads spin between passes),
    # the speculative pair's sessions take turns (theirs stop)
    plain = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=args.max_new_tokens))
    spec = Generator.load(target, draft=draft, config=SpecConfig(gamma=gamma, auto_gamma=args.gamma is None,
                                                                 max_new_tokens=args.max_new_tokens))
    plain.generate("warm up", max_new_tokens=4)
    spec.generate("warm up", max_new_tokens=4)
    way = "auto" if args.gamma is None else gamma
    print(f"| prompt | tokens | plain tok/s | speculative tok/s (γ {way}) | ratio | tokens/pass | identical |")
    print("|---|---|---|---|---|---|---|")
    ratios, same = [], 0
    for i, prompt in enumerate(PROMPTS):
        a = plain.generate(prompt, chat=True)
        b = spec.generate(prompt, chat=True)
        identical = a.token_ids == b.token_ids
        same += identical
        ratio = b.stats.tokens_per_s / a.stats.tokens_per_s
        ratios.append(ratio)
        print(f"| {i + 1} | {a.stats.n_tokens} | {a.stats.tokens_per_s:.1f} | {b.stats.tokens_per_s:.1f} | "
              f"{ratio:.2f} | {b.stats.tokens_per_target_pass:.2f} | {identical} |")
    print(f"\nidentical on {same}/{len(PROMPTS)} prompts; median speed ratio {statistics.median(ratios):.2f}")


if __name__ == "__main__":
    main()
