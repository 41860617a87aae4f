"""Speculative sampling has exactly the target's distribution (20,000 draws per case), and with
a seed it gives the very tokens plain sampling gives with that seed.

The exact law of the first generated tokens is computed from the target's own logits; speculative
and plain sampling are both checked against it with tests/stats_tools.fits, which flags a 1%
shift of probability mass at this many draws. Each draw decodes 4 tokens: the first from the
prefill, then a round of 2 drafts (the 2nd and 3rd tokens: accepted drafts or a correction) and
the token after them.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import zlib
from pathlib import Path

import numpy as np
import pytest

from specedge.kernels.sampling import SamplingParams, probabilities
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.stats_tools import fits
from tests.tiny_models import byte_tokenizer, make_tiny_model

VOCAB = 12
DRAWS = 20_000
TOKENS = 4  # the first, a round of 2 drafts, the token after them
PROMPT = [3, 5, 7, 3, 5, 7, 3, 5]  # repeats, so the n-gram drafter proposes too
CASES = {
    "temperature": SamplingParams(temperature=1.0),
    "top-k": SamplingParams(temperature=0.8, top_k=5),
    "top-p": SamplingParams(temperature=1.3, top_p=0.8),
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
                            seed=seed, ignore_eos=True)
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


# 20,000 draws per mode, ~1 min each: with `-m slow`. By default the seeded identity with plain
# sampling below covers the sampling path, and tests/kernels the acceptance law itself.
@pytest.mark.slow
@pytest.mark.parametrize(("case", "mode"), MODES)
def test_sampled_tokens_follow_target_law(small_vocab_pair: tuple[Path, Path, Path], case: str, mode: str) -> None:
    params = CASES[case]
    gen = load(small_vocab_pair, mode, SpecConfig(gamma=3, sampling=params))
    samples = draw(gen, seed=zlib.crc32(f"{case}/{mode}".encode()))  # the same seeds in every run
    if mode in ("draft-model", "truncated-draft"):
        assert len(gen.generate(PROMPT).stats.proposed_by_position) == TOKENS - 2  # a round of 2 drafts
    p2, p3 = exact_laws(small_vocab_pair[0], params)
    for position, law in ((1, p2), (2, p3)):
        ok, chi_z, cell_z = fits(samples[:, position], law)
        assert ok, f"token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"


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
