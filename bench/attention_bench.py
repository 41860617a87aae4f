"""The native attention (ai.specedge::AttentionRows) alone: ms of a model's attention at the pass widths and
context lengths decoding meets, for the head shapes of the default pair, on each instruction set this
CPU runs - or the same on two builds of the library, interleaved round by round.

A pass is S rows at positions L..L+S-1 over a cache of L + 64 slots (float16, random), the session on
`--threads` threads; a model's pass runs it once for each layer, each over a cache of its own bound in
place as the runtime binds it (so the caches come from memory, as in decoding, not from the CPU's
cache); each figure is the median of `--repeats` such passes after two warm-up ones.

    .venv/bin/python bench/attention_bench.py                          # every ISA of this CPU
    .venv/bin/python bench/attention_bench.py --libraries old.so,new.so --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

from specedge.device_profiles.cpu import cpu_info

SHAPES = {  # name: heads, kv heads, head dim, layers
    "qwen2.5-1.5b": (12, 2, 128, 28),
    "qwen2.5-0.5b": (14, 2, 64, 24),
}


def time_pass(shape: tuple[int, int, int, int], rows: int, context: int, threads: int, repeats: int) -> float:
    """Median ms of a whole model's attention: one pass over each layer's cache in turn."""
    from specedge.kernels.attention_graph import bound_in_place, op_model, op_session, random_cache, rope_tables

    heads, kv_heads, d, layers = shape
    slots = context + 64
    rng = np.random.default_rng(0)
    keys, values = random_cache(rng, kv_heads, slots, d)
    cos, sin = rope_tables(slots, d)
    sess = op_session(op_model(heads, kv_heads, d, 1 / np.sqrt(d)), threads)
    inputs = {"qkv": rng.normal(0, 1, (1, rows, (heads + 2 * kv_heads) * d)).astype(np.float32),
              "pos": np.arange(context, context + rows, dtype=np.int64)[None], "cos": cos, "sin": sin}
    # a cache a layer, bound in place as the runtime binds it: read from memory, not the CPU's cache
    caches = [(keys.reshape(1, kv_heads, slots, d).copy(), values[None].copy()) for _ in range(layers)]
    bindings = [bound_in_place(sess, inputs, k, v) for k, v in caches]
    times = []
    for i in range(repeats + 2):
        start = time.perf_counter()
        for binding in bindings:
            sess.run_with_iobinding(binding)
        if i >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1000


def cases(args: argparse.Namespace) -> list[tuple[str, int, int]]:
    return [(name, rows, context) for name in args.shapes.split(",") for rows in map(int, args.rows.split(","))
            for context in map(int, args.contexts.split(","))]


def run_one(args: argparse.Namespace) -> dict[str, float]:
    return {f"{name} S{rows} L{context}": time_pass(SHAPES[name], rows, context, args.threads, args.repeats)
            for name, rows, context in cases(args)}


def child(args: argparse.Namespace, env: dict[str, str]) -> dict[str, float]:
    argv = [sys.executable, __file__, "--one", "--shapes", args.shapes, "--rows", args.rows, "--contexts",
            args.contexts, "--threads", str(args.threads), "--repeats", str(args.repeats)]
    out = subprocess.run(argv, env={**os.environ, **env}, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default=",".join(SHAPES))
    parser.add_argument("--rows", default="1,5,8")
    parser.add_argument("--contexts", default="16,512,2048")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--rounds", type=int, default=3, help="runs of each variant, interleaved")
    parser.add_argument("--libraries", help="two or more builds of the library, comma-separated (else: every ISA)")
    parser.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        print(json.dumps(run_one(args)))
        return
    from specedge.kernels import native

    if args.libraries:
        variants = {path: {"SPECEDGE_KERNEL_LIBRARY": path} for path in args.libraries.split(",")}
    else:
        variants = {isa: {"SPECEDGE_ATTENTION_ISA": isa} for isa in native.attention_isas()}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    for _ in range(args.rounds):
        for name, env in variants.items():
            runs[name].append(child(args, env))
    print(f"AttentionRows alone, ms of a model's pass (every layer over its own cache), {args.threads} threads, "
          f"{args.rounds} interleaved runs' medians; CPU: {cpu_info().model}")
    names = list(variants)
    print("| pass | " + " | ".join(names) + (f" | {names[-1]} / {names[0]} |" if len(names) > 1 else " |"))
    print("|---" * (len(names) + 1 + (len(names) > 1)) + "|")
    for key in runs[names[0]][0]:
        ms = [statistics.median(run[key] for run in runs[name]) for name in names]
        cells = " | ".join(f"{m:.2f}" for m in ms) + (f" | {ms[-1] / ms[0]:.2f}" if len(ms) > 1 else "")
        print(f"| {key} | {cells} |")


if __name__ == "__main__":
    main()
