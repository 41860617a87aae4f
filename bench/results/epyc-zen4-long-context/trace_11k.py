"""Section 7's trace: the default at one length, generation after generation over one Generator (its
recall carried), each round as γ auto saw it: the source, drafts proposed and accepted, the drafting
and verification times (ms), the width, the tokens the draft caught up on, and after the round the
predicted rates of plain decoding (r0) and of one draft (r1), the source's acceptance, drafting time
and catch-up time per token (ms).

    .venv/bin/python bench/results/epyc-zen4-long-context/trace_11k.py 11000 4
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from long_context_bench import DRAFT, TARGET, prompts

from specedge.resolve import resolve_model
from specedge.runtime import Generator, SpecConfig
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.round import gamma
from specedge.runtime.round.drafters import build_drafter

LOG: list[dict[str, object]] = []


def ms(x: float | None) -> float | None:
    return None if x is None else round(x * 1e3, 2)


def traced(observe):  # type: ignore[no-untyped-def]
    def observe_and_log(self: gamma.GammaController, o: gamma.Outcome) -> None:
        observe(self, o)
        s = self.sources.get(o.source)
        LOG.append({"src": o.source, "p": o.proposed, "a": o.accepted, "ds": ms(o.draft_seconds),
                    "vs": ms(o.verify_seconds), "w": o.width, "cu": o.caught_up, "r0": round(self.rate(0), 1),
                    "r1": round(self.rate(1, o.source), 1) if o.proposed else None,
                    "alpha": round(s.alpha, 2) if s else None, "td": ms(s.t_draft) if s else None,
                    "tcu": ms(s.t_catch_up) if s else None})
    return observe_and_log


def main() -> None:
    length, generations = int(sys.argv[1]), int(sys.argv[2])
    tp, dp = resolve_model(TARGET, "int4", context=16384), resolve_model(DRAFT, context=16384)
    gen = Generator(OnnxModel(tp, threads=2), build_drafter(OnnxModel(dp, threads=2), True), SpecConfig.auto())
    gamma.GammaController.observe = traced(gamma.GammaController.observe)  # this process only
    ids = gen.encode(prompts(gen, [length], ["chat"])[0]["chat"], chat=True)
    for g in range(generations):
        LOG.clear()
        s = gen.generate(ids, max_new_tokens=64, ignore_eos=True).stats
        print("generation", g, round(s.tokens_per_s, 2), s.gamma_counts, s.drafted_by_source, s.accepted_by_source)
        for row in LOG:
            print("  ", json.dumps(row))


if __name__ == "__main__":
    main()
