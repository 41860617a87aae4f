"""specedge against onnxruntime-genai in alternating passes (A B A B ...), so the drift of a shared
machine hits both sides alike. Ours decodes plainly in 1-token steps, or with --draft (and --ngram:
hybrid) speculatively at γ auto, or with `--ours default` as `specedge chat` does by default on this
CPU (specedge/choose.py: the measured export, with or without drafts). Genai runs each of
--genai-modes (plain; draft: its speculative decoding with --genai-draft at k = 4; ngram: its
prompt lookup) in every pass. Greedy, exactly 128 new tokens (EOS ignored on both sides: the two
int4 builds stop at different places, and a shorter answer is decoded over a shorter context, so
stopping at EOS would compare different work). Per prompt kind: median decode tokens/s, end-to-end
tokens/s (prefill included) and time to first token over every pass, and ours over genai's best mode.

    python bench/reference/plain_abab.py --ours default --genai-python $GENAI/venv/bin/python \
        --genai-model $GENAI/models/qwen2.5-coder-1.5b-instruct-int4 \
        --genai-draft $GENAI/models/qwen2.5-coder-0.5b-instruct-int4 --genai-modes plain,draft,ngram

($GENAI: onnxruntime-genai's folder of its own, bench/reference/README.md.)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from specedge.bench import load_prompts
from specedge.models.registry import DEFAULT_PAIR
from specedge.options import artifact_arg, default_pair
from specedge.runtime import Generator, SpecConfig

HERE = Path(__file__).parent
NEW_TOKENS = 128
METRICS = ("decode_tok_s", "e2e_tok_s", "ttft_s")


def ours_pass(gen: Generator, rows: list[dict[str, str]]) -> list[dict]:
    out = []
    for row in rows:
        stats = gen.generate(row["prompt"], chat=True).stats
        out.append({"kind": row["kind"], "mode": "specedge", "decode_tok_s": stats.tokens_per_s,
                    "e2e_tok_s": stats.n_tokens / stats.time_total_s, "ttft_s": stats.time_prefill_s})
    return out


def genai_pass(python: str, model: str, draft: str | None, modes: str, prompts: Path) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "genai.json"
        command = [python, str(HERE / "genai_bench.py"), "--target", model, "--prompts", str(prompts),
                   "--out", str(out), "--modes", modes, "--max-new-tokens", str(NEW_TOKENS)]
        subprocess.run(command + (["--draft", draft] if draft else []), check=True, stdout=subprocess.DEVNULL)
        return [{"kind": r["kind"], "mode": f"genai {r['mode']}", **{m: r[m] for m in METRICS}}
                for r in json.loads(out.read_text())["results"]]


def medians(samples: list[dict], metric: str) -> dict[str, dict[str, float]]:
    """kind -> mode -> median of the metric."""
    kinds, modes = sorted({s["kind"] for s in samples}), list(dict.fromkeys(s["mode"] for s in samples))
    return {kind: {mode: statistics.median(s[metric] for s in samples if s["kind"] == kind and s["mode"] == mode)
                   for mode in modes} for kind in kinds}


def ours_generator(args: argparse.Namespace) -> tuple[Generator, str]:
    speculative = SpecConfig(auto_gamma=True, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    plain = SpecConfig(gamma=0, max_new_tokens=NEW_TOKENS, ignore_eos=True)
    if args.ours == "default":  # as `specedge chat` decodes here
        way = default_pair(DEFAULT_PAIR)
        gen = Generator.load(way.target, draft=way.draft, ngram=way.ngram,
                             config=plain if way.single_steps else speculative, single_steps=way.single_steps)
        return gen, f"default: {way.line}"
    target = artifact_arg(args.ours)
    if args.draft:
        gen = Generator.load(target, draft=artifact_arg(args.draft), ngram=args.ngram, config=speculative)
        return gen, "hybrid" if args.ngram else "draft γ auto"
    return Generator.load(target, config=plain, single_steps=True), "plain"


def table(samples: list[dict], metric: str, higher_is_better: bool = True) -> str:
    rows = medians(samples, metric)
    modes = list(next(iter(rows.values())))
    lines = ["| kind | " + " | ".join(modes) + " | specedge / genai's best |", "|---" * (len(modes) + 2) + "|"]
    for kind, by_mode in rows.items():
        genai = [v for m, v in by_mode.items() if m.startswith("genai")]
        best = max(genai) if higher_is_better else min(genai)
        ratio = by_mode["specedge"] / best if higher_is_better else best / by_mode["specedge"]
        lines.append(f"| {kind} | " + " | ".join(f"{by_mode[m]:.2f}" for m in modes) + f" | {ratio:.2f} |")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True,
                   help="a specedge target (folder or NAME:QUANT), or 'default' (as chat decodes here)")
    p.add_argument("--draft", help="decode ours speculatively with this draft artifact (γ auto)")
    p.add_argument("--ngram", action="store_true", help="with --draft: hybrid drafting")
    p.add_argument("--genai-python", required=True)
    p.add_argument("--genai-model", required=True)
    p.add_argument("--genai-draft", help="genai model folder of the draft (for genai mode 'draft')")
    p.add_argument("--genai-modes", default="plain")
    p.add_argument("--prompts", type=Path, default=HERE.parent / "prompts.jsonl")  # the checkout's bench/prompts.jsonl
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--out", type=Path, help="also write the samples (JSON) and the tables (Markdown) here")
    args = p.parse_args()
    rows = load_prompts(args.prompts)
    gen, ours_mode = ours_generator(args)
    gen.generate(rows[0]["prompt"], chat=True, max_new_tokens=16)  # warm-up, as genai_bench does
    samples: list[dict] = []
    for _ in range(args.rounds):
        samples += ours_pass(gen, rows)
        samples += genai_pass(args.genai_python, args.genai_model, args.genai_draft, args.genai_modes, args.prompts)
    from specedge.device_profiles.cpu import cpu_info

    cpu = cpu_info()
    report = "\n\n".join([
        "# specedge against onnxruntime-genai, interleaved", "`python " + " ".join(sys.argv) + "`",
        f"{args.rounds} rounds A/B, {len(rows)} prompts, greedy, {NEW_TOKENS} tokens; specedge = {ours_mode}; "
        f"CPU: {cpu.label()}",
        "Median decode tokens/s\n\n" + table(samples, "decode_tok_s"),
        "Median end-to-end tokens/s (prefill included)\n\n" + table(samples, "e2e_tok_s"),
        "Median time to first token, s (ratio: genai's shortest over ours)\n\n" + table(samples, "ttft_s", False)])
    print(report)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "vs_genai_abab.md").write_text(report + "\n")
        (args.out / "vs_genai_abab.json").write_text(json.dumps({"cpu": cpu.to_dict(), "ours": ours_mode,
                                                                 "samples": samples}, indent=1))


if __name__ == "__main__":
    main()
