"""Which weight format should the default target use? Top-1 agreement with the dequantized fp32
export over a fixed text, plain-decoding tokens/s, and the cost of a 5-wide verification pass
relative to a 1-token step, for fp32, int8, int4 and w8a8.

    .venv/bin/python scripts/quant_report.py [--model qwen2.5-coder-1.5b] [--quants fp32,int4,w8a8]
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

from specedge.eval_text import EVAL_TEXT
from specedge.profiling import time_widths
from specedge.resolve import resolve_model
from specedge.runtime import Generator, OnnxModel, SpecConfig

PROMPTS = ["Write a Python function that merges two sorted lists.", "What is a closure in JavaScript?"]


def teacher_forced_argmax(model: OnnxModel, ids: list[int]) -> np.ndarray:
    cache = model.new_cache()
    out = []
    for i in range(0, len(ids), 64):
        chunk = ids[i:i + 64]
        res = model.forward(chunk, cache, all_logits=True)
        cache.commit(res.new_keys, res.new_values, chunk)
        out.append(res.logits.argmax(-1))
    return np.concatenate(out)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="qwen2.5-coder-1.5b")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--quants", default="fp32,int8,int4,w8a8", help="fp32 first: it is the reference")
    args = parser.parse_args()
    paths = {q: resolve_model(args.model, quant=q) for q in args.quants.split(",")}
    reference = None
    print(f"| format | weights on disk | top-1 agreement with fp32 | plain tok/s (median of {len(PROMPTS)}) "
          "| t(5)/t(1) |")
    print("|---|---|---|---|---|")
    for quant, path in paths.items():
        model = OnnxModel(path)
        gen = Generator(model, None, SpecConfig(gamma=0, max_new_tokens=args.max_new_tokens))
        ids = gen.codec.encode(EVAL_TEXT)
        top1 = teacher_forced_argmax(model, ids)
        reference = top1 if reference is None else reference
        agree = float(np.mean(top1 == reference))
        gen.generate("warm up", max_new_tokens=4)
        speed = statistics.median(gen.generate(p, chat=True, ignore_eos=True).stats.tokens_per_s for p in PROMPTS)
        size = (path / "model.onnx.data").stat().st_size / 1e9
        times = time_widths(model, [1, 5])
        wide = times[5] / times[1]
        print(f"| {quant} | {size:.2f} GB | {agree:.1%} of {len(ids)} tokens | {speed:.1f} | {wide:.2f} |")
        del model, gen


if __name__ == "__main__":
    main()
