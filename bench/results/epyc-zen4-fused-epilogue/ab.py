"""The int4 kernel's epilogues (the q/k/v bias and SwiGLU in the MatMul node: EXPORT_FORMAT 11) against the
graphs before them (a bias Add, and Split, Sigmoid, Mul, Mul a layer: format 10), the default pair's exports
of both formats in one process on one library.

    .venv/bin/python bench/results/epyc-zen4-fused-epilogue/ab.py OLD_TARGET OLD_DRAFT [ROUNDS]

OLD_*: the format-10 exports (artifact folders); the new ones are what `specedge.load("qwen2.5-coder")`
exports now. Two parts:
1. Speed: a pass of the target at 1 and 5 rows and of the draft at 1 row over a cache of 512 tokens,
   the graphs taking turns pass by pass, order reversed every round; medians of the pairs' ratios.
2. Fidelity, on every prompt of bench/prompts.jsonl: greedy plain decoding (96 tokens) with the old
   and the new target, token for token; then the old and new logits of each model (target and draft)
   at every position of the old target's answer, fed one token a pass: the largest difference against
   that row's largest absolute logit.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from specedge.device_profiles.cpu import cpu_info
from specedge.options import pair_paths
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.step_profile import filled_cache

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the repository's root

from bench.passes_ab import ratio_table, time_in_turns

PROMPTS = Path(__file__).resolve().parents[2] / "prompts.jsonl"
NEW_TOKENS = 96


def speed(folders: dict[str, dict[str, Path]], rounds: int) -> None:
    passes = {}
    for graph, pair in folders.items():
        for name, role, rows in (("target S=1", "target", 1), ("target S=5", "target", 5), ("draft S=1", "draft", 1)):
            model = OnnxModel(pair[role])
            passes[(graph, name)] = (model, rows, filled_cache(model, 512))
    times = time_in_turns(passes, rounds)
    print(f"{rounds} rounds")
    for line in ratio_table(times):
        print(line, flush=True)


def logits_along(model: OnnxModel, prompt: list[int], answer: list[int]) -> np.ndarray:
    """[len(answer), V]: the logits before each answer token, one token a pass."""
    cache = model.new_cache()
    rows = [model.prefill(prompt, cache)]
    for token in answer[:-1]:
        out = model.forward([token], cache)
        cache.commit(out.new_keys, out.new_values, [token])
        rows.append(out.logits[-1].copy())
    return np.stack(rows)


def fidelity(folders: dict[str, dict[str, Path]]) -> None:
    config = SpecConfig(gamma=0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    gens = {graph: Generator.load(pair["target"], config=config) for graph, pair in folders.items()}
    models = {(graph, role): OnnxModel(pair[role]) for graph, pair in folders.items() for role in ("target", "draft")}
    print("| prompt | tokens equal | target: max diff / row max | draft: max diff / row max |")
    print("|---|---|---|---|")
    worst = {"target": 0.0, "draft": 0.0}
    for line in PROMPTS.read_text().splitlines():
        item = json.loads(line)
        prompt = gens["old"].encode(item["prompt"], chat=True)
        old, new = (gens[g].generate(prompt) for g in ("old", "new"))
        same = old.token_ids == new.token_ids
        cells = []
        for role in ("target", "draft"):
            a = logits_along(models[("old", role)], prompt, old.token_ids)
            b = logits_along(models[("new", role)], prompt, old.token_ids)
            rel = float((np.abs(a - b).max(axis=1) / np.abs(a).max(axis=1)).max())
            worst[role] = max(worst[role], rel)
            cells.append(f"{rel:.2e}")
        print(f"| {item['kind']}: {item['prompt'][:40]}... | {'yes' if same else 'NO'} | {cells[0]} | {cells[1]} |",
              flush=True)
    print(f"worst: target {worst['target']:.2e}, draft {worst['draft']:.2e}")


def main() -> None:
    old_target, old_draft = Path(sys.argv[1]), Path(sys.argv[2])
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 60
    new_target, new_draft = pair_paths("qwen2.5-coder", None, None)
    folders = {"old": {"target": old_target, "draft": old_draft}, "new": {"target": new_target, "draft": new_draft}}
    print(f"CPU: {cpu_info().label()}")
    print(f"old: {old_target.name}, {old_draft.name}; new: {new_target.name}, {new_draft.name}")
    speed(folders, rounds)
    fidelity(folders)


if __name__ == "__main__":
    main()
