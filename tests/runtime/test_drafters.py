"""Where each drafter says this round's drafts can come from."""

from __future__ import annotations

from pathlib import Path

from specedge.kernels.sampling import Draws, SamplingParams
from specedge.runtime import OnnxModel
from specedge.runtime.drafters import DraftModelDrafter, HybridDrafter, NgramDrafter

REPEATING = [5, 6, 7, 8, 5, 6, 7]  # ends in "5 6 7", seen before, followed by 8 5 6 7
SHORT_MATCH = [5, 6, 7, 8, 9, 6, 7]  # ends in "6 7", seen before: a 2-token match
FRESH = [5, 6, 7, 8, 9]


def test_sources_follow_the_context(tiny_llama: tuple[Path, Path, Path]) -> None:
    ngram = NgramDrafter()
    model = DraftModelDrafter(OnnxModel(tiny_llama[2]))
    hybrid = HybridDrafter(ngram, model)
    assert ngram.sources(REPEATING) == ("ngram",) and ngram.sources(FRESH) == ()
    assert model.sources(FRESH) == ("model",)
    assert hybrid.sources(REPEATING) == ("ngram",) and hybrid.sources(FRESH) == ("model",)
    assert ngram.match(SHORT_MATCH, 2) == ([8, 9], 2) and hybrid.sources(SHORT_MATCH) == ("model",)


def test_lookup_copies_from_the_longest_match_not_the_latest() -> None:
    context = [1, 2, 3, 4, 50, 9, 3, 4, 60, 1, 2, 3, 4]  # "3 4" last seen before 60, "1 2 3 4" before 50
    assert NgramDrafter().match(context, 2) == ([50, 9], 4)
    assert NgramDrafter(max_ngram=2).match(context, 2) == ([60, 1], 2)


def test_hybrid_takes_drafts_from_the_source_asked_for(tiny_llama: tuple[Path, Path, Path]) -> None:
    ngram = NgramDrafter()
    model = DraftModelDrafter(OnnxModel(tiny_llama[2]))
    hybrid = HybridDrafter(ngram, model)
    draws, greedy = Draws(0, 300), SamplingParams()
    hybrid.begin(REPEATING)
    assert hybrid.propose(REPEATING, 3, greedy, draws, source="ngram").tokens == [8, 5, 6]
    from_model = hybrid.propose(REPEATING, 3, greedy, draws, source="model")
    assert from_model.calls == 3 and len(from_model.tokens) == 3
    assert hybrid.propose(REPEATING, 2, greedy, draws).tokens == [8, 5]  # no source named: the lookup's match decides
