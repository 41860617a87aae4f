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
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.tiny_models import tiny_config, write_tokenizer

    values = {k: v for k, v in tiny_config("gemma3_text").items() if k not in ("architectures", "model_type", "dtype")}
    config = transformers.Gemma3TextConfig(**values)
    torch.manual_seed(0)
    model = transformers.Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.2) if p.dim() > 1 else p.normal_(0.0, 0.3)  # norms are 1 + w: w random around 0
    src = tmp_path / "src"
    model.save_pretrained(src, safe_serialization=True)
    write_tokenizer(src)
    fp32 = export_model(src, tmp_path / "fp32", SETTINGS).path
    with torch.no_grad():
        expected = model.generate(torch.tensor([IDS]), attention_mask=torch.ones(1, len(IDS), dtype=torch.long),
                                  max_new_tokens=32, do_sample=False, eos_token_id=None,
                                  pad_token_id=config.eos_token_id)[0, len(IDS):].tolist()
    gen = Generator.load(fp32, single_steps=True, config=SpecConfig(gamma=0, max_new_tokens=32, ignore_eos=True))
    assert gen.generate(IDS).token_ids == expected
    int4 = export_model(src, tmp_path / "int4", dataclasses.replace(SETTINGS, quant="int4")).path
    ids = IDS + expected
    agree = float(np.mean(logits_of(int4, ids).argmax(-1) == logits_of(fp32, ids).argmax(-1)))
    with capsys.disabled():
        print(f"\ngemma3 (tiny, saved by transformers): int4 top-1 agreement with fp32 {agree:.3f} over {len(ids)}")
    assert agree > 0.5
