"""How a pass grows with the context: timed on a tiny pair, once, when a long prompt first comes."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.runtime import Generator, SpecConfig, generator
from specedge.runtime.engine.context_growth import growth_per_token, zero_filled
from specedge.runtime.engine.model import OnnxModel
from tests.conftest import TINY_WIDTHS
from tests.tiny_models import make_tiny_model


@pytest.fixture(scope="module")
def long_pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft): a tiny qwen2 pair exported for 1024 tokens (the shared tiny pairs hold 64)."""
    root = tmp_path_factory.mktemp("growth")
    src = make_tiny_model(root / "src", "qwen2", seed=1)
    draft_src = make_tiny_model(root / "draft-src", noise_from=src, noise=0.05, seed=2)
    settings = ExportSettings(quant="fp32", context=1024, widths=TINY_WIDTHS)
    return export_model(src, root / "target", settings).path, export_model(draft_src, root / "draft", settings).path


def test_a_zero_filled_cache_holds_its_length(long_pair: tuple[Path, Path]) -> None:
    model = OnnxModel(long_pair[0])
    assert zero_filled(model, 300).length == 300 and zero_filled(model, 0).length == 0


def test_growth_is_a_time_per_cached_token_and_none_below_256_tokens(long_pair: tuple[Path, Path]) -> None:
    model = OnnxModel(long_pair[0])
    growth = growth_per_token(model, depth=1000, repeats=5)
    assert math.isfinite(growth) and 0 <= growth < 1e-4  # seconds a token (a tiny model: may be 0)
    assert growth_per_token(model, depth=200) == 0.0


def test_the_generator_times_it_once_when_gamma_auto_first_meets_a_long_prompt(
        long_pair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    target, draft = long_pair
    monkeypatch.setattr(generator, "LONG_PROMPT", 100)
    gen = Generator.load(target, draft=draft, config=SpecConfig.auto(max_new_tokens=4))
    gen.generate(list(range(20, 40)))
    assert gen.growth is None  # short prompts: times as measured
    gen.generate(list(range(20, 140)))
    growth = gen.growth
    assert growth is not None and growth.verify >= 0 and set(growth.draft) == {"model"}
    gen.generate(list(range(30, 150)))
    assert gen.growth is growth  # timed once
    fixed = Generator.load(target, draft=draft, config=SpecConfig(gamma=2, max_new_tokens=4))
    fixed.generate(list(range(20, 140)))
    assert fixed.growth is None  # a fixed γ weighs nothing
