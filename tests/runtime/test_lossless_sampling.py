"""Speculative sampling has exactly the target's distribution (20,000 draws per case).

The exact law of the first generated tokens is computed from the target's own logits; speculative
and plain sampling are both checked against it with tests/stats_tools.fits, which flags a 1%
shift of probability mass at this many draws.
"""

from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from specedge.kernels.sampling import SamplingParams, probabilities
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.stats_tools import fits
from tests.tiny_models import make_tiny_model

VOCAB = 12
DRAWS = 20_000
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
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.5, seed=6)
    settings = ExportSettings(quant="fp32", context=32, widths=(1, 2, 3, 4))
    truncated = export_model(draft_src, root / "d8", dataclasses.replace(settings, head_vocab=8)).path
    return export_model(src, root / "t", settings).path, export_model(draft_src, root / "d", settings).path, truncated


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
    """DRAWS samples of the first three generated tokens: [DRAWS, 3]."""
    gen.config = SpecConfig(gamma=gen.config.gamma, max_new_tokens=3, sampling=gen.config.sampling,
                            seed=seed, ignore_eos=True)
    out = np.empty((DRAWS, 3), dtype=np.int64)
    seeds = np.random.SeedSequence(seed).generate_state(DRAWS)
    for i, s in enumerate(seeds):
        out[i] = gen.generate(PROMPT, seed=int(s)).token_ids
    return out


MODES = [*itertools.product(CASES, ["plain", "draft-model", "ngram"]), ("top-p", "hybrid"),
         ("temperature", "truncated-draft")]


@pytest.mark.parametrize(("case", "mode"), MODES)
def test_sampled_tokens_follow_target_law(small_vocab_pair: tuple[Path, Path, Path], case: str, mode: str) -> None:
    target, draft, truncated = small_vocab_pair
    if mode == "truncated-draft":  # proposes only ids 0..7; the target's mass on 8..11 comes from residuals
        draft = truncated
    params = CASES[case]
    config = SpecConfig(gamma=0 if mode == "plain" else 3, sampling=params)
    gen = Generator.load(target, draft=draft if mode in ("draft-model", "hybrid", "truncated-draft") else None,
                         ngram=mode in ("ngram", "hybrid"),
                         threads=1, config=config)
    samples = draw(gen, seed=hash((case, mode)) % 2**31)
    p2, p3 = exact_laws(target, params)
    for position, law in ((1, p2), (2, p3)):
        ok, chi_z, cell_z = fits(samples[:, position], law)
        assert ok, f"token {position + 1}: chi-square z {chi_z:.1f}, worst cell z {cell_z:.1f}"
