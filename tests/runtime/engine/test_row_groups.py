"""A fused-attention target runs whole groups of rows, so every split of a sequence into passes
gives the same rows, bit for bit, and speculation over it is lossless."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.engine import row_groups
from specedge.runtime.engine.row_groups import probe_rows, rows_by_split
from specedge.runtime.engine.rows import SINGLE_STEPS, RowPolicy
from specedge.runtime.round.decoding import pad_guesses
from specedge.runtime.round.drafters import DraftModelDrafter
from tests.conftest import TINY_CONTEXT

IDS = [5, 17, 42, 8, 99, 3, 61, 27, 14, 77, 31, 2, 58, 90, 11, 46, 23, 70, 36, 9]


def fused_target(pair: tuple[Path, Path, Path]) -> OnnxModel:
    return OnnxModel(pair[2])  # the tiny pair's draft: fused attention, whole head


def test_any_split_into_passes_gives_the_same_rows(tiny_pair: tuple[Path, Path, Path]) -> None:
    model = fused_target(tiny_pair)
    rows = probe_rows(model)
    assert rows.exact and rows.group > 1
    prefix, tokens = IDS[:5], IDS[5:]
    reference = rows_by_split(model, prefix, tokens, [len(tokens)], rows)
    for split in ([1] * 15, [5, 5, 5], [2, 7, 1, 3, 2], [4, 11]):
        np.testing.assert_array_equal(rows_by_split(model, prefix, tokens, split, rows), reference)


def test_a_pass_at_the_end_of_the_context_pads_in_front(tiny_pair: tuple[Path, Path, Path]) -> None:
    """No room after the last slot: the pass repeats committed tokens before it instead, whose
    entries it rewrites with the same values, and returns the rows of its own tokens."""
    model = fused_target(tiny_pair)
    rows = RowPolicy(group=2)
    tokens = [IDS[i % len(IDS)] for i in range(TINY_CONTEXT)]
    cache = model.new_cache()
    model.prefill(tokens[:TINY_CONTEXT - 1], cache, rows)
    kept = [k[:, :, :TINY_CONTEXT - 1].copy() for k in cache.keys]
    last = model.forward(tokens[-1:], cache, rows=rows)  # position 63 of 64: a pad after it would not fit
    assert last.logits.shape[0] == 1
    row = last.logits[0].copy()  # the output buffer is reused by the next pass
    for before, after in zip(kept, cache.keys, strict=True):
        np.testing.assert_array_equal(after[:, :, :TINY_CONTEXT - 1], before)
    cache.truncate(TINY_CONTEXT - 2)
    pair = model.forward(tokens[-2:], cache, rows=rows)  # the same position as the second row of a pair
    np.testing.assert_array_equal(row, pair.logits[1])


@pytest.mark.parametrize("drafter", ["draft-model", "hybrid"])
def test_speculation_over_a_fused_target_equals_its_plain_decoding(tiny_pair: tuple[Path, Path, Path],
                                                                   drafter: str) -> None:
    _, exact, fused = tiny_pair
    plain = Generator.load(fused, config=SpecConfig(gamma=0, max_new_tokens=1000, ignore_eos=True))
    for gamma, auto in ((1, False), (2, False), (4, True)):
        spec = Generator.load(fused, draft=exact, ngram=drafter == "hybrid",
                              config=SpecConfig(gamma=gamma, auto_gamma=auto, max_new_tokens=1000, ignore_eos=True))
        for prompt in ("def fib(n):\n    return", "abcabcab"):  # to the end of the context
            result = spec.generate(prompt)
            assert result.token_ids == plain.generate(prompt).token_ids
            assert result.stats.stop_reason == "context"


def test_the_rows_that_pad_a_pass_carry_lookup_guesses_that_are_accepted(tiny_pair: tuple[Path, Path, Path]
                                                                          ) -> None:
    """Over a target that runs row pairs, a round of 2 drafts (3 rows) runs a fourth row anyway:
    it verifies the prompt lookup's guess there, greedy or sampled; the tokens are plain decoding's."""
    _, exact, fused = tiny_pair
    for sampling in (SamplingParams(), SamplingParams(temperature=0.8, top_p=0.95)):
        config = SpecConfig(gamma=2, max_new_tokens=40, ignore_eos=True, sampling=sampling, seed=5)
        plain = Generator.load(fused, config=SpecConfig(gamma=0, max_new_tokens=40, ignore_eos=True,
                                                        sampling=sampling, seed=5))
        spec = Generator.load(fused, draft=exact, config=config)
        assert spec.rows.group == 2
        prompt = "abababababababababab"  # the tiny models continue it in repeats the lookup finds
        result = spec.generate(prompt)
        assert result.token_ids == plain.generate(prompt).token_ids
        stats = result.stats
        assert 0 < stats.guessed <= stats.target_calls  # a round: 2 drafts, and a guess where the lookup has one
        assert stats.guessed_accepted > 0 or not sampling.greedy  # the tiny models' samples rarely repeat
        assert stats.produced == stats.accepted + stats.guessed_accepted + stats.target_calls


def test_pad_guesses_fill_only_the_rows_that_pad_the_group_within_room() -> None:
    context = [1, 2, 3, 4, 1, 2, 3]
    assert pad_guesses(context, [], group=2, room=5) == [4]  # 1 row + 1 guess
    assert pad_guesses(context, [4], group=2, room=5) == []  # 2 rows: a whole group
    assert pad_guesses(context, [], group=4, room=5) == [4, 1, 2]
    assert pad_guesses(context, [4, 1], group=4, room=5) == [2]  # the lookup continues the drafts
    assert pad_guesses(context, [], group=4, room=2) == [4, 1]  # capped by max_new_tokens and the context
    assert pad_guesses(context, [], group=4, room=0) == []
    assert pad_guesses([7, 8, 9], [], group=2, room=5) == []  # nothing to look up


def test_rows_that_never_agree_refuse_speculation(tiny_pair: tuple[Path, Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    probes = []
    monkeypatch.setattr(row_groups, "rows_agree", lambda model, rows: probes.append(rows.group) or False)
    _, exact, fused = tiny_pair
    with pytest.raises(SpecEdgeError, match="--attention exact"):
        Generator.load(fused, draft=exact)
    assert probes == [1, 2, 4]  # row groups of 1, 2 and 4 tried on this CPU
    gen = Generator.load(fused)  # plain decoding is fine, in 1-token passes
    assert gen.rows == RowPolicy(group=1, exact=False) and gen.generate("abc", max_new_tokens=3).token_ids
    Generator(gen.target, rows=gen.rows)  # the same model again, its verdict passed in: no probe
    assert probes == [1, 2, 4, 1, 2, 4]


def test_single_steps_are_plain_decoding_without_a_probe(tiny_pair: tuple[Path, Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    probes = []
    monkeypatch.setattr(row_groups, "rows_agree", lambda model, rows: probes.append(rows.group) or True)
    _, exact, fused = tiny_pair
    assert Generator.load(fused, single_steps=True).rows == SINGLE_STEPS and probes == []
    with pytest.raises(SpecEdgeError, match="single_steps is for plain decoding only"):
        Generator.load(fused, draft=exact, single_steps=True)
    with pytest.raises(SpecEdgeError, match="plain decoding only: a drafter needs a row policy whose rows are exact"):
        Generator(OnnxModel(fused), DraftModelDrafter(OnnxModel(exact)), rows=SINGLE_STEPS)
    assert probes == []


def test_single_steps_and_row_pairs_share_one_session(tiny_pair: tuple[Path, Path, Path]) -> None:
    """The row policy is a value of each Generator, not state of the model: 1-token steps and
    decoding in row pairs run on the same model, in either order, each as it would alone."""
    model = OnnxModel(tiny_pair[2])
    config = SpecConfig(gamma=0, max_new_tokens=40, ignore_eos=True)
    paired = Generator(model, None, config)
    single = Generator(model, None, config, rows=SINGLE_STEPS)
    assert paired.rows.group > 1
    fresh = OnnxModel(tiny_pair[2])
    alone_single = Generator(fresh, None, config, rows=SINGLE_STEPS)
    alone_paired = Generator(fresh, None, config, rows=paired.rows)
    for prompt in ("def fib(n):", "abcabcab"):
        assert single.generate(prompt).token_ids == alone_single.generate(prompt).token_ids
        assert paired.generate(prompt).token_ids == alone_paired.generate(prompt).token_ids


def test_a_wide_block_int4_target_with_exact_attention_verifies_in_pairs(tiny_pair: tuple[Path, Path, Path],
                                                                          tmp_path: Path) -> None:
    """MatMulNBits above block 32 is not row-exact as built: with exact attention too, such a target
    runs row pairs."""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    src, exact, _ = tiny_pair
    target = export_model(src, tmp_path / "int4-b64", ExportSettings(
        quant="int4", block_size=64, context=TINY_CONTEXT, widths=(1, 2, 3, 5, 8))).path
    model = OnnxModel(target)
    assert model.manifest.attention == "exact" and not model.manifest.rows_exact
    plain = Generator(model, None, SpecConfig(gamma=0, max_new_tokens=1000, ignore_eos=True))
    assert plain.rows == RowPolicy(group=2)
    spec = Generator(model, DraftModelDrafter(OnnxModel(exact)),
                     SpecConfig(gamma=4, auto_gamma=True, max_new_tokens=1000, ignore_eos=True), rows=plain.rows)
    for prompt in ("def fib(n):\n    return", "abcabcab"):  # to the end of the context: front padding too
        assert spec.generate(prompt).token_ids == plain.generate(prompt).token_ids


def test_plain_decoding_over_row_pairs_is_one_token_a_pass(tiny_llama: tuple[Path, Path, Path]) -> None:
    """Plain decoding, the baseline speculation is measured against, runs one token a pass over a
    target of row pairs too: its pad rows carry copies, not lookup guesses, even on a text the
    lookup would guess right."""
    gen = Generator.load(tiny_llama[2], config=SpecConfig(gamma=0, max_new_tokens=30, ignore_eos=True))
    assert gen.rows.group == 2
    stats = gen.generate("abcabcabcabcabc").stats
    assert stats.guessed == 0 and stats.target_calls == stats.n_tokens - 1 == 29
