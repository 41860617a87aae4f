"""A/B of reading a pass's rows under the penalties lazily and in place (new) against shaping every row
into a copy (old: every verification row copied and stacked, every draft row copied), in one process,
the two taking turns run by run. Greedy under Qwen's default repetition penalty 1.05 - what a server
gives a greedy request that names no penalty under the model's defaults - with the default pair (the
0.5B draft and the n-gram lookup, γ auto), 4 chat prompts of bench/prompts.jsonl, 128 tokens:

- `streams`: the 4 at once on 4 slots sharing passes (runtime/streams), aggregate tokens/s;
- `alone`: the same requests one after another on one generator.

    .venv/bin/python bench/results/epyc-zen4-penalty-rows/ab.py ROUNDS
"""

from __future__ import annotations

import contextlib
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from specedge.kernels.penalties import Penalties, Shape
from specedge.kernels.sampling import SamplingParams, argmax
from specedge.runtime import Generator
from specedge.runtime.engine.model import ForwardOutput
from specedge.runtime.round import decoding
from specedge.runtime.streams.slots import Streams

NEW = (decoding.as_read, Shape.applied)


def old_as_read(run: decoding.Run, out: ForwardOutput, tokens: Sequence[int]) -> decoding.ReadRows:
    """Before: every row of the pass shaped into a copy, stacked, and argmaxed."""
    penalties, logits = run.config.sampling.penalties, out.logits
    if penalties.active:
        before = len(tokens) - len(logits) + 1
        shape = penalties.bind(tokens[:before], run.answer_from, run.seen_ids)
        logits = np.stack([shape(row, tokens[before:before + i]) for i, row in enumerate(logits)])
    return decoding.ReadRows(logits, argmax(logits) if logits is not out.logits else out.next_ids)


@contextlib.contextmanager
def old_applied(self: Shape, logits: np.ndarray, extra: Sequence[int] = ()) -> Iterator[np.ndarray]:
    """Before: a draft's row shaped into a copy."""
    yield self(logits, extra)


def use(old: bool) -> None:
    decoding.as_read, Shape.applied = (old_as_read, old_applied) if old else NEW  # type: ignore[assignment]


def main() -> None:
    rounds = int(sys.argv[1])
    prompts = [json.loads(line)["prompt"] for line in Path("bench/prompts.jsonl").read_text().splitlines()
               if line and json.loads(line)["kind"] == "chat"][:4]
    import specedge
    model = specedge.load("qwen2.5-coder")
    gen: Generator = model.generator
    streams = Streams(gen, 4)
    params = SamplingParams(penalties=Penalties(repetition=1.05))
    rates: dict[str, list[float]] = {f"{way} {mode}": [] for way in ("streams", "alone") for mode in ("new", "old")}
    tokens: dict[str, list[list[int]]] = {}
    for r in range(rounds + 1):  # the first round warms both
        for mode in (["new", "old"] if r % 2 == 0 else ["old", "new"]):
            use(mode == "old")
            start = time.perf_counter()
            out = streams.generate(prompts, chat=True, sampling=params, max_new_tokens=128, ignore_eos=True)
            at_once = sum(len(o.token_ids) for o in out) / (time.perf_counter() - start)
            start = time.perf_counter()
            alone = [gen.generate(p, chat=True, sampling=params, max_new_tokens=128, ignore_eos=True) for p in prompts]
            one_by_one = sum(len(o.token_ids) for o in alone) / (time.perf_counter() - start)
            tokens.setdefault("reference", [o.token_ids for o in alone])
            assert [o.token_ids for o in out] == tokens["reference"] == [o.token_ids for o in alone], mode
            if r:
                rates[f"streams {mode}"].append(at_once)
                rates[f"alone {mode}"].append(one_by_one)
            print(f"round {r} {mode}: 4 at once {at_once:.1f} tok/s, one after another {one_by_one:.1f}", flush=True)
    use(False)
    for way in ("streams", "alone"):
        new, old = rates[f"{way} new"], rates[f"{way} old"]
        ratios = [a / b for a, b in zip(new, old, strict=True)]
        print(f"{way}: new {statistics.median(new):.1f} tok/s, old {statistics.median(old):.1f}, "
              f"new / old median {statistics.median(ratios):.3f} ({', '.join(f'{x:.3f}' for x in ratios)})")


if __name__ == "__main__":
    main()
