"""GenerationStats: what its counts add up to, and the keys `to_dict` gives scripts."""

from __future__ import annotations

from specedge.runtime.round.stats import OLD_TOKENS_PER_PASS_KEY, GenerationStats, RoundCounts


def rounds() -> GenerationStats:
    """Two passes: 2 of 4 drafts accepted then 1 of 1 guess, and a plain step."""
    stats = GenerationStats(gamma=4)
    stats.record_round(RoundCounts(proposed=4, accepted=2, gamma=4, guessed=1, guessed_accepted=1))
    stats.record_round(RoundCounts(proposed=0, accepted=0, gamma=4))
    return stats


def test_tokens_per_target_pass_counts_every_token_a_pass_makes() -> None:
    stats = rounds()
    assert (stats.produced, stats.target_calls, stats.accepted) == (5, 2, 2)
    assert stats.tokens_per_target_pass == 2.5  # (2 drafts + 1 guess + 1) + (0 + 1), over 2 passes
    assert stats.acceptance_rate == 0.5


def test_to_dict_keeps_the_first_name_of_tokens_per_target_pass() -> None:
    d = rounds().to_dict()
    assert d["tokens_per_target_pass"] == d[OLD_TOKENS_PER_PASS_KEY] == 2.5
    assert OLD_TOKENS_PER_PASS_KEY == "mean_accepted_per_target_call"


def test_a_generation_without_passes_makes_no_tokens_per_pass() -> None:
    assert GenerationStats().tokens_per_target_pass == 0.0
