"""specedge against onnxruntime-genai's plain decoding, in alternating passes (A B A B ...), so the
drift of a shared machine hits both sides alike. Ours decodes plainly in 1-token steps, or with
--draft (and --ngram: hybrid) speculatively at γ auto. Greedy, exactly 128 new tokens (EOS ignored on both
sides: the two int4 builds stop at different places, and a shorter answer is decoded over a shorter
context, so stopping at EOS would compare different work); decode tokens/s, median per prompt kind
over every pass.

    python bench/reference/plain_abab.py --ours plain-int4 --genai-python /work/genai/venv/bin/python \
        --genai-model /work/genai/models/qwen2.5-coder-1.5b-instruct-int4 --rounds 2 [--draft D [--ngram]]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

from specedge.bench import load_prompts
from specedge.runtime import Generator, OnnxModel, SpecConfig

HERE = Path(__file__).parent
NEW_TOKENS = 128


def ours_pass(gen: Generator, rows: list[dict[str, str]]) -> list[tuple[str, float]]:
    return [(row["kind"], gen.generate(row["prompt"], chat=True).stats.tokens_per_s) for row in rows]


def genai_pass(python: str, model: str, prompts: Path) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "genai.json"
        subprocess.run([python, str(HERE / "genai_bench.py"), "--target", model, "--prompts", str(prompts),
                        "--out", str(out), "--modes", "plain", "--max-new-tokens", str(NEW_TOKENS)], check=True,
                       stdout=subprocess.DEVNULL)
        return [(r["kind"], r["decode_tok_s"]) for r in json.loads(out.read_text())["results"]]


def medians(samples: list[tuple[str, float]]) -> dict[str, float]:
    return {kind: statistics.median(s for k, s in samples if k == kind) for kind in sorted({k for k, _ in samples})}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--ours", required=True, help="specedge target artifact")
    p.add_argument("--draft", help="decode ours speculatively with this draft artifact (γ auto)")
    p.add_argument("--ngram", action="store_true", help="with --draft: hybrid drafting")
    p.add_argument("--genai-python", required=True)
    p.add_argument("--genai-model", required=True)
    p.add_argument("--prompts", type=Path, default=Path("bench/prompts.jsonl"))
    p.add_argument("--rounds", type=int, default=2)
    args = p.parse_args()
    rows = load_prompts(args.prompts)
    if args.draft:
        gen = Generator.load(args.ours, draft=args.draft, ngram=args.ngram,
                             config=SpecConfig(auto_gamma=True, max_new_tokens=NEW_TOKENS, ignore_eos=True))
    else:
        gen = Generator(OnnxModel(args.ours, spin=True), None,
                        SpecConfig(gamma=0, max_new_tokens=NEW_TOKENS, ignore_eos=True), single_steps=True)
    gen.generate(rows[0]["prompt"], chat=True, max_new_tokens=16)  # warm-up, as genai_bench does
    ours, genai = [], []
    for _ in range(args.rounds):
        ours += ours_pass(gen, rows)
        genai += genai_pass(args.genai_python, args.genai_model, args.prompts)
    a, b = medians(ours), medians(genai)
    print(f"{args.rounds} rounds A/B, {len(rows)} prompts; median decode tokens/s")
    ours_mode = ("hybrid" if args.ngram else "draft γ auto") if args.draft else "plain"
    print(f"| kind | specedge {ours_mode} | genai plain | specedge / genai |\n|---|---|---|---|")
    for kind in a:
        print(f"| {kind} | {a[kind]:.1f} | {b[kind]:.1f} | {a[kind] / b[kind]:.2f} |")


if __name__ == "__main__":
    main()
