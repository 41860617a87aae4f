"""Greedy speculative decoding is token-identical to greedy plain decoding of the same target."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from specedge.runtime import Generator, SpecConfig
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS

LONG_PROMPT = "def fib(n):\n    return"  # 20 tokens: more than one 8-token prefill chunk
SHORT_PROMPT = "abcabcab"


def plain_tokens(target: Path, prompt: str, max_new: int) -> list[int]:
    gen = Generator.load(target, config=SpecConfig(gamma=0, max_new_tokens=max_new, ignore_eos=True))
    return gen.generate(prompt).token_ids


@pytest.mark.parametrize("gamma", [1, 2, 4, 7])
@pytest.mark.parametrize("drafter", ["draft-model", "ngram"])
def test_speculative_equals_plain(tiny_pair: tuple[Path, Path, Path], gamma: int, drafter: str) -> None:
    _, target, draft = tiny_pair
    config = SpecConfig(gamma=gamma, max_new_tokens=24, ignore_eos=True)
    for prompt in (LONG_PROMPT, SHORT_PROMPT):
        spec = Generator.load(target, draft=draft if drafter == "draft-model" else None,
                              ngram=drafter == "ngram", config=config)
        result = spec.generate(prompt)
        assert result.token_ids == plain_tokens(target, prompt, 24)
        assert result.stats.drafter == drafter
        assert result.stats.target_calls < result.stats.n_tokens or result.stats.accepted == 0


@pytest.mark.parametrize("gamma", [1, 4, 7])
def test_runs_to_context_capacity(tiny_pair: tuple[Path, Path, Path], gamma: int) -> None:
    _, target, draft = tiny_pair
    plain = plain_tokens(target, LONG_PROMPT, 1000)
    for kwargs in ({"draft": draft}, {"ngram": True}):
        gen = Generator.load(target, config=SpecConfig(gamma=gamma, max_new_tokens=1000, ignore_eos=True),
                             **kwargs)
        result = gen.generate(LONG_PROMPT)
        assert result.stats.stop_reason == "context"
        assert result.token_ids == plain
        assert result.stats.prompt_tokens + result.stats.n_tokens == TINY_CONTEXT + 1


def test_draft_model_is_accepted_often(tiny_llama: tuple[Path, Path, Path]) -> None:
    """The tiny draft is a perturbed target: acceptance must be neither 0 nor 1, so the test above
    exercises partial acceptance, rollback and bonus tokens."""
    _, target, draft = tiny_llama
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=4, max_new_tokens=40, ignore_eos=True))
    stats = gen.generate(LONG_PROMPT).stats
    assert 0.2 < stats.acceptance_rate < 1.0, stats.acceptance_rate
    assert stats.tokens_per_target_pass > 1.2


@pytest.mark.parametrize("drafter", ["draft-model", "ngram", "hybrid"])
def test_auto_gamma_equals_plain(tiny_pair: tuple[Path, Path, Path], drafter: str) -> None:
    _, target, draft = tiny_pair
    config = SpecConfig(gamma=4, auto_gamma=True, max_new_tokens=40, ignore_eos=True)
    gen = Generator.load(target, draft=draft if drafter != "ngram" else None, ngram=drafter != "draft-model",
                         config=config)
    result = gen.generate(LONG_PROMPT)
    assert result.token_ids == plain_tokens(target, LONG_PROMPT, 40)
    assert result.stats.gamma_auto and sum(result.stats.gamma_counts.values()) == result.stats.target_calls


@pytest.mark.parametrize("gamma", [2, 4])
def test_hybrid_drafting_equals_plain(tiny_pair: tuple[Path, Path, Path], gamma: int) -> None:
    _, target, draft = tiny_pair
    gen = Generator.load(target, draft=draft, ngram=True,
                         config=SpecConfig(gamma=gamma, max_new_tokens=30, ignore_eos=True))
    for prompt in (SHORT_PROMPT, LONG_PROMPT):  # the short prompt repeats: lookup proposes there
        result = gen.generate(prompt)
        assert result.token_ids == plain_tokens(target, prompt, 30)
        assert result.stats.drafter == "hybrid"


def test_a_draft_with_a_truncated_head_stays_lossless(tiny_pair: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The target's own weights as a draft whose head scores ids below 100 only: right wherever
    the target's token is below 100, never where it is not."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    src, target, _ = tiny_pair
    draft = export_model(src, tmp_path / "head100", ExportSettings(
        quant="fp32", context=TINY_CONTEXT, widths=TINY_WIDTHS, attention="fused", head_vocab=100)).path
    gen = Generator.load(target, draft=draft, config=SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True))
    result = gen.generate(LONG_PROMPT)
    plain = plain_tokens(target, LONG_PROMPT, 24)
    assert result.token_ids == plain
    assert result.stats.accepted > 0


def test_rounds_the_draft_rule_lengthens_and_cuts_stay_lossless(tiny_pair: tuple[Path, Path, Path],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """γ auto with the per-draft rule (runtime/round/gamma.py): rounds ask for up to the reach, past the γ
    planned (2 here), the draft model stops where the rule says (after 1, 4 or 7 drafts in turn),
    and the tokens are still plain decoding's."""
    from specedge.runtime.round.gamma import GammaController

    lengths = iter([1, 4, 7] * 100)  # drafts a round of the exported widths 2, 5 and 8 holds

    def rule(self: GammaController, source: str):
        n = next(lengths)
        return lambda drafted, confidence: drafted < n

    monkeypatch.setattr(GammaController, "drafting_rule", rule)
    monkeypatch.setattr(GammaController, "plan", lambda self, sources: (sources[0], 2))  # drafts every round
    _, target, draft = tiny_pair
    config = SpecConfig(gamma=2, auto_gamma=True, max_new_tokens=60, ignore_eos=True)
    result = Generator.load(target, draft=draft, config=config).generate(LONG_PROMPT)
    assert result.token_ids == plain_tokens(target, LONG_PROMPT, 60)
    assert {1, 4, 7} <= set(result.stats.drafts_counts), result.stats.drafts_counts  # the drafts each round made
    off = dataclasses.replace(config, per_draft=False)  # γ auto's γ each round: the rule unused
    result = Generator.load(target, draft=draft, config=off).generate(LONG_PROMPT)
    assert result.token_ids == plain_tokens(target, LONG_PROMPT, 60) and set(result.stats.gamma_counts) == {2}
    assert max(result.stats.drafts_counts) == 2  # no round longer than its γ (the last ones: what room is left)
