"""Prefill and decoding at depth: specedge plain, specedge's default and llama.cpp on the same GGUF,
taking turns, at 0.5K / 4K / 11K / 16K tokens of context - what `llama-bench -p N -n 64 -d N` measures,
on the very same token ids.

Each length's prompt is a chat carrying that many tokens of this repository's Python source and a
question (bench/long_context_bench.py's `chat` prompts), encoded once by specedge; llama.cpp (through
llama-cpp-python in a venv of its own: README.md beside this file) is fed the same ids. Every run
starts from an empty cache: the time to the first token is the prefill of the whole prompt (specedge's
default also prefills its draft), then `--tokens` tokens are decoded greedily with the end of text
ignored (decode tokens/s: after the first token). The modes take turns run by run, the order rotated
each round; medians; every speculative run checked token for token against specedge's plain decoding.
The pair exported for 16384 tokens (the native attention, fp16 cache), llama.cpp's cache in f16.

    .venv/bin/python bench/reference/llamacpp_depth.py --llama-python $LLAMA/venv/bin/python \\
        --gguf ~/.cache/specedge/weights/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf \\
        --lengths 512 4096 11000 16000 --rounds 2 --json bench/results/epyc-zen4-depth/depth.json \\
        --plot bench/results/epyc-zen4-depth/depth.svg
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: long_context_bench
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the checkout

from llamacpp_abab import JsonWorker  # bench/reference/, this script's folder
from long_context_bench import DRAFT, TARGET, prompts

WORKER = r'''
import json, sys, time
from llama_cpp import Llama
gguf, threads, ctx = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
llm = Llama(model_path=gguf, n_ctx=ctx, n_batch=512, n_threads=threads, n_threads_batch=threads, verbose=False)
print(json.dumps({"version": __import__("llama_cpp").__version__}), flush=True)
for line in sys.stdin:
    job = json.loads(line)
    llm.reset()
    start = time.perf_counter()
    first, count = None, 0
    for token in llm.generate(job["ids"], top_k=1, top_p=1.0, min_p=0.0, temp=0.0, reset=True):
        count += 1
        if first is None:
            first = time.perf_counter()
        if count >= job["tokens"]:
            break
    end = time.perf_counter()
    print(json.dumps({"prefill_s": first - start, "decode_s": end - first, "tokens": count}), flush=True)
'''

MODES = ("specedge plain", "specedge default", "llama.cpp plain")


def specedge_run(gen, ids: list[int], tokens: int) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """One run from an empty cache (its draft's too): the prefill, then `tokens` tokens."""
    gen.forget()
    start, first = time.perf_counter(), None
    stream = gen.stream(ids, max_new_tokens=tokens, ignore_eos=True)
    for _ in stream:
        if first is None:
            first = time.perf_counter()
    end = time.perf_counter()
    s = stream.result.stats
    return {"prefill_s": s.time_prefill_s, "decode_tok_s": s.tokens_per_s, "wall_first_s": first - start,
            "tokens": s.n_tokens, "tokens_per_pass": s.tokens_per_target_pass, "ids": stream.result.token_ids,
            "decode_s": end - first}


def summarize(runs: list[dict[str, object]], lengths: list[int]) -> list[dict[str, object]]:
    rows = []
    for length in lengths:
        row: dict[str, object] = {"length": length}
        for mode in MODES:
            mine = [r for r in runs if r["length"] == length and r["mode"] == mode]
            if not mine:
                continue
            prompt = int(mine[0]["prompt_tokens"])  # type: ignore[call-overload]
            row[f"{mode} prefill tok/s"] = round(statistics.median(prompt / float(r["prefill_s"]) for r in mine), 1)
            row[f"{mode} decode tok/s"] = round(statistics.median(float(r["decode_tok_s"]) for r in mine), 1)
            speeds = [float(r["decode_tok_s"]) for r in mine]
            row[f"{mode} decode spread"] = round((max(speeds) - min(speeds)) / statistics.median(speeds), 2)
            row["prompt_tokens"] = prompt
        rows.append(row)
    return rows


def report(rows: list[dict[str, object]], cpu: str, version: str) -> str:
    short = rows[0]
    lines = [f"CPU: {cpu}; llama-cpp-python {version}", "",
             "| prompt tokens | prefill tok/s: specedge / default / llama.cpp | specedge / llama.cpp | "
             "decode tok/s: specedge plain / default / llama.cpp | plain / llama.cpp | default / llama.cpp | "
             "default / plain | plain vs shortest | default's gain vs shortest |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        p = [float(r[f"{m} prefill tok/s"]) for m in MODES]
        d = [float(r[f"{m} decode tok/s"]) for m in MODES]
        gain, short_gain = d[1] / d[0], float(short["specedge default decode tok/s"]) / float(
            short["specedge plain decode tok/s"])
        lines.append(f"| {r['prompt_tokens']} | {p[0]} / {p[1]} / {p[2]} | {p[0] / p[2]:.2f} "
                     f"| {d[0]} / {d[1]} / {d[2]} | {d[0] / d[2]:.2f} | {d[1] / d[2]:.2f} | {gain:.2f} "
                     f"| {d[0] / float(short['specedge plain decode tok/s']):.2f} | {gain / short_gain:.2f} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, object]], path: Path) -> None:
    """Decode and prefill tokens/s against the prompt's length, one line a mode (matplotlib, if installed)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("no plot: matplotlib is not installed (pip install matplotlib)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    x = [int(r["prompt_tokens"]) for r in rows]  # type: ignore[call-overload]
    for ax, what in zip(axes, ("decode", "prefill"), strict=True):
        for mode in MODES:
            ax.plot(x, [float(r[f"{mode} {what} tok/s"]) for r in rows], marker="o", label=mode)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(f"{what} tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--llama-python", required=True, help="the python of a venv with llama-cpp-python")
    ap.add_argument("--gguf", type=Path, required=True, help="the target's GGUF (specedge's export source)")
    ap.add_argument("--lengths", type=int, nargs="+", default=[512, 4096, 11000, 16000])
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--context", type=int, default=16384, help="the exports' context and llama.cpp's n_ctx")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()

    from specedge.device_profiles.cpu import cpu_info
    from specedge.resolve import resolve_model
    from specedge.runtime import Generator, SpecConfig
    from specedge.runtime.engine.model import OnnxModel
    from specedge.runtime.round.drafters import build_drafter

    if max(args.lengths) + args.tokens > args.context:
        raise SystemExit(f"--lengths up to {max(args.lengths)} and --tokens {args.tokens} do not fit --context "
                         f"{args.context}")
    tp, dp = resolve_model(TARGET, "int4", context=args.context), resolve_model(DRAFT, context=args.context)
    ours = {"specedge plain": Generator(OnnxModel(tp, threads=args.threads, spin=True), None, SpecConfig(gamma=0)),
            "specedge default": Generator(OnnxModel(tp, threads=args.threads),
                                          build_drafter(OnnxModel(dp, threads=args.threads), True),
                                          SpecConfig.auto())}
    chats = prompts(ours["specedge plain"], args.lengths, ["chat"])
    llama = JsonWorker(args.llama_python, WORKER, args.gguf, args.threads, args.context)
    runs: list[dict[str, object]] = []
    for rnd in range(args.rounds):
        for i, chat in enumerate(chats):
            ids = ours["specedge plain"].encode(chat["chat"], chat=True)
            k = (rnd + i) % len(MODES)
            answers: dict[str, list[int]] = {}
            for mode in MODES[k:] + MODES[:k]:
                if mode.startswith("llama.cpp"):
                    r = llama.ask({"ids": ids, "tokens": args.tokens})
                    r["decode_tok_s"] = (r["tokens"] - 1) / r["decode_s"]
                else:
                    r = specedge_run(ours[mode], ids, args.tokens)
                if "ids" in r:
                    answers[mode] = r.pop("ids")
                runs.append({"round": rnd, "length": chat["length"], "mode": mode, "prompt_tokens": len(ids), **r})
                print(json.dumps({key: (round(v, 3) if isinstance(v, float) else v) for key, v in runs[-1].items()}),
                      file=sys.stderr, flush=True)
            default = next(run for run in reversed(runs) if run["mode"] == "specedge default")
            default["identical"] = answers["specedge default"] == answers["specedge plain"]
    llama.close()
    identical = all(r.get("identical", True) for r in runs)
    rows = summarize(runs, [int(c["length"]) for c in chats])
    print(report(rows, cpu_info().label(), llama.version))
    print(f"\nevery speculative run token-identical to plain decoding: {identical}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"cpu": cpu_info().to_dict(), "llama_cpp_python": llama.version,
                                         "args": {k: str(v) for k, v in vars(args).items()}, "rows": rows,
                                         "runs": runs, "identical": identical}, indent=1))
    if args.plot:
        plot(rows, args.plot)
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
