"""Top-1 agreement of a kernel library with the installed one over long prompts: each prompt of
bench/long_context_bench.py (a 4K summary, an 11K summary and an 11K edit) is answered greedily (64
tokens), then read with its answer teacher-forced (the reference's answer, so the positions match)
and each position's argmax kept. Run once with the installed library (the reference), once with
the library under test (SPECEDGE_KERNEL_LIBRARY), which compares:

    .venv/bin/python bench/results/epyc-zen4-bf16-fidelity/fidelity.py /tmp/ref.npz
    SPECEDGE_KERNEL_LIBRARY=/tmp/libexp.so .venv/bin/python bench/results/epyc-zen4-bf16-fidelity/fidelity.py \
        /tmp/exp.npz /tmp/ref.npz

--prompts 4096-chat,11000-chat reads only those.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / "bench"), str(ROOT / "scripts")]

from long_context_bench import TARGET, prompts  # noqa: E402
from quant_report import teacher_forced_argmax  # noqa: E402

from specedge.resolve import resolve_model  # noqa: E402
from specedge.runtime import Generator, SpecConfig  # noqa: E402
from specedge.runtime.engine.model import OnnxModel  # noqa: E402


def compare(key: str, n: int, answer: list[int], res: dict[str, np.ndarray], ref: dict[str, np.ndarray]) -> str:
    a, b = res[key + "-argmax"], ref[key + "-argmax"]
    first = next((i for i, (x, y) in enumerate(zip(answer, ref[key + "-answer"], strict=False)) if x != y), None)
    late = float((a[2048:] == b[2048:]).mean())
    answer_rows = float((a[n - 1:-1] == b[n - 1:-1]).mean())
    return (f"; top-1 agreement all {float((a == b).mean()):.4f}, from 2048 {late:.4f}, answer positions "
            f"{answer_rows:.4f}; greedy continuation first "
            f"differs at {first}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("ref", nargs="?")
    ap.add_argument("--prompts", default="4096-chat,11000-chat,11000-edit")
    args = ap.parse_args()
    out, ref = args.out, (dict(np.load(args.ref)) if args.ref else None)
    model = OnnxModel(resolve_model(TARGET, "int4", context=16384), spin=True)
    gen = Generator(model, None, SpecConfig(gamma=0, max_new_tokens=64, ignore_eos=True))
    chats = [c for c in prompts(gen, [4096, 11000], ["chat", "edit"]) if f"{c['length']}-{c['kind']}" in
             args.prompts.split(",")]
    res: dict[str, np.ndarray] = {}
    for c in chats:
        key = f"{c['length']}-{c['kind']}"
        ids = gen.encode(c["chat"], chat=True)
        gen.forget()
        answer = gen.generate(ids).token_ids
        res[key + "-answer"] = np.array(answer)
        forced = ref[key + "-answer"].tolist() if ref is not None else answer
        start = time.time()
        res[key + "-argmax"] = teacher_forced_argmax(model, ids + forced)
        msg = f"{key}: {len(ids)} prompt tokens, forced pass {time.time() - start:.0f} s"
        print(msg + (compare(key, len(ids), answer, res, ref) if ref is not None else ""), flush=True)
    np.savez(out, **res)


if __name__ == "__main__":
    main()
