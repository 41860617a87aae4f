"""Constrained decoding through the loop, with a grammar small enough to compute its law exactly:
greedy constrained speculation equals greedy constrained plain decoding, forced tokens ride free,
and sampled output has the constrained law (the target's masked and renormalised)."""

from __future__ import annotations

import zlib
from pathlib import Path

import numpy as np
import pytest

from specedge.kernels.sampling import SamplingParams, probabilities
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.constraints.guide import Guide, mask_rows
from tests.runtime.test_lossless_sampling import PROMPT, VOCAB, small_vocab_pair  # noqa: F401 - a fixture
from tests.stats_tools import fits, power


class Pattern:
    """Tokens must follow a cycle of allowed sets (a set of one is a forced token): a grammar whose
    state is the number of tokens consumed."""

    def __init__(self, sets: list[set[int]], vocab: int) -> None:
        self.masks = [np.isin(np.arange(vocab), sorted(s)) for s in sets]
        self.tokens: list[int] = []

    def allowed(self) -> np.ndarray:
        return self.masks[len(self.tokens) % len(self.masks)]

    def forced(self) -> list[int]:
        out, n = [], len(self.tokens)
        while len(out) < 8 and (mask := self.masks[(n + len(out)) % len(self.masks)]).sum() == 1:
            out.append(int(np.flatnonzero(mask)[0]))
        return out

    def advance(self, token: int) -> None:
        assert self.allowed()[token], (token, len(self.tokens))
        self.tokens.append(token)

    def rollback(self, n: int) -> None:
        del self.tokens[len(self.tokens) - n:]

    def obeyed_by(self, tokens: list[int]) -> bool:
        return all(self.masks[i % len(self.masks)][t] for i, t in enumerate(tokens))


BYTES = 260  # the tiny models' vocabulary
BIG_SETS = [set(range(97, 123)), set(range(48, 58)), {32}, {33}, set(range(97, 123)) | {10}]  # forced ' ' and '!'
PROMPT_TEXT = "def fib(n):\n    return"


def generate(target: Path, draft: Path | None, ngram: bool, gamma: int, **config: object) -> tuple:  # type: ignore[type-arg]
    gen = Generator.load(target, draft=draft, ngram=ngram,
                         config=SpecConfig(gamma=gamma, max_new_tokens=30, ignore_eos=True, **config))  # type: ignore[arg-type]
    pattern = Pattern(BIG_SETS, BYTES)
    result = gen.generate(PROMPT_TEXT, constraint=pattern)
    return result, pattern


@pytest.mark.parametrize("mode", ["draft-model", "ngram", "hybrid-auto"])
def test_greedy_constrained_speculation_equals_constrained_plain(tiny_llama: tuple[Path, Path, Path],
                                                                  mode: str) -> None:
    _, target, draft = tiny_llama
    plain, _ = generate(target, None, False, 0)
    spec, pattern = generate(target, None if mode == "ngram" else draft, mode != "draft-model", 4,
                             auto_gamma=mode == "hybrid-auto")
    assert spec.token_ids == plain.token_ids and pattern.obeyed_by(spec.token_ids)
    # 12 of the 30 positions admit one token (' ' and '!' after every digit): most ride as forced
    # tokens, verified and never drafted; the rest fall where the target's own token is the forced one
    assert spec.stats.forced >= 6
    if mode == "draft-model":
        assert spec.stats.accepted > 0


def test_plain_decoding_takes_forced_tokens_in_its_passes(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Without a drafter, a row-exact target still verifies the forced tokens in its steps."""
    _, target, _ = tiny_llama
    result, pattern = generate(target, None, False, 0)
    assert pattern.obeyed_by(result.token_ids) and result.stats.forced >= 10
    assert result.stats.target_calls < result.stats.n_tokens - 1


def test_masked_rows_leave_only_allowed_tokens() -> None:
    logits = np.arange(12, dtype=np.float32).reshape(2, 6)
    masks = [np.array([1, 0, 1, 0, 0, 0], bool), np.array([0, 0, 0, 0, 1, 1, 1, 1], bool)]  # a wider vocabulary
    out = mask_rows(logits, masks)
    assert out[0].tolist()[:3] == [0.0, -np.inf, 2.0] and np.isinf(out[1, :4]).all() and out[1, 4] == 10
    assert logits[0, 1] == 1.0  # a copy: the pass's own buffer is left alone


def test_a_guide_rolls_back_to_what_was_accepted() -> None:
    pattern = Pattern([{1, 2}, {3}, {4, 5}], 8)
    guide = Guide(pattern)
    assert guide.follow([1, 3, 6, 4]) == [1, 3]  # 6 is not allowed after 1 3
    assert len(guide.row_masks()) == 3
    guide.settle(1, 3)  # the first draft kept, then the target's own token
    assert pattern.tokens == [1, 3] and guide.steps == 0


# -- the constrained law, end to end over the small-vocabulary pair --------------------------------
SMALL_SETS = [{2, 3, 4, 5, 6, 7}, {8}, {2, 4, 9, 10, 11}]  # free, forced, free: the 2nd token always 8
DRAWS = 30_000  # power 0.96 against a 1% shift of this law (~40 s a rule)


def constrained_law(target: Path, params: SamplingParams) -> np.ndarray:
    """The exact law of the 3rd generated token under the pattern: p masked and renormalised at each step."""
    model = OnnxModel(target)
    masks = Pattern(SMALL_SETS, VOCAB).masks

    def law(tokens: list[int], step: int) -> np.ndarray:
        return probabilities(mask_rows(model.prefill(tokens, model.new_cache())[None], [masks[step]])[0], params)

    p3 = np.zeros(VOCAB)
    p1 = law(PROMPT, 0)
    for t1 in np.flatnonzero(p1):
        p3 += p1[t1] * law([*PROMPT, int(t1), 8], 2)
    return p3


@pytest.mark.slow
@pytest.mark.parametrize("acceptance", ["rejection", "broken rule"])
def test_sampled_constrained_output_has_the_constrained_law(small_vocab_pair: tuple[Path, Path, Path],  # noqa: F811
                                                           acceptance: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 3rd token (after a free token and a forced one) drawn with a draft model under the
    grammar, over many seeds, against the exact constrained law (chi-square, tests/stats_tools), by
    the rejection rule (the draft's masked q against the target's masked p). The race needs no law
    test of its own: a seeded run gives plain constrained sampling's very tokens
    (tests/runtime/constraints/test_grammar.py), and plain sampling draws from the masked law by construction.
    The negative control ("broken rule": corrections drawn from p, not max(0, p - q)) through the
    same harness and seeds must fail."""
    broken = acceptance == "broken rule"
    if broken:
        from specedge.kernels import acceptance as rules

        monkeypatch.setattr(rules, "residual", lambda p, q, drafted: (np.arange(len(p.dense())), p.dense()))
        acceptance = "rejection"
    target, draft, _ = small_vocab_pair
    params = SamplingParams(temperature=1.0)
    law = constrained_law(target, params)
    assert power(law, DRAWS) >= 0.9, "too few draws to see a 1% shift"
    # 4 tokens: the first drawn plainly, then one round - the forced 8 and a drafted 3rd token (and a
    # 4th), which the rule accepts or corrects: with 3 tokens the 3rd was the target's own draw, and
    # no rule at all was tested
    gen = Generator.load(target, draft=draft, threads=1,
                         config=SpecConfig(gamma=3, max_new_tokens=4, ignore_eos=True, sampling=params,
                                           acceptance=acceptance))
    seeds = np.random.SeedSequence(zlib.crc32(acceptance.encode())).generate_state(DRAWS)
    thirds = np.empty(DRAWS, dtype=np.int64)
    drafted = accepted = 0
    for i, seed in enumerate(seeds):
        pattern = Pattern(SMALL_SETS, VOCAB)
        result = gen.generate(PROMPT, constraint=pattern, seed=int(seed))  # seeded: the rule repeats
        tokens = result.token_ids
        assert tokens[1] == 8 and pattern.obeyed_by(tokens)
        thirds[i] = tokens[2]
        drafted += result.stats.proposed_by_position[0] if result.stats.proposed_by_position else 0
        accepted += result.stats.accepted_by_position[0] if result.stats.accepted_by_position else 0
    assert 0 < accepted < drafted == DRAWS  # every 3rd token was drafted, and the rule both took and corrected
    ok, chi_z, cell_z = fits(thirds, law)
    assert ok != broken, f"chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"


def test_the_constrained_law_is_a_law_on_the_allowed_tokens(small_vocab_pair: tuple[Path, Path, Path]) -> None:  # noqa: F811
    law = constrained_law(small_vocab_pair[0], SamplingParams(temperature=1.0))
    assert law.sum() == pytest.approx(1.0) and set(np.flatnonzero(law)) <= SMALL_SETS[2]
