"""Would the draft propose better under sampling at a lower temperature than the target's? The
rejection rule accepts a draft drawn from q with probability sum(min(p, q)) = 1 - TV(p, q) (the
best any coupling of one draft does), whatever q is, so the draft's law is free to choose: this
measures that acceptance along sampled answers for q at the request's temperature times c.

For each prompt the target answers by plain sampling (the setting, seed 1, 96 tokens); target and
draft then read prompt and answer teacher-forced, and at each answer position p is the target's law
under the setting and q the draft's under the setting with its temperature times c (ids past the
draft's head: probability 0). Prints mean acceptance per kind and setting for each c, and, for
c = 1, the mean acceptance by the draft's confidence at the position (what `drafting_rule` weighs a
next draft by): the largest probability of q, and the largest probability of the draft's untempered
softmax (greedy's confidence), each in bins.

    .venv/bin/python bench/results/epyc-zen4-draft-temperature/acceptance.py bench/heldout.jsonl [SETTING,...]

Greedy (one-hot laws: the acceptance is the draft's argmax agreeing with the target's, along greedy
answers) is the reference a sampled setting's acceptance is compared with.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

from specedge.kernels.sampling import SamplingParams, probabilities
from specedge.options import pair_paths
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel

SETTINGS = {"greedy": SamplingParams(), "T0.7": SamplingParams(temperature=0.7),
            "T0.7 top_p 0.9": SamplingParams(temperature=0.7, top_p=0.9),
            "T0.7 min_p 0.05": SamplingParams(temperature=0.7, min_p=0.05),
            "qwen (T0.7 top_k 20 top_p 0.8)": SamplingParams(temperature=0.7, top_k=20, top_p=0.8)}
SCALES = (1.0, 0.9, 0.8, 0.7, 0.6)
BINS = (0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.01)


def forced_logits(model: OnnxModel, ids: list[int], start: int) -> np.ndarray:
    """The model's logits at positions start-1 .. len(ids)-2 (those that predict ids[start:])."""
    cache, rows = model.new_cache(), []
    for i in range(0, len(ids) - 1, 64):
        chunk = ids[i:min(i + 64, len(ids) - 1)]
        out = model.forward(chunk, cache, all_logits=True)
        cache.commit(out.new_keys, out.new_values, chunk)
        rows.append(np.asarray(out.logits[:len(chunk)], dtype=np.float32))
    return np.concatenate(rows)[start - 1:]


def main() -> None:
    target_dir, draft_dir = pair_paths("qwen2.5-coder", None, None)
    target, draft = OnnxModel(target_dir), OnnxModel(draft_dir)
    vocab = target.manifest.vocab_size
    gen = Generator(target, None, SpecConfig(gamma=0, max_new_tokens=96))
    settings = {k: SETTINGS[k] for k in sys.argv[2].split(",")} if len(sys.argv) > 2 else SETTINGS
    sums: dict[tuple[str, str, float], list[float]] = defaultdict(list)
    confidence: dict[tuple[str, str], list[tuple[float, float]]] = defaultdict(list)  # (confidence, acceptance)
    for line in Path(sys.argv[1]).read_text().splitlines():
        row = json.loads(line)
        ids = gen.encode(row["prompt"], chat=True)
        for name, params in settings.items():
            gen.forget()
            answer = gen.generate(ids, sampling=params, seed=1).token_ids
            full = ids + answer
            p_logits = forced_logits(target, full, len(ids))
            q_logits = forced_logits(draft, full, len(ids))
            if q_logits.shape[1] < vocab:  # a truncated head: the ids past it are never drafted
                pad = np.full((len(q_logits), vocab - q_logits.shape[1]), -np.inf, dtype=np.float32)
                q_logits = np.concatenate([q_logits, pad], axis=1)
            p = probabilities(p_logits[:, :vocab], params)
            for c in SCALES:
                q = probabilities(q_logits[:, :vocab], dataclasses.replace(params, temperature=params.temperature * c))
                accepted = np.minimum(p, q).sum(axis=1)
                sums[(row["kind"], name, c)] += accepted.tolist()
                if c == 1.0 and not params.greedy:
                    raw = probabilities(q_logits[:, :vocab], SamplingParams(temperature=1.0)).max(axis=1)
                    confidence[(name, "q")] += list(zip(q.max(axis=1).tolist(), accepted.tolist(), strict=True))
                    confidence[(name, "untempered")] += list(zip(raw.tolist(), accepted.tolist(), strict=True))
        print(f"{row['kind']}: {len(ids)} prompt tokens", file=sys.stderr, flush=True)
    print("| kind | setting | " + " | ".join(f"c={c}" for c in SCALES) + " | positions |")
    print("|---|---|" + "---|" * (len(SCALES) + 1))
    for kind in dict.fromkeys(k for k, _, _ in sums):
        for name in settings:
            cells = [f"{np.mean(sums[(kind, name, c)]):.3f}" for c in SCALES]
            print(f"| {kind} | {name} | " + " | ".join(cells) + f" | {len(sums[(kind, name, 1.0)])} |")
    print("\nmean acceptance (positions) by the draft's confidence, c = 1\n")
    print("| setting | confidence | " + " | ".join(f"[{a}, {b})" for a, b in itertools.pairwise(BINS)) + " |")
    print("|---|---|" + "---|" * (len(BINS) - 1))
    for (name, which), pairs in confidence.items():
        conf, acc = np.array(pairs).T
        cells = []
        for a, b in itertools.pairwise(BINS):
            sel = (conf >= a) & (conf < b)
            cells.append(f"{acc[sel].mean():.2f} ({int(sel.sum())})" if sel.any() else "")
        print(f"| {name} | {which} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
