"""How faithful is each export of a model to its float reference? Teacher-forced top-1 agreement
over real answers: one export answers the benchmark prompts greedily (128 tokens each), then every
export and the reference read prompt + answer in one go, and each position's argmax is compared
with the reference's.

    .venv/bin/python scripts/fidelity.py --answers-by TARGET --reference FP32 EXPORT [EXPORT ...] \
        [--prompts bench/prompts.jsonl bench/heldout.jsonl]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from quant_report import teacher_forced_argmax  # scripts/ is on the path when run as a script

from specedge.runtime import Generator, OnnxModel, SpecConfig


def answers(folder: str, prompts: list[Path], max_new_tokens: int) -> list[tuple[str, list[int], list[int]]]:
    """(kind, prompt ids, greedy answer ids) per prompt."""
    gen = Generator(OnnxModel(folder, spin=True), None,
                    SpecConfig(gamma=0, max_new_tokens=max_new_tokens, ignore_eos=True))
    rows = [json.loads(line) for path in prompts for line in path.read_text().splitlines() if line.strip()]
    out = []
    for row in rows:
        ids = gen.encode(row["prompt"], chat=True)
        out.append((row["kind"], ids, gen.generate(ids).token_ids))
    return out


def predictions(folder: str, texts: list[tuple[str, list[int], list[int]]]) -> list[np.ndarray]:
    """Per text, the argmax after each prompt-and-answer position that predicts an answer token."""
    model = OnnxModel(folder)
    return [teacher_forced_argmax(model, prompt + answer)[len(prompt) - 1:-1] for _, prompt, answer in texts]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--answers-by", required=True, help="export that answers the prompts")
    parser.add_argument("--reference", required=True, help="float export to agree with")
    parser.add_argument("--prompts", type=Path, nargs="+", default=[Path("bench/prompts.jsonl")])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("exports", nargs="+")
    args = parser.parse_args()
    texts = answers(args.answers_by, args.prompts, args.max_new_tokens)
    reference = predictions(args.reference, texts)
    kinds = sorted({kind for kind, _, _ in texts})
    print("| export | all | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for folder in args.exports:
        same = [got == ref for got, ref in zip(predictions(folder, texts), reference, strict=True)]
        share = {k: np.concatenate([s for s, (kind, _, _) in zip(same, texts, strict=True) if kind == k]).mean()
                 for k in kinds}
        total = np.concatenate(same)
        print(f"| {Path(folder).name} | {total.mean():.1%} of {total.size} | "
              + " | ".join(f"{share[k]:.1%}" for k in kinds) + " |")


if __name__ == "__main__":
    main()
