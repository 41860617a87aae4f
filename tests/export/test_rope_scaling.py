"""Llama 3's rope scaling (`rope_type` llama3; Llama 3.1 and 3.2): each rotary frequency divided as
transformers divides it, from a checkpoint's config or a GGUF's rope_freqs tensor. Checked against
transformers on a tiny random checkpoint transformers itself saves (reference set), and here against
an independent numpy reading of the same rule."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.export.source import checked_config
from tests.tiny_models import tiny_config, write_tokenizer

SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
           "original_max_position_embeddings": 32}
THETA = 10000.0


def llama3_inv_freq(head_dim: int, theta: float, s: dict) -> np.ndarray:
    """transformers' _compute_llama3_parameters, vectorized as it is written there."""
    inv = 1.0 / theta ** (np.arange(0, head_dim, 2) / head_dim)
    original = s["original_max_position_embeddings"]
    low_wave, high_wave = original / s["low_freq_factor"], original / s["high_freq_factor"]
    wave = 2 * math.pi / inv
    scaled = np.where(wave > low_wave, inv / s["factor"], inv)
    smooth = (original / wave - s["low_freq_factor"]) / (
        s["high_freq_factor"] - s["low_freq_factor"])
    smoothed = (1 - smooth) * scaled / s["factor"] + smooth * scaled
    medium = (wave >= high_wave) & (wave <= low_wave)
    return np.where(medium, smoothed, scaled)


def config_values(**overrides: object) -> dict:
    return {**tiny_config("llama"), "rope_parameters": {"rope_theta": THETA, **SCALING}, **overrides}


def test_the_factors_are_transformers_llama3_frequencies() -> None:
    config, _ = checked_config(config_values(), Path("config.json"))
    d = config.head_dim
    ours = 1.0 / THETA ** (np.arange(0, d, 2) / d) / np.asarray(config.rope_freq_factors)
    np.testing.assert_allclose(ours, llama3_inv_freq(d, THETA, SCALING), rtol=1e-12)
    assert config.rope_freq_factors[0] == 1.0 and config.rope_freq_factors[-1] == 8.0  # short kept, long divided
    assert any(1.0 < f < 8.0 for f in config.rope_freq_factors)  # and some blended between


def test_other_scalings_and_bad_values_are_one_line() -> None:
    with pytest.raises(SpecEdgeError, match=r"rope scaling .*yarn.* is not supported yet"):
        checked_config(config_values(rope_parameters={"rope_type": "yarn", "factor": 4.0}), Path("config.json"))
    bad = {**SCALING, "high_freq_factor": 0.5}
    with pytest.raises(SpecEdgeError, match=r"high_freq_factor .* above low_freq_factor"):
        checked_config(config_values(rope_parameters={"rope_theta": THETA, **bad}), Path("config.json"))
    with pytest.raises(SpecEdgeError, match="needs factor above 0"):
        checked_config(config_values(rope_parameters={**SCALING, "factor": "8"}), Path("config.json"))
    with pytest.raises(SpecEdgeError, match="must hold 8 factors"):
        checked_config({**tiny_config("llama"), "rope_freq_factors": [1.0, 2.0]}, Path("x.gguf"))


def test_the_export_rotates_by_the_scaled_frequencies(tmp_path: Path) -> None:
    """The graph's rotary tables are cos/sin of position x the scaled frequencies."""
    import onnx
    from onnx import numpy_helper

    from tests.tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path / "src", "llama", seed=3, rope_parameters={"rope_theta": THETA, **SCALING})
    out = export_model(src, tmp_path / "out", ExportSettings(quant="fp32", context=64, widths=(1, 5))).path
    model = onnx.load(str(out / "model.onnx"))
    cos = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "rope.cos_cache"))
    angles = np.outer(np.arange(64), llama3_inv_freq(16, THETA, SCALING))
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-6)


@pytest.mark.reference
def test_a_llama3_checkpoint_saved_by_transformers_decodes_as_transformers(tmp_path: Path,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny Llama with Llama 3's rope scaling, saved by transformers: the fp32 export's logits over
    96 positions (well past the 32 the scaling starts from) and its greedy tokens are transformers'."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from specedge.runtime import Generator, OnnxModel, SpecConfig

    values = {k: v for k, v in config_values().items() if k not in ("architectures", "model_type", "dtype")}
    torch.manual_seed(0)
    config = transformers.LlamaConfig(**values)
    model = transformers.LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.25 if p.dim() > 1 else 1.0)  # norms random too: a bug in either shows
    src = tmp_path / "src"
    model.save_pretrained(src, safe_serialization=True)
    write_tokenizer(src)
    out = export_model(src, tmp_path / "out", ExportSettings(quant="fp32", context=128, widths=(1, 5))).path

    ids = [int(i) for i in np.random.default_rng(5).integers(0, 256, 96)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    onnx_model = OnnxModel(out)
    ours = onnx_model.forward(ids, onnx_model.new_cache()).logits
    assert np.abs(ours - ref).max() < 1e-3 * np.abs(ref).max()

    prompt = ids[:40]
    with torch.no_grad():
        expected = model.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                  max_new_tokens=40, do_sample=False, eos_token_id=None,
                                  pad_token_id=config.eos_token_id)[0, 40:].tolist()
    gen = Generator.load(out, single_steps=True, config=SpecConfig(gamma=0, max_new_tokens=40, ignore_eos=True))
    got = gen.generate(prompt).token_ids
    assert got == expected, (got, expected)
    int4 = export_model(src, tmp_path / "int4", ExportSettings(quant="int4", context=128, widths=(1, 5))).path
    quantized = OnnxModel(int4)
    agree = float(np.mean(quantized.forward(ids, quantized.new_cache()).logits.argmax(-1) == ours.argmax(-1)))
    with capsys.disabled():
        print(f"\nllama3 rope (tiny, saved by transformers): int4 top-1 agreement with fp32 {agree:.3f} over 96")
    assert agree > 0.2  # 0.51 measured on this tiny random model; chance is 1/260


def test_a_gguf_rope_freqs_tensor_divides_the_frequencies(tmp_path: Path) -> None:
    """llama.cpp writes Llama 3's scaling as rope_freqs.weight: a divisor per frequency, read as it
    is; one that is not a short list of positive numbers is refused in one line, before export."""
    import onnx
    from onnx import numpy_helper

    from specedge.export.source import load_source
    from tests.gguf_models import HEAD_DIM, make_tiny_gguf

    factors = np.linspace(1.0, 8.0, HEAD_DIM // 2).astype(np.float32)
    path = make_tiny_gguf(tmp_path / "llama3.gguf", rope_freqs=factors)
    assert np.allclose(load_source(path).config.rope_freq_factors, factors)
    out = export_model(path, tmp_path / "out", ExportSettings(quant="fp32", context=64, widths=(1, 5))).path
    cos = numpy_helper.to_array(next(t for t in onnx.load(str(out / "model.onnx")).graph.initializer
                                     if t.name == "rope.cos_cache"))
    inv = 1.0 / 50000.0 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM) / factors
    np.testing.assert_allclose(cos, np.cos(np.outer(np.arange(64), inv)), atol=1e-6)
    bad = make_tiny_gguf(tmp_path / "bad.gguf", rope_freqs=-factors)
    with pytest.raises(SpecEdgeError, match=r"rope_freqs\.weight must be positive finite numbers"):
        load_source(bad)
