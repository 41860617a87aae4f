"""Decoding at long contexts: plain decoding and the default (the 0.5B draft + n-gram lookup, γ auto)
on chats carrying N tokens of this repository's Python source, the modes taking turns prompt by prompt
(order rotated each round), each mode its own Generator (cache) over the pair exported for 16K tokens.

    .venv/bin/python bench/long_context_bench.py                                 # 512 4096 11000 tokens
    .venv/bin/python bench/long_context_bench.py --windows off,1024 --rounds 3   # draft windows A/B

Modes: `plain`, then `default` with the draft's attention over the whole context (`off`) or a window
of W positions (`W`: runtime/engine/attention_window.py), one per --windows entry. Two kinds of prompt
at each length: `chat` (a question about the code, answered in prose) and `edit` (the code's last
function rewritten: the answer copies the context). Greedy, `ignore_eos`, so every mode decodes the
same number of tokens; each speculative run is checked token for token against plain decoding.

The prompts grow from one length to the next over the same source text, so a mode's Generator reuses
its cached prefix and prefills only what is new (a chat's next turn does the same); prefill speed is
therefore not measured here. Prints medians of decode tokens/s per length, kind and mode, each mode's
spread, the ratios to plain and to the shortest length; --json writes every run.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from context_bench import DRAFT, TARGET, source_text

from specedge.device_profiles.cpu import cpu_info
from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.attention_window import AttentionWindow, parse_window
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round.drafters import build_drafter

QUESTIONS = {
    "chat": "Summarize what the code above does, one sentence per function, in order.",
    "edit": "Rewrite the last function above with full type hints and a docstring. Reply with the code only.",
}


@functools.cache
def source_ids(codec: object) -> list[int]:
    return codec.encode(source_text())  # type: ignore[attr-defined]


def code_prefix(gen: Generator, length: int) -> str:
    """The first `length` - 60 tokens of the repository's Python source, as text."""
    ids = source_ids(gen.codec)
    if len(ids) < length:
        raise SystemExit(f"the source text has {len(ids)} tokens, fewer than {length}")
    return gen.codec.decode(ids[:max(length - 60, 16)])


def prompts(gen: Generator, lengths: list[int], kinds: list[str]) -> list[dict[str, object]]:
    """A chat per (length, kind): the code prefix of that length, then the kind's question."""
    out = []
    for length in sorted(lengths):
        code = code_prefix(gen, length)
        for kind in kinds:
            chat = [{"role": "user", "content": f"```python\n{code}\n```\n\n{QUESTIONS[kind]}"}]
            out.append({"length": length, "kind": kind, "chat": chat,
                        "prompt_tokens": len(gen.encode(chat, chat=True))})
    return out


def load_modes(windows: list[AttentionWindow | None], context: int, max_new: int) -> dict[str, Generator]:
    target_path, draft_path = resolve_model(TARGET, "int4", context=context), resolve_model(DRAFT, context=context)
    config = dataclasses.replace(SpecConfig.auto(), max_new_tokens=max_new, ignore_eos=True)
    modes = {"plain": Generator(OnnxModel(target_path, spin=True), None, SpecConfig(gamma=0, max_new_tokens=max_new,
                                                                                  ignore_eos=True))}
    target = OnnxModel(target_path)  # the speculative modes share one target (one copy of its weights)
    for window in windows:
        draft = OnnxModel(draft_path, window=window)
        modes[f"default-{window.window if window else 'off'}"] = Generator(target, build_drafter(draft, True), config)
    return modes


def summarize(runs: list[dict[str, object]]) -> list[dict[str, object]]:
    rows = []
    keys = sorted({(r["length"], r["kind"]) for r in runs})
    modes = list(dict.fromkeys(str(r["mode"]) for r in runs))
    for length, kind in keys:
        row: dict[str, object] = {"length": length, "kind": kind}
        for mode in modes:
            speeds = [float(r["tok_s"]) for r in runs if (r["length"], r["kind"], r["mode"]) == (length, kind, mode)]
            passes = [float(r["tokens_per_pass"]) for r in runs
                      if (r["length"], r["kind"], r["mode"]) == (length, kind, mode)]
            row[mode] = round(statistics.median(speeds), 2)
            row[f"{mode} spread"] = round((max(speeds) - min(speeds)) / statistics.median(speeds), 2)
            row[f"{mode} tok/pass"] = round(statistics.median(passes), 2)
        rows.append(row)
    return rows


def report(rows: list[dict[str, object]], modes: list[str]) -> str:
    shortest = {r["kind"]: r for r in rows if r["length"] == min(x["length"] for x in rows)}
    lines = [f"CPU: {cpu_info().label()}", "",
             "| tokens | kind | " + " | ".join(f"{m} tok/s" for m in modes) + " | "
             + " | ".join(f"{m} / plain" for m in modes[1:]) + " | plain vs shortest | "
             + " | ".join(f"{m} gain vs shortest" for m in modes[1:]) + " |",
             "|" + "---|" * (2 + 2 * len(modes) - 1 + len(modes))]
    for r in rows:
        base = shortest[r["kind"]]
        gains = [float(r[m]) / float(r["plain"]) for m in modes[1:]]
        base_gains = [float(base[m]) / float(base["plain"]) for m in modes[1:]]
        lines.append(f"| {r['length']} | {r['kind']} | " + " | ".join(f"{r[m]} ({r[m + ' tok/pass']})" for m in modes)
                     + " | " + " | ".join(f"{g:.2f}" for g in gains)
                     + f" | {float(r['plain']) / float(base['plain']):.2f} | "
                     + " | ".join(f"{g / b:.2f}" for g, b in zip(gains, base_gains, strict=True)) + " |")
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 4096, 11000])
    p.add_argument("--kinds", default="chat,edit")
    p.add_argument("--windows", default="off", help="draft windows, comma-separated (off, or positions)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=16384, help="the exports' context (default 16384)")
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    windows = [parse_window(w) for w in args.windows.split(",")]
    modes = load_modes(windows, args.context, args.max_new_tokens)
    names = list(modes)
    chats = prompts(modes["plain"], args.lengths, args.kinds.split(","))
    runs, plain_tokens = [], {}
    for rnd in range(args.rounds):
        for i, chat in enumerate(chats):
            order = names[(rnd + i) % len(names):] + names[:(rnd + i) % len(names)]
            for mode in order:
                result = modes[mode].generate(chat["chat"])
                s = result.stats
                key = (chat["length"], chat["kind"])
                if mode == "plain":
                    plain_tokens.setdefault(key, result.token_ids)
                run = {"round": rnd, "length": chat["length"], "kind": chat["kind"], "mode": mode,
                       "prompt_tokens": s.prompt_tokens, "tok_s": round(s.tokens_per_s, 2),
                       "tokens_per_pass": round(s.tokens_per_target_pass if mode != "plain" else 1.0, 2),
                       "prefill_s": round(s.time_prefill_s, 2), "token_ids": list(result.token_ids)}
                runs.append(run)
                print(json.dumps({k: v for k, v in run.items() if k != "token_ids"}), file=sys.stderr, flush=True)
    same = all(r["token_ids"] == plain_tokens[(r["length"], r["kind"])] for r in runs)
    rows = summarize(runs)
    print(report(rows, names))
    print(f"\nevery speculative run token-identical to plain decoding: {same}")
    if args.json:
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "args": vars(args) | {"json": str(args.json)},
                                         "rows": rows, "runs": runs, "identical": same}, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
