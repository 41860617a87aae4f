"""Stop strings and seeds end and reproduce a speculative run exactly where plain decoding would.

Stop strings: the run stops at the token that completes the first stop string to complete (of
two completing at one character, the longer), token_ids end with that token and the text ends
where that stop string begins, for plain and speculative decoding alike. Seeds: a sampled run
with a seed gives the tokens plain sampling gives with that seed, whatever γ each round takes.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from specedge.kernels.sampling import SamplingParams
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime import generator as generator_module
from specedge.runtime.generator import GenerationResult
from specedge.runtime.round.decoding import decode_tokens
from specedge.runtime.round.drafters import build_drafter
from specedge.runtime.round.gamma import GammaController

POEM = "Write a short poem about the sea."  # SmolLM2 repeats its lines: long lookup rounds
SAMPLED = SamplingParams(temperature=0.8, top_p=0.95)


@pytest.fixture(scope="module")
def smol(smollm2: dict[str, Path]) -> dict[str, Generator]:
    """Plain decoding of the fp32 export; with its int4 export as draft; with n-gram lookup; both.
    One session per model serves them all (each Generator has its own cache)."""
    config = SpecConfig(gamma=0, max_new_tokens=28, ignore_eos=True)
    target, draft = OnnxModel(smollm2["fp32"]), OnnxModel(smollm2["int4"])
    plain = Generator(target, None, config)
    spec = dataclasses.replace(config, gamma=4)
    drafters = {"draft-model": build_drafter(draft, ngram=False),
                "ngram": build_drafter(None, ngram=True),
                "hybrid": build_drafter(draft, ngram=True)}
    return {"plain": plain, **{name: Generator(target, drafter, spec, rows=plain.rows)
                               for name, drafter in drafters.items()}}


def token_ends(gen: Generator, tokens: list[int]) -> list[int]:
    """Where each token's text ends in the decoded text."""
    return [len(gen.codec.decode(tokens[:i + 1])) for i in range(len(tokens))]


def expected_stop(gen: Generator, full: GenerationResult, stops: tuple[str, ...]) -> tuple[str, list[int]]:
    """(text, token_ids) of a run that stops at the stop string completing first in the output of
    a run without stop strings: the text up to its start, the tokens up to the one completing it."""
    found = [(i + len(s), i) for s in stops if (i := full.text.find(s)) >= 0]
    assert found, stops
    end, start = min(found)
    ends = token_ends(gen, full.token_ids)
    last = next(j for j, e in enumerate(ends) if e >= end)
    return full.text[:start], full.token_ids[:last + 1]


def stop_sets(gen: Generator, full: GenerationResult, rounds: list[list[int]]) -> list[tuple[str, ...]]:
    """Stop strings that complete inside a speculative round of `full` with tokens after them: one
    (the two tokens before the round and its first two); a longer one around it that completes a
    token later but starts earlier; three, one never seen."""
    text, ends = full.text, token_ends(gen, full.token_ids)
    starts = [sum(len(new) for new in rounds[:r]) for r in range(len(rounds))]

    def first_seen(a: int, b: int) -> bool:  # the text of tokens a..b-1 is not seen before token a
        return a >= 0 and text.find(text[ends[a - 1] if a else 0:ends[b - 1]]) == (ends[a - 1] if a else 0)

    found = [r for r, new in zip(starts, rounds, strict=True) if len(new) >= 3 and r >= 4
             and first_seen(r - 2, r + 2) and first_seen(r - 3, r + 3)]
    assert found, f"no round of 3 tokens or more in {[len(new) for new in rounds]}"
    r = found[0]
    short, long = text[ends[r - 3]:ends[r + 1]], text[ends[r - 4]:ends[r + 2]]
    later = text[ends[-4]:ends[-2]]
    return [(short,), (long, short), ("never seen here", later, short)]


def stops_and_rounds(smol: dict[str, Generator], drafter: str, monkeypatch: pytest.MonkeyPatch,
                     **run: object) -> tuple[GenerationResult, list[tuple[str, ...]]]:
    """A plain run without stop strings, and stop strings that end a speculative one mid-round."""
    full = smol["plain"].generate(POEM, chat=True, **run)
    rounds = record_rounds(monkeypatch)
    assert smol[drafter].generate(POEM, chat=True, **run).token_ids == full.token_ids
    monkeypatch.undo()
    return full, stop_sets(smol["plain"], full, rounds)


@pytest.mark.parametrize(("drafter", "sampling"), [("draft-model", "greedy"), ("ngram", "greedy"),
                                                    pytest.param("draft-model", "sampled", marks=pytest.mark.slow)])
def test_stop_strings_end_speculation_where_plain_decoding_ends(smol: dict[str, Generator], drafter: str,
                                                                sampling: str, monkeypatch: pytest.MonkeyPatch) -> None:
    run = {"sampling": SAMPLED if sampling == "sampled" else SamplingParams(), "seed": 11}
    full, sets = stops_and_rounds(smol, drafter, monkeypatch, **run)
    for stops in sets:
        text, token_ids = expected_stop(smol["plain"], full, stops)
        plain = smol["plain"].generate(POEM, chat=True, stop_strings=stops, **run)
        assert (plain.text, plain.token_ids, plain.stats.stop_reason) == (text, token_ids, "stop_string"), stops
        for gamma in (2, 4):
            spec = smol[drafter].generate(POEM, chat=True, stop_strings=stops, gamma=gamma, **run)
            assert (spec.text, spec.token_ids) == (text, token_ids), (stops, gamma)
            assert spec.stats.stop_reason == "stop_string"


def test_a_stream_never_shows_text_past_a_stop_string(smol: dict[str, Generator],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    full, sets = stops_and_rounds(smol, "ngram", monkeypatch)
    stream = smol["ngram"].stream(POEM, chat=True, stop_strings=sets[1])
    assert "".join(stream) == expected_stop(smol["plain"], full, sets[1])[0]


def force_gamma_sequence(monkeypatch: pytest.MonkeyPatch, seed: int) -> list[int]:
    """Make γ auto pick γ at random each round (plain steps included), as wall-clock timings may;
    returns the γ picked, round by round."""
    picks: list[int] = []
    rng = random.Random(seed)

    def plan(self: GammaController, sources: tuple[str, ...]) -> tuple[str | None, int]:
        gamma = rng.choice([0, *self.choices]) if sources else 0
        picks.append(gamma)
        return (rng.choice(sources), gamma) if gamma else (None, 0)

    monkeypatch.setattr(GammaController, "plan", plan)
    return picks


@pytest.mark.slow  # by default, tests/runtime/test_lossless_sampling.py checks seeds at γ 1 and 3 on the tiny pair
def test_a_seed_gives_the_same_tokens_at_any_fixed_gamma(smol: dict[str, Generator]) -> None:
    """Same seed: plain sampling, and speculation with either drafter at γ 2 and 4, give the same
    tokens; another seed gives other tokens."""
    run = {"sampling": SAMPLED, "seed": 5}
    expected = smol["plain"].generate(POEM, chat=True, **run).token_ids
    for drafter in ("draft-model", "ngram"):
        for gamma in (2, 4):
            result = smol[drafter].generate(POEM, chat=True, gamma=gamma, **run)
            assert result.token_ids == expected, (drafter, gamma)
            assert result.stats.accepted > 0 or (drafter == "ngram" and result.stats.drafted > 0)
    assert smol["plain"].generate(POEM, chat=True, **{**run, "seed": 6}).token_ids != expected


def test_a_seed_gives_the_same_tokens_whatever_gamma_auto_picks(smol: dict[str, Generator],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """γ auto picking two different random sequences of sources and γ (plain steps included), as
    wall-clock timings may, gives plain sampling's tokens for the seed both times."""
    run = {"sampling": SAMPLED, "seed": 5}
    expected = smol["plain"].generate(POEM, chat=True, **run).token_ids
    sequences = []
    for order in (1, 2):
        picks = force_gamma_sequence(monkeypatch, order)
        assert smol["hybrid"].generate(POEM, chat=True, auto_gamma=True, **run).token_ids == expected, picks
        sequences.append(picks)
    assert sequences[0] != sequences[1] and len(set(sequences[0])) > 2


def record_rounds(monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The tokens of each round the generators decode from now on."""
    rounds: list[list[int]] = []

    def recorded(*args: object, **kwargs: object) -> Iterator[list[int]]:
        for new in decode_tokens(*args, **kwargs):  # type: ignore[arg-type]
            rounds.append(list(new))
            yield new

    monkeypatch.setattr(generator_module, "decode_tokens", recorded)
    return rounds


def inside_a_round(rounds: list[list[int]]) -> int:
    """The index of a generated token, seen there first, that a round produced with more after it."""
    tokens = [t for new in rounds for t in new]
    starts = [sum(len(new) for new in rounds[:r]) for r in range(len(rounds))]
    return next(s + i for s, new in zip(starts, rounds, strict=True) for i in range(len(new) - 1)
                if s + i >= 2 and tokens.index(new[i]) == s + i)


@pytest.mark.parametrize("sampling", [SamplingParams(), SAMPLED], ids=["greedy", "sampled"])
def test_eos_inside_a_round_ends_the_run(tiny_llama: tuple[Path, Path, Path], sampling: SamplingParams,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A token the target accepts mid-round as EOS ends the run there, as in plain decoding: the
    tokens after it are dropped, and it is not returned. (The tiny target takes few of its n-gram
    lookups; the end of a run does not depend on the drafter.)"""
    _, target, draft = tiny_llama
    config = SpecConfig(gamma=4, max_new_tokens=40, sampling=sampling, seed=3, ignore_eos=True)
    gen = Generator.load(target, draft=draft, config=config)
    plain = Generator.load(target, config=dataclasses.replace(config, gamma=0))
    rounds = record_rounds(monkeypatch)
    tokens = gen.generate("hello hello hello").token_ids
    j = inside_a_round(rounds)
    for g in (gen, plain):  # pretend the token at j is the end of sequence
        g.target.manifest = dataclasses.replace(g.target.manifest, eos_token_ids=(tokens[j],))
    expected = plain.generate("hello hello hello", ignore_eos=False)
    assert (expected.token_ids, expected.stats.stop_reason) == (tokens[:j], "eos")
    result = gen.generate("hello hello hello", ignore_eos=False)
    assert (result.token_ids, result.stats.stop_reason) == (tokens[:j], "eos")
