"""Two checkouts of specedge decoding the same prompts, taking turns: are their tokens the same, and
is one slower? For a change that must not change behaviour (a refactor): greedy and seeded sampled
tokens must be identical, and decoding as fast.

Each checkout runs in a worker process of its own, started with that checkout's Python (its own
environment: `scripts/setup.sh` in it), loading the default pair with `specedge.load` as a user does.
The two load at once (one copy of each model per process) and decode in turns: on each prompt,
greedy then seeded sampling, each checkout once, the one that goes first alternating by prompt and
round, so a machine whose speed drifts slows both alike. Prints each prompt's tokens/s ratio and,
at the end, the median ratio (B over A) and whether every answer was token-identical.

    .venv/bin/python scripts/ab_checkouts.py ../specedge-before/.venv/bin/python .venv/bin/python \\
        [--prompts bench/prompts.jsonl] [--rounds 3] [--tokens 96] [--out FILE.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

SETTINGS = {"greedy": {"temperature": 0.0}, "sampled": {"temperature": 0.7, "top_p": 0.9, "seed": 7}}


def worker() -> None:
    """Answer requests read from stdin, one JSON line each, with one JSON line on stdout."""
    import specedge

    model = specedge.load("qwen2.5-coder")
    print(json.dumps({"ready": model.decoding}), flush=True)
    for line in sys.stdin:
        ask = json.loads(line)
        reply = model.chat([{"role": "user", "content": ask["prompt"]}], max_tokens=ask["tokens"], **ask["sampling"])
        print(json.dumps({"tokens": reply.tokens, "tokens_per_s": reply.stats.tokens_per_s}), flush=True)


class Worker:
    def __init__(self, python: str) -> None:
        python = str(Path(python).absolute())  # not resolved: a venv's python is a link to the base's
        root = Path(python).parent.parent.parent  # CHECKOUT/.venv/bin/python
        self.proc = subprocess.Popen([python, str(Path(__file__).resolve()), "--worker"], cwd=root,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.name = str(root)
        ready = self.read()
        print(f"{self.name}: {ready['ready']}", file=sys.stderr)

    def read(self) -> dict:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"{self.name}: the worker exited")
        return json.loads(line)

    def ask(self, prompt: str, tokens: int, sampling: dict) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"prompt": prompt, "tokens": tokens, "sampling": sampling}) + "\n")
        self.proc.stdin.flush()
        return self.read()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a", help="checkout A's Python (the baseline)")
    ap.add_argument("b", help="checkout B's Python (the change)")
    ap.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=96)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rows = [json.loads(line) for line in args.prompts.read_text().splitlines() if line.strip()]
    workers = {"a": Worker(args.a), "b": Worker(args.b)}
    for w in workers.values():  # warm up
        w.ask("hello", 8, SETTINGS["greedy"])
    samples, differ = [], []
    for r in range(args.rounds):
        for i, row in enumerate(rows):
            for name, sampling in SETTINGS.items():
                order = ("a", "b") if (i + r) % 2 == 0 else ("b", "a")
                got = {k: workers[k].ask(row["prompt"], args.tokens, sampling) for k in order}
                same = got["a"]["tokens"] == got["b"]["tokens"]
                ratio = got["b"]["tokens_per_s"] / got["a"]["tokens_per_s"]
                samples.append({"round": r, "prompt": i, "kind": row["kind"], "setting": name, "ratio": ratio,
                                "a": got["a"]["tokens_per_s"], "b": got["b"]["tokens_per_s"], "same": same})
                if not same:
                    differ.append((r, i, name))
                speeds = f"A {got['a']['tokens_per_s']:.1f}, B {got['b']['tokens_per_s']:.1f} tok/s"
                print(f"{r}.{i} {row['kind']} {name}: {speeds} ({ratio:.3f}x){'' if same else ' TOKENS DIFFER'}",
                      flush=True)
    median = statistics.median(s["ratio"] for s in samples)
    print(f"\nB / A decoding speed, median over {len(samples)} runs: {median:.3f}x; tokens identical on "
          f"{len(samples) - len(differ)}/{len(samples)}")
    if args.out:
        args.out.write_text(json.dumps({"a": workers["a"].name, "b": workers["b"].name, "median": median,
                                        "differ": differ, "samples": samples}, indent=1))
    return 1 if differ else 0


if __name__ == "__main__":
    if sys.argv[1:] == ["--worker"]:
        worker()
    else:
        sys.exit(main())
