"""Draw the README's headline picture: speed over plain decoding, per prompt kind, from one benchmark folder.

Reads `results.json` (written by `specedge bench`) and, when present, `vs_genai_abab.json` (written by
`bench/reference/plain_abab.py`) in the folder given by --results, and writes a grouped bar chart to --out:
for chat, code and edit prompts, the median decoding speed (tokens/s after the first token) relative to plain
1-token decoding of the same export, for specedge's default way and its draft-only way; and onnxruntime-genai's
best mode relative to genai's own plain decoding (from the interleaved A/B run, a separate run of the same day).

    .venv/bin/python scripts/headline_plot.py
    .venv/bin/python scripts/headline_plot.py --results bench/results/epyc-zen4-vnni-hybrid \
        --out bench/results/headline.png
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

KINDS = ("chat", "code", "edit")
CPU_NAME = "2-vCPU AMD EPYC (Zen 4, AVX-512 VNNI)"
SPECEDGE_SERIES = (
    ("default", "specedge default (int4 target + 0.5B draft + n-gram lookup, γ auto)"),
    ("draft-auto", "specedge, 0.5B draft only (γ auto)"),
)
GENAI_MODES = ("genai plain", "genai draft", "genai ngram")


def load_json(path: Path) -> dict[str, Any]:
    with path.open(encoding="utf-8") as f:
        data: dict[str, Any] = json.load(f)
    return data


def specedge_ratios(results: dict[str, Any]) -> dict[str, dict[str, float]]:
    """{mode: {kind: median ratio to plain decoding of the same export}} for the modes the run has."""
    summary = results["summary"]
    ratios: dict[str, dict[str, float]] = {}
    for mode, _ in SPECEDGE_SERIES:
        if all(mode in summary.get(kind, {}) for kind in KINDS):
            ratios[mode] = {kind: float(summary[kind][mode]["ratio"]) for kind in KINDS}
    return ratios


def genai_best_ratios(abab: dict[str, Any]) -> tuple[dict[str, float], dict[str, str]]:
    """Per kind, genai's fastest mode (by median decode tokens/s) over genai's plain decoding, and which mode."""
    speeds: dict[tuple[str, str], list[float]] = defaultdict(list)
    for sample in abab["samples"]:
        speeds[(sample["kind"], sample["mode"])].append(float(sample["decode_tok_s"]))
    ratios: dict[str, float] = {}
    best_modes: dict[str, str] = {}
    for kind in KINDS:
        medians = {mode: statistics.median(speeds[(kind, mode)]) for mode in GENAI_MODES if speeds[(kind, mode)]}
        if "genai plain" not in medians:
            continue
        best = max(medians, key=lambda mode: medians[mode])
        ratios[kind] = medians[best] / medians["genai plain"]
        best_modes[kind] = best.removeprefix("genai ")
    return ratios, best_modes


def all_identical(results: dict[str, Any]) -> bool:
    """Whether every plotted specedge run gave plain decoding's tokens."""
    summary = results["summary"]
    return all(summary[kind][mode]["identical"] == summary[kind][mode]["prompts"]
               for kind in KINDS for mode, _ in SPECEDGE_SERIES if mode in summary.get(kind, {}))


def draw(results_dir: Path, out: Path, cpu: str) -> None:
    results = load_json(results_dir / "results.json")
    meta = results["meta"]
    series: list[tuple[str, list[float], list[str]]] = []
    names = dict(SPECEDGE_SERIES)
    for mode, ratios in specedge_ratios(results).items():
        series.append((names[mode], [ratios[kind] for kind in KINDS], ["" for _ in KINDS]))
    abab_path = results_dir / "vs_genai_abab.json"
    if abab_path.is_file():
        genai, best_modes = genai_best_ratios(load_json(abab_path))
        if all(kind in genai for kind in KINDS):
            series.append(("onnxruntime-genai 0.18, its best mode (over its own plain decoding)",
                           [genai[kind] for kind in KINDS], [best_modes[kind] for kind in KINDS]))
    if not series:
        raise SystemExit(f"{results_dir / 'results.json'} has no default or draft-auto runs to plot")

    fig, ax = plt.subplots(figsize=(8.0, 4.6), dpi=120)
    width = 0.8 / len(series)
    colours = ("#1f6fb4", "#7fb3e0", "#b0b0b0")
    for i, (label, values, notes) in enumerate(series):
        xs = [k + (i - (len(series) - 1) / 2) * width for k in range(len(KINDS))]
        bars = ax.bar(xs, values, width, label=label, color=colours[i % len(colours)], edgecolor="black",
                      linewidth=0.5)
        for bar, value, note in zip(bars, values, notes, strict=True):
            text = f"{value:.2f}x" + (f"\n{note}" if note else "")
            ax.annotate(text, (bar.get_x() + bar.get_width() / 2, bar.get_height()), xytext=(0, 2),
                        textcoords="offset points", ha="center", va="bottom", fontsize=7.5)
    ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="plain decoding (1.0)")
    ax.set_xticks(range(len(KINDS)), [f"{kind} (6 prompts)" for kind in KINDS])
    ax.set_xlabel("prompt kind (bench/prompts.jsonl, greedy, up to 128 new tokens)")
    ax.set_ylabel("median decoding speed / plain decoding")
    top = max(max(values) for _, values, _ in series)
    ax.set_ylim(0, top * 1.25)
    same = "every specedge run token-identical to plain decoding" if all_identical(results) else ""
    ax.set_title(f"Qwen2.5-Coder 1.5B (+0.5B draft) on a {cpu}, {meta.get('date', 'undated')}\n{same}",
                 fontsize=10)
    ax.legend(fontsize=7.5, loc="upper left", frameon=False)
    ax.spines[["top", "right"]].set_visible(False)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("bench/results/epyc-zen4-vnni-hybrid"),
                        help="a `specedge bench` output folder (results.json, optional vs_genai_abab.json)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/headline.png"), help="the PNG to write")
    parser.add_argument("--cpu", default=CPU_NAME, help="the CPU the run was measured on, for the title")
    args = parser.parse_args()
    draw(args.results, args.out, args.cpu)
    print(args.out)


if __name__ == "__main__":
    main()
