"""Gemma 3 (text): its embedding scaled by sqrt(hidden), norms by 1 + w, a norm after attention and
after the MLP, q/k norms, gelu (tanh), scores scaled by query_pre_attn_scalar, and sliding layers
that see the last `sliding_window` positions with their own rope base. The tiny model's window is 8
positions, so prompts of 20 tokens cross it. Against the numpy model here, against transformers in
the reference set (a checkpoint transformers itself saves)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.export.source import load_source
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.numpy_forward import reference_logits

IDS = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 35, 32, 97, 98, 99, 100]
SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))


def logits_of(folder: Path, ids: list[int]) -> np.ndarray:
    model = OnnxModel(folder)
    return model.forward(ids, model.new_cache()).logits


def test_the_source_reads_gemmas_config(tiny_gemma3: tuple[Path, Path, Path]) -> None:
    c = load_source(tiny_gemma3[0]).config
    assert (c.architecture, c.head_dim, c.sliding_window, c.sliding_layers) == ("gemma3", 32, 8, (True, False))
    assert (c.norm_offset, c.activation, c.attn_scale, c.local_rope_theta) == (1.0, "gelu_tanh", 24 ** -0.5, 1e4)
    assert c.embed_scale == np.float32(8.0) and c.qk_norm and c.sandwich_norms and c.rope_theta == 1e6


@pytest.mark.parametrize("attention", ["exact", "fused"])
def test_each_attention_kind_equals_the_numpy_model(tiny_gemma3: tuple[Path, Path, Path], tmp_path: Path,
                                                     attention: str) -> None:
    src = tiny_gemma3[0]
    out = export_model(src, tmp_path / attention, dataclasses.replace(SETTINGS, attention=attention)).path
    ref = reference_logits(src, IDS)
    assert np.abs(logits_of(out, IDS) - ref).max() < 1e-4 * np.abs(ref).max()


def test_the_native_attention_is_refused_past_the_window(tiny_gemma3: tuple[Path, Path, Path],
                                                          tmp_path: Path) -> None:
    from specedge.kernels import native

    if not native.available():
        pytest.skip(native.missing())
    with pytest.raises(SpecEdgeError, match="sliding layers see only the last 8 positions"):
        export_model(tiny_gemma3[0], tmp_path / "rows", dataclasses.replace(SETTINGS, attention="rows"))
    assert not (tmp_path / "rows").exists()


@pytest.mark.parametrize("attention", ["exact", "fused"])
def test_speculation_equals_plain_decoding_across_the_window(tiny_gemma3: tuple[Path, Path, Path], tmp_path: Path,
                                                             attention: str) -> None:
    """Decoded step by step from the cache, 40 tokens past a 20-token prompt (the window is 8):
    greedy speculation with the noisy draft equals plain decoding, and both equal the numpy model."""
    target = tiny_gemma3[1] if attention == "exact" else export_model(
        tiny_gemma3[0], tmp_path / "fused", dataclasses.replace(SETTINGS, attention="fused",
                                                                  widths=(1, 2, 3, 5, 8))).path
    config = SpecConfig(gamma=4, max_new_tokens=40, ignore_eos=True)
    plain = Generator.load(target, single_steps=True, config=dataclasses.replace(config, gamma=0))
    tokens = plain.generate(IDS).token_ids
    if attention == "exact":
        spec = Generator.load(target, draft=tiny_gemma3[2], config=config)
        assert spec.generate(IDS).token_ids == tokens
    ref = reference_logits(tiny_gemma3[0], IDS + tokens)
    assert ref[len(IDS) - 1:-1].argmax(-1).tolist() == tokens


@pytest.mark.reference
def test_the_numpy_model_is_transformers_gemma3(tiny_gemma3: tuple[Path, Path, Path]) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_gemma3[0], dtype=torch.float32)
    with torch.no_grad():
        ref = model(torch.tensor([IDS])).logits[0].numpy()
    assert np.abs(reference_logits(tiny_gemma3[0], IDS) - ref).max() < 1e-4 * np.abs(ref).max()


@pytest.mark.reference
def test_a_gemma3_saved_by_transformers_decodes_as_transformers(tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny random Gemma 3 that transformers itself saves (a window of 8, a sliding and a full
    layer): the fp32 export's greedy tokens 32 past a 20-token prompt are transformers' `generate`;
    the int4 export's top-1 agreement with it is reported."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.export.saved_by_transformers import int4_agreement, our_greedy, save_tiny, transformers_greedy

    model, config = save_tiny("gemma3_text", transformers.Gemma3TextConfig, transformers.Gemma3ForCausalLM,
                              tmp_path / "src", norm_mean=0.0)  # norms are 1 + w: w random around 0
    fp32 = export_model(tmp_path / "src", tmp_path / "fp32", SETTINGS).path
    expected = transformers_greedy(model, config, IDS, 32)
    assert our_greedy(fp32, IDS, 32) == expected
    int4 = export_model(tmp_path / "src", tmp_path / "int4", dataclasses.replace(SETTINGS, quant="int4")).path
    assert int4_agreement(int4, fp32, IDS + expected, "gemma3", capsys) > 0.5


def test_a_gemma_source_is_exported_with_attention_that_sees_its_window(tiny_gemma3: tuple[Path, Path, Path],
                                                                        tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint or GGUF named on the command line (or in specedge.load) is exported as the
    registry's int4 target is: where that is the native rows attention, a model whose sliding
    layers see fewer positions than the context gets exact attention instead (also row-exact)."""
    from specedge.core.manifest import load_manifest
    from specedge.export.source import inspect_source
    from specedge.resolve import source_artifact

    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SPECEDGE_INT4_KERNEL", "rows")
    assert inspect_source(tiny_gemma3[0]).sliding_window == 8
    out = source_artifact(tiny_gemma3[0], context=128)
    assert load_manifest(out).attention == "exact"
    config = SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True)
    plain = Generator.load(out, single_steps=True, config=dataclasses.replace(config, gamma=0))
    assert Generator.load(out, ngram=True, config=config).generate(IDS * 2).token_ids == \
        plain.generate(IDS * 2).token_ids
