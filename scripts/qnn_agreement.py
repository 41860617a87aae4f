"""How close are a QNN export's logits on Qualcomm's HTP (onnxruntime-qnn; on x86_64 its compiler
and simulator) to the same graph on the CPU provider, and to a CPU reference export? Positions
0..n-1 of real text, each text read in one pass of its width (on QNN: the widest verification graph,
padded), so a simulated 1.5B costs one pass a text.

    .venv/bin/python scripts/qnn_agreement.py ARTIFACT [--reference CPU_EXPORT] [--positions 8] [--soc 60]

Prints per text the top-1 agreement and the largest |Δlogit| at each position, then the totals.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from specedge.core.manifest import load_manifest
from specedge.runtime import OnnxModel, qnn
from specedge.runtime.text.codec import TextCodec

TEXTS = [  # code, prose, a chat turn: kinds of text the pair serves
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:",
    "The memory bus of a phone moves tens of gigabytes a second, so decoding one stream is bound by it.",
    "<|im_start|>user\nHow do I reverse a list in Python?<|im_end|>\n<|im_start|>assistant\nUse",
]


def logit_rows(folder: Path, provider: str, ids: list[int]) -> np.ndarray:
    """Logits [len(ids), V] of ids read from an empty cache in one pass."""
    model = OnnxModel(folder, provider=provider)
    return model.forward(ids, model.new_cache()).logits.copy()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("artifact", type=Path)
    parser.add_argument("--reference", type=Path, help="a CPU export of the same checkpoint (e.g. fp32 or int4)")
    parser.add_argument("--positions", type=int, default=8)
    parser.add_argument("--soc", default=None)
    args = parser.parse_args()
    qnn.set_default_soc(args.soc)
    codec = TextCodec(args.artifact, load_manifest(args.artifact))  # the tokenizer only: no session
    totals = {"cpu": [0, 0], "ref": [0, 0]}
    worst = 0.0
    for text in TEXTS:
        ids = codec.encode(text)[:args.positions]
        cpu = logit_rows(args.artifact, "cpu", ids)
        start = time.perf_counter()
        htp = logit_rows(args.artifact, "qnn", ids)
        seconds = time.perf_counter() - start
        dlogit = np.abs(cpu - htp).max(-1)
        worst = max(worst, float(dlogit.max()))
        same = int((cpu.argmax(-1) == htp.argmax(-1)).sum())
        totals["cpu"][0] += same
        totals["cpu"][1] += len(ids)
        shown = " ".join(f"{d:.2f}" for d in dlogit)
        line = f"{text[:40]!r:44} HTP vs CPU top-1 {same}/{len(ids)}, max |dlogit| {shown}"
        if args.reference:
            ref = logit_rows(args.reference, "cpu", ids)
            agree = int((ref.argmax(-1) == htp.argmax(-1)).sum())
            totals["ref"][0] += agree
            totals["ref"][1] += len(ids)
            line += f"; vs reference {agree}/{len(ids)}"
        print(f"{line} ({seconds:.0f} s on QNN, compile included)", flush=True)
    cpu_same, n = totals["cpu"]
    print(f"total: HTP vs CPU provider top-1 {cpu_same}/{n} ({cpu_same / n:.1%}), largest |dlogit| {worst:.2f}")
    if args.reference:
        ref_same, n = totals["ref"]
        print(f"total: HTP vs reference {args.reference.name} top-1 {ref_same}/{n} ({ref_same / n:.1%})")


if __name__ == "__main__":
    main()
