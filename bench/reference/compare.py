"""specedge against onnxruntime-genai, per prompt kind: median decode tokens/s of each side's
modes, from `bench/results/results.json` (specedge bench) and a genai_bench.py output.

    python bench/reference/compare.py bench/results/results.json bench/results/genai.json > bench/results/vs_genai.md

The two runs follow each other on the same machine, not interleaved per prompt as specedge's own
modes are, so drift of the machine between them enters these ratios.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

OURS = ("plain", "baseline-plain", "draft-auto", "ngram", "hybrid", "baseline-draft-auto", "baseline-hybrid")
SPECULATIVE = ("draft-auto", "ngram", "hybrid", "baseline-draft-auto", "baseline-hybrid")


def medians(rows: list[dict], speed_key: str) -> dict[str, dict[str, float]]:
    """kind -> mode -> median tokens/s."""
    out: dict[str, dict[str, float]] = {}
    for kind in sorted({r["kind"] for r in rows}):
        out[kind] = {}
        for mode in dict.fromkeys(r["mode"] for r in rows):
            speeds = [r[speed_key] for r in rows if r["kind"] == kind and r["mode"] == mode and r[speed_key]]
            if speeds:
                out[kind][mode] = statistics.median(speeds)
    return out


def main() -> None:
    ours_file, genai_file = Path(sys.argv[1]), Path(sys.argv[2])
    ours = medians(json.loads(ours_file.read_text())["runs"], "tokens_per_s")
    genai_data = json.loads(genai_file.read_text())
    genai = medians(genai_data["results"], "decode_tok_s")
    versions = genai_data["meta"].get("versions", {})
    print(f"# specedge vs onnxruntime-genai {versions.get('onnxruntime_genai', '')}\n")
    print("Median decode tokens/s per prompt kind (greedy, up to 128 new tokens, stop at EOS). "
          "genai: its own int4 builds of the same checkpoints. Ours: the target's plain decoding and, "
          "with --baseline, the baseline export's in 1-token steps; speculative modes over the target, "
          "and over the baseline where it verifies in row pairs ('baseline-...').\n")
    print("| kind | genai plain | genai draft k=4 | genai n-gram | ours plain (target) | ours plain (baseline) "
          "| ours γ auto | ours n-gram | ours hybrid | baseline γ auto | baseline hybrid "
          "| our best speculative / genai best | our best of all / genai best | our plain / genai plain |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for kind in ours:
        g, o = genai.get(kind, {}), ours[kind]
        best_g = max(g.values()) if g else 0.0
        best_o = max(o.get(m, 0.0) for m in SPECULATIVE)
        plain_o = max(o.get("plain", 0.0), o.get("baseline-plain", 0.0))
        cells = [g.get(m) for m in ("plain", "draft", "ngram")] + [o.get(m) for m in OURS]
        text = " | ".join(f"{c:.1f}" if c else "-" for c in cells)
        ratio = f"{best_o / best_g:.2f}" if best_g else "-"
        ratio_all = f"{max(best_o, plain_o) / best_g:.2f}" if best_g else "-"
        plain_ratio = f"{plain_o / g['plain']:.2f}" if g.get("plain") else "-"
        print(f"| {kind} | {text} | {ratio} | {ratio_all} | {plain_ratio} |")


if __name__ == "__main__":
    main()
