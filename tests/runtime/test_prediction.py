"""Predicted outputs: the caller's prediction drafts where the output follows it, losslessly."""

from __future__ import annotations

import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime import generator as generator_module
from specedge.runtime.round import decoding
from specedge.runtime.round.drafters import Ask, PredictionDrafter

PROMPT = "def fib(n):\n    return"


def generator(target: Path, draft: Path | None = None, **config: object) -> Generator:
    return Generator.load(target, draft=draft, config=SpecConfig(max_new_tokens=30, ignore_eos=True,
                                                                **config))  # type: ignore[arg-type]


def costs_like_a_real_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """γ auto weighs a prediction against plain steps and the draft model by their measured times;
    a tiny model's passes take well under a millisecond, so a busy machine's noise decided between
    them. The loop's clock gains what a pass of S tokens costs a real model, 20 ms · (1 + 0.1 (S - 1)),
    at each pass of any model (the draft model's steps included), so its choices follow acceptance.
    γ auto reads the Generator's clock (taken from runtime/generator.py's `time` when it is made),
    the stats decoding's own: both gain it."""
    spent = [0.0]
    clock = SimpleNamespace(perf_counter=lambda: time.perf_counter() + spent[0])
    monkeypatch.setattr(decoding, "time", clock)
    monkeypatch.setattr(generator_module, "time", clock)
    forward = OnnxModel.forward

    def costly(self: OnnxModel, tokens, *args, **kwargs):  # type: ignore[no-untyped-def]
        spent[0] += 0.02 * (1 + 0.1 * (len(tokens) - 1))
        return forward(self, tokens, *args, **kwargs)

    monkeypatch.setattr(OnnxModel, "forward", costly)


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(temperature=0.8)])
@pytest.mark.parametrize("with_draft", [False, True])
def test_a_prediction_drafts_losslessly(tiny_llama: tuple[Path, Path, Path], sampling: SamplingParams,
                                        with_draft: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    costs_like_a_real_model(monkeypatch)
    _, target, draft = tiny_llama
    plain = generator(target, gamma=0, sampling=sampling, seed=5).generate(PROMPT)
    gen = generator(target, draft if with_draft else None, gamma=4 if with_draft else 0, sampling=sampling, seed=5)
    exact = gen.generate(PROMPT, prediction=plain.token_ids)
    assert exact.token_ids == plain.token_ids
    by = exact.stats.accepted_by_source
    assert by["prediction"] >= 15 and exact.stats.target_calls <= 12  # a right prediction: long runs per pass
    edited = list(plain.token_ids)  # a prediction that is partly wrong: two tokens changed inside runs
    for i in (3, 20):
        edited[i] = (edited[i] + 1) % 256
    partly = gen.generate(PROMPT, prediction=edited)
    assert partly.token_ids == plain.token_ids
    assert 0 < partly.stats.accepted_by_source["prediction"] < partly.stats.drafted_by_source["prediction"]


def test_a_prediction_as_text_is_encoded_as_plain_text(tiny_llama: tuple[Path, Path, Path]) -> None:
    _, target, _ = tiny_llama
    gen = generator(target, gamma=0)
    assert gen.encode_prediction("fib(n) <|eos|>") == gen.codec.encode("fib(n) <|eos|>", add_special_tokens=False)
    plain = gen.generate(PROMPT)
    assert gen.generate(PROMPT, prediction="fib(n):\n    return fib").token_ids == plain.token_ids


def test_the_prediction_is_followed_from_where_the_last_round_left_off() -> None:
    drafter = PredictionDrafter([1, 2, 3, 9, 1, 2, 4, 9, 1, 2, 5], min_match=1)
    assert drafter.propose([7, 1, 2], Ask(2, SamplingParams(), None)).tokens == [3, 9]  # type: ignore[arg-type]
    assert drafter.propose([7, 1, 2, 3, 9, 1, 2], Ask(2, SamplingParams(), None)).tokens == [4, 9]  # type: ignore[arg-type]
    assert drafter.sources([6]) == () and drafter.propose([6], Ask(3, SamplingParams(), None)).tokens == []  # type: ignore[arg-type]


def test_a_match_shorter_than_min_match_is_no_place() -> None:
    drafter = PredictionDrafter([5, 6, 7, 8, 9], min_match=3)
    assert drafter.sources([1, 6, 7]) == () and drafter.sources([5, 6, 7]) == ("prediction",)


def test_a_prediction_shorter_than_the_lookups_suffix_decodes_as_without_it(tiny_llama: tuple[Path, Path, Path]
                                                                             ) -> None:
    """A prediction of a few tokens (fewer than the 8 the context's suffix is matched by) is looked
    up like any other: the tokens are plain decoding's, with a prediction of 1 to 4 tokens."""
    _, target, _ = tiny_llama
    plain = generator(target, gamma=0).generate(PROMPT)
    gen = generator(target, gamma=4)
    for n in (1, 2, 4):
        assert gen.generate(PROMPT, prediction=plain.token_ids[:n]).token_ids == plain.token_ids
