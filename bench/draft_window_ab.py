"""What a draft attention window costs in acceptance and saves in draft time, at long contexts: greedy,
the draft model alone at a fixed γ (so tokens per target pass are the drafts' agreement, with no
timing in the choice), the same target cache for every window (its prefill reused), each window a
draft session of its own. Three kinds of question over N tokens of this repository's Python source:
a summary (prose), an edit of the last function (copies from the end), and a question about a
function near the start (needs what a window leaves out).

    .venv/bin/python bench/draft_window_ab.py --lengths 4096 11000 --windows off,1024,2048,4096

Prints, per length, kind and window: tokens per target pass (identical outputs checked), the draft's
time per drafted token and per caught-up token (its multi-row passes after the prefill).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from long_context_bench import DRAFT, QUESTIONS, TARGET, code_prefix

from specedge.device_profiles.cpu import cpu_info
from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.attention_window import parse_window
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round.drafters import DraftModelDrafter


def first_function(code: str) -> str:
    """The name of the first function defined in `code` (for the question about the context's start)."""
    for line in code.splitlines():
        if line.startswith("def "):
            return line[4:].split("(")[0]
    raise SystemExit("no function in the source's first tokens")


def chats(gen: Generator, length: int) -> dict[str, list[dict[str, str]]]:
    code = code_prefix(gen, length)
    questions = {
        "summary": QUESTIONS["chat"],
        "edit": QUESTIONS["edit"],
        "recall": f"Explain step by step what `{first_function(code)}` above does, quoting its code line by line.",
    }
    return {kind: [{"role": "user", "content": f"```python\n{code}\n```\n\n{q}"}] for kind, q in questions.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[4096, 11000])
    p.add_argument("--windows", default="off,1024,2048,4096")
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    target_path, draft_path = resolve_model(TARGET, "int4", context=16384), resolve_model(DRAFT, context=16384)
    windows = {w: parse_window(w) for w in args.windows.split(",")}
    drafts = {w: OnnxModel(draft_path, window=window) for w, window in windows.items()}
    config = SpecConfig(gamma=args.gamma, max_new_tokens=args.max_new_tokens, ignore_eos=True)
    gen = Generator(OnnxModel(target_path), DraftModelDrafter(drafts[next(iter(drafts))]), config)
    rows = []
    for length in args.lengths:
        for kind, chat in chats(gen, length).items():
            first = None
            for w, model in drafts.items():
                gen.drafter = DraftModelDrafter(model)  # the target's cache (its prefill) is kept across windows
                gen.recall = None
                result = gen.generate(chat)
                s = result.stats
                first = result.token_ids if first is None else first
                row = {"length": length, "kind": kind, "window": w, "prompt_tokens": s.prompt_tokens,
                       "tokens_per_pass": round(s.tokens_per_target_pass, 3),
                       "draft_ms_per_call": round(1e3 * s.time_draft_s / max(s.draft_calls, 1), 2),
                       "tok_s": round(s.tokens_per_s, 2), "identical": result.token_ids == first}
                rows.append(row)
                print(json.dumps(row), file=sys.stderr, flush=True)
    print(f"CPU: {cpu_info().label()}\n\ngreedy, the draft model alone at γ {args.gamma}, "
          f"{args.max_new_tokens} tokens\n")
    print("| tokens | kind | " + " | ".join(f"window {w}: tok/pass, draft ms/call, tok/s" for w in drafts) + " |")
    print("|" + "---|" * (2 + len(drafts)))
    for length in args.lengths:
        for kind in ("summary", "edit", "recall"):
            cells = [r for r in rows if r["length"] == length and r["kind"] == kind]
            print(f"| {length} | {kind} | " + " | ".join(
                f"{r['tokens_per_pass']}, {r['draft_ms_per_call']}, {r['tok_s']}" for r in cells) + " |")
    same = all(r["identical"] for r in rows)
    print(f"\nevery window's output identical: {same}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "args": vars(args) | {"json": str(args.json)},
                                         "rows": rows}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
