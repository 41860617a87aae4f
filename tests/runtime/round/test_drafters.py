"""Where each drafter says this round's drafts can come from; the draft model drafts as far as
`go_on` says."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specedge.kernels.sampling import Draws, SamplingParams, top_probability
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.round.drafters import Ask, DraftModelDrafter, HybridDrafter, NgramDrafter

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


def brute_match(context: list[int], k: int, max_ngram: int = 8) -> tuple[list[int], int]:
    """The lookup by its definition: the longest suffix (up to max_ngram) seen before with a token
    after it, its latest such place, the tokens from there."""
    for n in range(min(max_ngram, len(context) - 1), 0, -1):
        ends = [i + n for i in range(len(context) - n) if context[i:i + n] == context[-n:]]
        if ends:
            return context[ends[-1]:ends[-1] + k], n
    return [], 0


def test_lookup_is_its_definition_on_random_contexts() -> None:
    """The narrowing search (suffix_ends) against a brute-force search of every suffix."""
    rng = np.random.default_rng(5)
    for _ in range(400):
        alphabet = int(rng.integers(2, 12))
        context = rng.integers(0, alphabet, int(rng.integers(1, 60))).tolist()
        k = int(rng.integers(1, 6))
        assert NgramDrafter().match(context, k) == brute_match(context, k), context
        assert NgramDrafter(max_ngram=3).match(context, k) == brute_match(context, k, 3), context


def test_hybrid_takes_drafts_from_the_source_asked_for(tiny_llama: tuple[Path, Path, Path]) -> None:
    ngram = NgramDrafter()
    model = DraftModelDrafter(OnnxModel(tiny_llama[2]))
    hybrid = HybridDrafter(ngram, model)
    draws, greedy = Draws(0, 300), SamplingParams()
    hybrid.begin(REPEATING)
    assert hybrid.propose(REPEATING, Ask(3, greedy, draws, source="ngram")).tokens == [8, 5, 6]
    from_model = hybrid.propose(REPEATING, Ask(3, greedy, draws, source="model"))
    assert from_model.calls == 3 and len(from_model.tokens) == 3
    assert hybrid.propose(REPEATING, Ask(2, greedy, draws)).tokens == [8, 5]  # no source named: the lookup decides


def test_the_draft_model_asks_go_on_after_each_draft_with_its_confidence(tiny_llama: tuple[Path, Path, Path]) -> None:
    model = OnnxModel(tiny_llama[2])
    asked: list[tuple[int, float]] = []
    greedy, draws = SamplingParams(), Draws(0, 300)

    def after(n: int):
        def go_on(drafted: int, confidence: float) -> bool:
            asked.append((drafted, confidence))
            return drafted < n
        return go_on

    drafter = DraftModelDrafter(model)
    drafter.begin(FRESH)
    full = drafter.propose(FRESH, Ask(5, greedy, draws))  # no rule: all five
    drafter.keep(len(FRESH) - 1)
    two = drafter.propose(FRESH, Ask(5, greedy, draws, go_on=after(2)))
    assert len(full.tokens) == 5 and two.tokens == full.tokens[:2] and two.calls == 2
    assert [d for d, _ in asked] == [1, 2]
    # the confidence: the product of the draft's largest probability at each draft
    tops, cache = [], model.new_cache()
    model.prefill(FRESH[:-1], cache)
    feed = [FRESH[-1]]
    for token in full.tokens[:2]:
        out = model.forward(feed, cache, all_logits=False)
        cache.commit(out.new_keys, out.new_values, feed)
        tops.append(top_probability(out.logits[-1]))
        feed = [token]
    assert [c for _, c in asked] == pytest.approx([tops[0], tops[0] * tops[1]], rel=1e-6)
    assert 0 < asked[1][1] <= asked[0][1] <= 1
    assert np.isfinite(asked[1][1])


def test_lookup_matches_a_suffix_of_at_most_8_tokens() -> None:
    """The longest suffix looked up is 8 tokens (design.md): where the last 9 occurred before, the
    continuation is still that of the latest occurrence of the last 8."""
    nine = [1, 2, 3, 4, 5, 6, 7, 8, 9]
    context = [*nine, 50, *nine[1:], 60, *nine]  # the 9 tokens seen before 50; their last 8 last seen before 60
    assert NgramDrafter().match(context, 2) == ([60, 1], 8)


def test_the_draft_model_proposes_under_the_bias_and_penalties(tiny_llama: tuple[Path, Path, Path]) -> None:
    """The draft's rows get the logit_bias and penalties the target's rows get (Ask.shape), from the
    tokens before each draft: drafts the target's law would then accept."""
    from specedge.kernels.penalties import Penalties

    model = OnnxModel(tiny_llama[2])
    drafter, draws = DraftModelDrafter(model), Draws(0, 300)
    drafter.begin(FRESH)
    plain = drafter.propose(FRESH, Ask(4, SamplingParams(), draws)).tokens
    favoured = next(t for t in range(300) if t not in plain)
    drafter.keep(len(FRESH) - 1)
    biased = SamplingParams(penalties=Penalties(bias=((favoured, 100.0),)))
    assert drafter.propose(FRESH, Ask(4, biased, draws)).tokens == [favoured] * 4
    drafter.keep(len(FRESH) - 1)
    never_twice = SamplingParams(penalties=Penalties(presence=2.0, bias=((favoured, 3.0),)))
    tokens = drafter.propose(FRESH, Ask(6, never_twice, draws, answer_from=len(FRESH))).tokens
    assert len(tokens) == 6 and tokens != [favoured] * 6  # once drafted, the presence penalty weighs on it


def test_a_draft_models_prefill_stops_between_chunks(tiny_llama: tuple[Path, Path, Path]) -> None:
    """The stop a generation is given is asked before every chunk of the draft's prefill, through a
    hybrid drafter too: the chunks before it are kept, none after."""
    from specedge.core.errors import DecodingStopped

    drafter = DraftModelDrafter(OnnxModel(tiny_llama[2]))
    width = drafter.model.manifest.prefill_width
    asked: list[int] = []

    def stop_after_one_chunk() -> str:
        asked.append(drafter.cache.length)
        return "interrupted" if drafter.cache.length >= width else ""

    context = [3 + i % 50 for i in range(3 * width + 2)]
    with pytest.raises(DecodingStopped):
        HybridDrafter(NgramDrafter(), drafter).begin(context, stop_after_one_chunk)
    assert asked == [0, width] and drafter.cache.length == width


def test_a_generations_drafts_are_counted_under_their_source(tiny_llama: tuple[Path, Path, Path]) -> None:
    """GenerationStats.drafted_by_source and accepted_by_source (docs/design.md) name where each
    draft came from: prompt lookup's drafts count as "ngram", and the counts add up to the totals."""
    gen = Generator.load(tiny_llama[1], ngram=True, config=SpecConfig(max_new_tokens=40, ignore_eos=True, gamma=4))
    stats = gen.generate("ab ab ab ab ab ab ab ab ab ab ab ab").stats
    assert stats.drafted > 0
    assert stats.drafted_by_source == {"ngram": stats.drafted}
    assert sum(stats.accepted_by_source.values()) == stats.accepted == stats.accepted_by_source.get("ngram", 0)


def test_the_draft_model_says_how_many_tokens_it_caught_up_on(tiny_llama: tuple[Path, Path, Path]) -> None:
    drafter = DraftModelDrafter(OnnxModel(tiny_llama[2]))
    greedy, draws = SamplingParams(), Draws(0, 300)
    drafter.begin(FRESH)
    first = drafter.propose(FRESH, Ask(2, greedy, draws))
    assert first.caught_up == 0  # begin fed all but the pending token
    context = [*FRESH, *first.tokens, 11]  # both drafts accepted, then the target's own: the last draft unseen
    drafter.keep(len(context) - 1)
    assert drafter.propose(context, Ask(1, greedy, draws)).caught_up == 1
    later = [*context, 12, 13, 14]  # plain steps since: 12 and 13 unseen, 14 pending
    drafter.keep(len(context))
    assert drafter.propose(later, Ask(1, greedy, draws)).caught_up == 2
