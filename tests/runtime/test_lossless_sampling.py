"""Speculative sampling has exactly the target's distribution, and with a seed it gives the very
tokens plain sampling gives with that seed.

The law, for every sampling transform and drafter: the acceptance functions (and the real n-gram
and hybrid drafters) over fixed target and draft distributions - tables of logits for every
prefix - decode a prompt as the loop does, 30,000 runs a mode on noise drawn in one call; the
marginal laws of the 2nd, 3rd and 4th generated tokens are checked against the exact ones
computed from the tables with tests/stats_tools.fits. Each run decodes 4 tokens: the first, then a
round of 2 drafts (the 2nd and 3rd tokens: accepted drafts or a correction) and the token after.

The loop: two end-to-end runs through the real Generator over the tiny small-vocabulary pair
(20,000 draws each, ~1 min each: with `-m slow`), with a draft model and with the draft whose head
scores 8 of the 12 ids, against the exact law computed from the target's own logits. They sample at
temperature 1, whose law this pair's 20,000 draws see a 1% shift of (top-k's and top-p's laws are
more peaked: power 0.75-0.89 at 20,000 draws). By default the
seeded identity with plain sampling below covers every drafter's path through the loop.

Power: each check is made at a number of draws where `fits` catches 1% of the mass moved from the
likeliest token to a middling one (total variation 0.01) with the power `tests/stats_tools.power`
gives for that law. The law tests assert >= 0.95 at their 30,000 runs; the loop runs keep the
20,000 draws every mode had before, power 0.92 at the 2nd token and 0.90 at the 3rd (asserted
>= 0.85).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.kernels.acceptance import accept_sampled
from specedge.kernels.laws import Law
from specedge.kernels.sampling import Draws, SamplingParams, probabilities
from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.round.drafters import Ask, Draft, Drafter, HybridDrafter, NgramDrafter, adapt
from tests.stats_tools import PresetDraws, exponential_noise, fits, power
from tests.tiny_models import byte_tokenizer, make_tiny_model

VOCAB = 12
DRAWS = 20_000
TOKENS = 4  # the first, a round of 2 drafts, the token after them
PROMPT = [3, 5, 7, 3, 5, 7, 3, 5]  # repeats, so the n-gram drafter proposes too
CASES = {
    "temperature": SamplingParams(temperature=1.0),
    "top-k": SamplingParams(temperature=0.8, top_k=5),
    "top-p": SamplingParams(temperature=1.3, top_p=0.8),
    "min-p": SamplingParams(temperature=1.3, min_p=0.3),
}


@pytest.fixture(scope="module")
def small_vocab_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """target, draft, and the draft with a head truncated to the first 8 of the 12 ids"""
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("small-vocab")
    src = make_tiny_model(root / "src", "llama", seed=5, vocab_size=VOCAB, bos_token_id=0, eos_token_id=1)
    small_vocab_specials(src)
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.5, seed=6)
    small_vocab_specials(draft_src)
    settings = ExportSettings(quant="fp32", context=32, widths=(1, 2, 3, 4))
    truncated = export_model(draft_src, root / "d8", dataclasses.replace(settings, head_vocab=8)).path
    return export_model(src, root / "t", settings).path, export_model(draft_src, root / "d", settings).path, truncated


def small_vocab_specials(src: Path) -> None:
    """A tokenizer of the 12 ids the model scores, BOS and EOS among them (ids 0 and 1): a tokenizer
    with more ids than the model is refused at load."""
    path = src / "tokenizer_config.json"
    tok = byte_tokenizer(VOCAB)
    tok.save(str(src / "tokenizer.json"))
    config = json.loads(path.read_text())
    path.write_text(json.dumps({**config, "bos_token": tok.id_to_token(0), "eos_token": tok.id_to_token(1)}))


def next_law(model: OnnxModel, tokens: list[int], params: SamplingParams) -> np.ndarray:
    cache = model.new_cache()
    return probabilities(model.prefill(tokens, cache), params)


def exact_laws(target: Path, params: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """Exact marginal laws of the 2nd and 3rd generated tokens, [V] each."""
    model = OnnxModel(target)
    p1 = next_law(model, PROMPT, params)
    p2 = np.zeros(VOCAB)
    p3 = np.zeros(VOCAB)
    for t1 in np.flatnonzero(p1):
        law2 = next_law(model, [*PROMPT, int(t1)], params)
        p2 += p1[t1] * law2
        for t2 in np.flatnonzero(law2 > 1e-6):
            p3 += p1[t1] * law2[t2] * next_law(model, [*PROMPT, int(t1), int(t2)], params)
    return p2, p3 / p3.sum()


def draw(gen: Generator, seed: int) -> np.ndarray:
    """DRAWS samples of the first TOKENS generated tokens: [DRAWS, TOKENS]."""
    gen.config = SpecConfig(gamma=gen.config.gamma, max_new_tokens=TOKENS, sampling=gen.config.sampling,
                            seed=seed, ignore_eos=True, acceptance=gen.config.acceptance)
    out = np.empty((DRAWS, TOKENS), dtype=np.int64)
    seeds = np.random.SeedSequence(seed).generate_state(DRAWS)
    for i, s in enumerate(seeds):
        out[i] = gen.generate(PROMPT, seed=int(s)).token_ids
    return out


MODES = [*itertools.product(CASES, ["plain", "draft-model", "ngram"]), ("top-p", "hybrid"),
         ("temperature", "truncated-draft")]


def load(pair: tuple[Path, Path, Path], mode: str, config: SpecConfig) -> Generator:
    """A generator for a mode: plain, draft-model, ngram, hybrid, truncated-draft (a draft that
    proposes only ids 0..7: the target's mass on 8..11 comes from corrections) or auto (hybrid at γ auto)."""
    target, draft, truncated = pair
    drafts = {"draft-model": draft, "hybrid": draft, "truncated-draft": truncated, "auto": draft}
    return Generator.load(target, draft=drafts.get(mode), ngram=mode in ("ngram", "hybrid", "auto"), threads=1,
                          config=dataclasses.replace(config, gamma=0 if mode == "plain" else config.gamma,
                                                     auto_gamma=mode == "auto"))


# -- the law: the acceptance functions over fixed distributions ---------------------------------
LAW_RUNS = 30_000
LAW_GAMMA = 2  # the first round's drafts: TOKENS leaves room for 2
HEAD = 8  # the truncated draft scores ids 0..7


@dataclass(frozen=True)
class Tables:
    """Logits for every prefix of up to TOKENS - 1 generated tokens after PROMPT: `target[n]` is
    [V]*n + [V], the logits of generated token n given the n before it; `draft` the target's plus noise."""

    target: list[np.ndarray]
    draft: list[np.ndarray]


def make_tables(seed: int = 7) -> Tables:
    rng = np.random.default_rng(seed)
    target = [rng.normal(0.0, 1.5, (VOCAB,) * (n + 1)) for n in range(TOKENS)]
    return Tables(target, [t + rng.normal(0.0, 0.7, t.shape) for t in target])


def laws(logits: list[np.ndarray], params: SamplingParams, head: int = VOCAB) -> list[np.ndarray]:
    """`probabilities` of every table row; with head < VOCAB only the first `head` ids are scored."""
    return [probabilities(t[..., :head], params) for t in logits]


@dataclass
class TableDrafter:
    """A draft model read from tables: each token drawn from its q with the noise of its position,
    as DraftModelDrafter draws it."""

    q: list[np.ndarray]
    name: str = "draft-model"

    def begin(self, context: list[int]) -> None:
        pass

    def keep(self, committed: int) -> None:
        pass

    def sources(self, context: list[int]) -> tuple[str, ...]:
        return ("model",)

    def propose(self, context: list[int], k: int, params: SamplingParams, draws: Draws,
                source: str | None = None, guide: object = None) -> Draft:
        tokens: list[int] = []
        for j in range(k):
            generated = (*context[len(PROMPT):], *tokens)
            tokens.append(draws.sample(self.q[len(generated)][generated], len(context) + j))
        return Draft(tokens=tokens)


class KeptLookups(NgramDrafter):
    """The n-gram lookup, its matches kept per context: a run meets the same few hundred contexts
    again and again, and a match is a function of the context alone."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: dict[tuple[tuple[int, ...], int], tuple[list[int], int]] = {}

    def match(self, context: Sequence[int], k: int) -> tuple[list[int], int]:
        key = (tuple(context), k)
        if key not in self.kept:
            self.kept[key] = super().match(context, k)
        tokens, n = self.kept[key]
        return list(tokens), n


def law_drafter(mode: str, q: list[np.ndarray], q_head: list[np.ndarray]) -> Drafter | None:
    model = TableDrafter(q_head if mode == "truncated-draft" else q)
    return {"plain": None, "ngram": KeptLookups(), "hybrid": HybridDrafter(KeptLookups(), model)}.get(
        mode, model)


def decode_tables(p: list[np.ndarray], drafter: Drafter | None, params: SamplingParams,
                  draws: Draws, rule=accept_sampled) -> tuple[list[int], int, int]:  # type: ignore[no-untyped-def]
    """(the TOKENS generated tokens, drafts proposed, drafts accepted): the loop's rounds
    (runtime/round/decoding.py) with the target's laws read from tables: the first token drawn, then
    rounds of up to LAW_GAMMA drafts checked by accept_sampled against the target's law after each
    draft prefix."""
    context = [*PROMPT, draws.sample(p[0][()], len(PROMPT))]
    if drafter is not None:
        drafter.begin(context)
    drafted = accepted = 0
    while len(context) - len(PROMPT) < TOKENS:
        k = min(LAW_GAMMA, TOKENS - (len(context) - len(PROMPT)) - 1)
        drafts = adapt(drafter).propose(context, Ask(k, params, draws)).tokens[:k] if drafter is not None and k else []
        generated = context[len(PROMPT):]
        rows = np.stack([p[len(generated) + i][(*generated, *drafts[:i])] for i in range(len(drafts) + 1)])
        result = rule(np.array(drafts, dtype=np.int64), rows, draws, len(context))
        context += [*drafts[:result.n_accepted], result.next_token]
        drafted += len(drafts)
        accepted += result.n_accepted
    return context[len(PROMPT):], drafted, accepted


def exact_table_laws(p: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Exact marginal laws of the 2nd, 3rd and 4th generated tokens under the target's tables."""
    return p[0] @ p[1], np.einsum("a,ab,abc->c", p[0], p[1], p[2]), np.einsum("a,ab,abc,abcd->d", *p)


@pytest.mark.slow
@pytest.mark.parametrize(("case", "mode"), MODES)
def test_the_acceptance_law_is_the_targets(case: str, mode: str) -> None:
    """Every transform and drafter over fixed distributions: the 2nd, 3rd and 4th tokens (the 4th a
    bonus token after 2 accepted drafts, or drawn in a later round) follow the target's exact
    marginal law; drafts were both accepted and rejected (~2 s a mode)."""
    params, tables = CASES[case], make_tables()
    p, q, q_head = laws(tables.target, params), laws(tables.draft, params), laws(tables.draft, params, HEAD)
    seed = zlib.crc32(f"law/{case}/{mode}".encode())
    drafter = law_drafter(mode, q, q_head)
    samples, counts = np.empty((LAW_RUNS, TOKENS), dtype=np.int64), np.zeros(2, dtype=np.int64)
    for i, noise in enumerate(exponential_noise(LAW_RUNS, TOKENS, VOCAB, seed)):
        samples[i], *round_counts = decode_tables(p, drafter, params, PresetDraws(noise, start=len(PROMPT)))
        counts += round_counts
    drafted, accepted = counts
    if mode != "plain":
        assert 0 < accepted < drafted, (accepted, drafted)
    for position, law in zip((1, 2, 3), exact_table_laws(p), strict=True):
        assert power(law, LAW_RUNS) >= 0.95, f"token {position + 1}: too few runs to see a 1% shift"
        ok, chi_z, cell_z = fits(samples[:, position], law)
        assert ok, f"token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"


def race_taking_the_first_draft(drafts: np.ndarray, p: np.ndarray, draws: Draws, start: int):  # type: ignore[no-untyped-def]
    """A broken race: the first draft accepted whatever the target draws there."""
    if len(drafts) == 0:
        return accept_sampled(drafts, p, draws, start)
    rest = accept_sampled(drafts[1:], p[1:], draws, start + 1)
    return type(rest)(n_accepted=rest.n_accepted + 1, next_token=rest.next_token)


@pytest.mark.slow
def test_a_broken_race_fails_the_law_test() -> None:
    """The negative control of the law test above: the same harness, seeds and check, with a race
    that always takes its first draft, must fail."""
    params, tables = CASES["temperature"], make_tables()
    p, q = laws(tables.target, params), laws(tables.draft, params)
    drafter = law_drafter("draft-model", q, laws(tables.draft, params, HEAD))
    samples = np.empty((LAW_RUNS, TOKENS), dtype=np.int64)
    for i, noise in enumerate(exponential_noise(LAW_RUNS, TOKENS, VOCAB, zlib.crc32(b"law/temperature/draft-model"))):
        samples[i], *_ = decode_tables(p, drafter, params, PresetDraws(noise, start=len(PROMPT)),
                                       rule=race_taking_the_first_draft)
    assert not all(fits(samples[:, position], law)[0]
                   for position, law in zip((1, 2, 3), exact_table_laws(p), strict=True))


# -- the loop: end-to-end runs through the Generator -------------------------------------------
LOOP_MODES = [("temperature", "draft-model"), ("temperature", "truncated-draft")]


# 20,000 draws per mode, ~1 min each: with `-m slow`. By default the seeded identity with plain
# sampling below covers the sampling path through the loop, and the law is tested above.
@pytest.mark.slow
@pytest.mark.parametrize(("case", "mode"), LOOP_MODES)
def test_sampled_tokens_follow_target_law(small_vocab_pair: tuple[Path, Path, Path], case: str, mode: str) -> None:
    params = CASES[case]
    gen = load(small_vocab_pair, mode, SpecConfig(gamma=3, sampling=params))
    samples = draw(gen, seed=zlib.crc32(f"{case}/{mode}".encode()))  # the same seeds in every run
    if mode in ("draft-model", "truncated-draft"):
        assert len(gen.generate(PROMPT).stats.proposed_by_position) == TOKENS - 2  # a round of 2 drafts
    p2, p3 = exact_laws(small_vocab_pair[0], params)
    for position, law in ((1, p2), (2, p3)):
        assert power(law, DRAWS) >= 0.85, f"token {position + 1}: too few draws to see a 1% shift"
        ok, chi_z, cell_z = fits(samples[:, position], law)
        assert ok, f"token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"


def correction_from_p(p: Law, q: Law | None, drafted: int) -> tuple[np.ndarray, np.ndarray]:
    """A broken rejection rule's residual: the correction drawn from p itself, not max(0, p - q)."""
    dense = p.dense()
    return np.arange(len(dense)), dense


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["draft-model", "hybrid", "truncated-draft", "draft cut short", "broken rule"])
def test_the_rejection_rule_through_the_loop_follows_the_target_law(small_vocab_pair: tuple[Path, Path, Path],
                                                                   mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The min(1, p/q) rule (kernels/acceptance.accept_rejection) through the real Generator: the draft
    model's q as sampled (a truncated head's q over 8 of the 12 ids), hybrid rounds' one-hot lookups;
    20,000 draws at temperature 1, the power as above. The negative control ("broken rule": the draft
    model with corrections drawn from p) through the same harness must fail it. "draft cut short": the
    draft model stops a round where its confidence in the drafts so far falls to 0.25 (runtime/round/gamma.py's
    per-draft rule, with a fixed threshold): a round's length then depends on what the draft drew."""
    cut_short = mode == "draft cut short"
    cuts: list[int] = []  # drafts a round made, where they were cut short
    if cut_short:
        from specedge.runtime.round.drafters import DraftModelDrafter

        propose = DraftModelDrafter.propose

        def propose_cut(self: DraftModelDrafter, context: Sequence[int], ask: Ask) -> Draft:
            draft = propose(self, context, dataclasses.replace(ask, go_on=lambda drafted, sure: sure > 0.25))
            cuts.append(len(draft.tokens))
            return draft

        monkeypatch.setattr(DraftModelDrafter, "propose", propose_cut)
        mode = "draft-model"
    broken = mode == "broken rule"
    if broken:
        from specedge.kernels import acceptance

        monkeypatch.setattr(acceptance, "residual", correction_from_p)
        mode = "draft-model"
    params = CASES["temperature"]
    gen = load(small_vocab_pair, mode, SpecConfig(gamma=3, sampling=params, acceptance="rejection"))
    samples = draw(gen, seed=zlib.crc32(f"rejection/{mode}".encode()))
    assert gen.generate(PROMPT, seed=1).stats.acceptance_rule == "rejection"
    p2, p3 = exact_laws(small_vocab_pair[0], params)
    results = []
    for position, law in ((1, p2), (2, p3)):
        assert power(law, DRAWS) >= 0.85, f"token {position + 1}: too few draws to see a 1% shift"
        ok, chi_z, cell_z = fits(samples[:, position], law)
        results.append(ok)
        assert ok or broken, f"token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"
    assert not broken or not all(results), "the broken rule passed the law test"
    assert not cut_short or {1, 2} <= set(cuts), sorted(set(cuts))  # some rounds cut, others not


def test_the_rule_follows_the_seed(small_vocab_pair: tuple[Path, Path, Path]) -> None:
    """With a seed the race (plain sampling's tokens); without, the rejection rule; asked for by name, it.
    A seeded rejection run repeats itself."""
    params = SamplingParams(temperature=1.0)
    gen = load(small_vocab_pair, "draft-model", SpecConfig(gamma=3, max_new_tokens=12, sampling=params))
    assert gen.generate(PROMPT, seed=3).stats.acceptance_rule == "race"
    assert gen.generate(PROMPT).stats.acceptance_rule == "rejection"
    greedy = load(small_vocab_pair, "draft-model", SpecConfig(gamma=3, max_new_tokens=12))
    assert greedy.generate(PROMPT).stats.acceptance_rule == "greedy"
    rejection = load(small_vocab_pair, "draft-model",
                     SpecConfig(gamma=3, max_new_tokens=12, sampling=params, acceptance="rejection"))
    first = rejection.generate(PROMPT, seed=3, ignore_eos=True)
    assert first.stats.acceptance_rule == "rejection"
    assert rejection.generate(PROMPT, seed=3, ignore_eos=True).token_ids == first.token_ids
    with pytest.raises(SpecEdgeError, match="unknown acceptance rule"):
        SpecConfig(acceptance="coin")


@pytest.mark.parametrize("mode", ["draft-model", "ngram", "hybrid", "truncated-draft", "auto"])
@pytest.mark.parametrize("gamma", [1, 3])
def test_seeded_sampling_is_token_identical_to_plain(small_vocab_pair: tuple[Path, Path, Path], mode: str,
                                                     gamma: int) -> None:
    """Rounds of any length, bonus tokens, corrections, EOS: each seed gives plain sampling's tokens."""
    config = SpecConfig(gamma=gamma, max_new_tokens=16, sampling=SamplingParams(temperature=1.0, top_k=8))
    plain, spec = load(small_vocab_pair, "plain", config), load(small_vocab_pair, mode, config)
    accepted, chained, eos = 0, 0, 0
    for seed in range(60):
        ignore_eos = seed % 2 == 0  # this model ends most answers within a few tokens
        expected = plain.generate(PROMPT, seed=seed, ignore_eos=ignore_eos)
        result = spec.generate(PROMPT, seed=seed, ignore_eos=ignore_eos)
        assert result.token_ids == expected.token_ids, seed
        assert result.stats.stop_reason == expected.stats.stop_reason
        accepted += result.stats.accepted
        chained += sum(result.stats.accepted_by_position[1:])
        eos += result.stats.stop_reason == "eos"
    assert accepted > 30 and eos > 10  # drafts were accepted, and runs ended at EOS
    assert chained > 0 or gamma == 1  # rounds that accepted 2 drafts or more
