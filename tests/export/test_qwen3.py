"""Qwen3: each head of q and k RMS-normalized (its own weights) before rope, an explicit head size
(32 here, twice hidden / heads), no q/k/v biases. Every attention kind of the exporter against the
numpy model, a GGUF with llama.cpp's names, and (reference set) a checkpoint transformers saves."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

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


@pytest.mark.parametrize("attention", ["exact", "fused", "rows"])
def test_each_attention_kind_equals_the_numpy_model(tiny_qwen3: tuple[Path, Path, Path], tmp_path: Path,
                                                     attention: str) -> None:
    src = tiny_qwen3[0]
    if attention == "rows":
        from specedge.kernels import native

        if not native.available():
            pytest.skip(native.missing())
    out = export_model(src, tmp_path / attention, dataclasses.replace(SETTINGS, attention=attention)).path
    ref = reference_logits(src, IDS)
    tolerance = 2e-2 if attention == "rows" else 1e-4  # rows: a float16 cache
    assert np.abs(logits_of(out, IDS) - ref).max() < tolerance * np.abs(ref).max()


def test_the_source_says_its_head_size_and_norms(tiny_qwen3: tuple[Path, Path, Path]) -> None:
    config = load_source(tiny_qwen3[0]).config
    assert (config.architecture, config.head_dim, config.qk_norm, config.attention_bias) == ("qwen3", 32, True, False)


def test_a_qwen3_gguf_exports_with_llama_cpps_names(tmp_path: Path) -> None:
    """attn_q_norm / attn_k_norm and the head size from attention.key_length; greedy speculation
    with a noisy draft of it equals its plain decoding."""
    from tests.gguf_models import HEAD_DIM, make_tiny_gguf

    path = make_tiny_gguf(tmp_path / "qwen3.gguf", arch="qwen3")
    source = load_source(path)
    assert source.config.qk_norm and source.config.head_dim == HEAD_DIM
    assert "model.layers.1.self_attn.k_norm.weight" in source.weights
    target = export_model(path, tmp_path / "target", SETTINGS).path
    draft = export_model(make_tiny_gguf(tmp_path / "draft.gguf", arch="qwen3", seed=1), tmp_path / "draft",
                         SETTINGS).path
    config = SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True)
    plain = Generator.load(target, single_steps=True, config=dataclasses.replace(config, gamma=0))
    spec = Generator.load(target, draft=draft, config=config)
    assert spec.generate(IDS).token_ids == plain.generate(IDS).token_ids


def test_a_qwen3_gguf_decodes_as_the_numpy_model_of_its_weights(tmp_path: Path) -> None:
    """The GGUF's tensors, dequantized under their Hugging Face names into a checkpoint of the same
    config, give the numpy model's logits; the export of the GGUF gives the same. (transformers'
    own GGUF reader takes no head size for qwen3 and builds heads of 128: no reference there.)"""
    import json

    from tests.gguf_models import make_tiny_gguf
    from tests.tiny_models import tiny_config, write_safetensors

    path = make_tiny_gguf(tmp_path / "qwen3.gguf", arch="qwen3")
    source = load_source(path)
    c = source.config
    folder = tmp_path / "as-hf"
    folder.mkdir()
    config = tiny_config("qwen3", vocab_size=c.vocab_size, head_dim=c.head_dim, rms_norm_eps=c.rms_norm_eps,
                         rope_theta=c.rope_theta, tie_word_embeddings=c.tie_word_embeddings)
    (folder / "config.json").write_text(json.dumps(config))
    write_safetensors(folder / "model.safetensors", {n: source.weights.read(n) for n in sorted(source.weights.keys())})
    out = export_model(path, tmp_path / "out", SETTINGS).path
    ref = reference_logits(folder, IDS)
    assert np.abs(logits_of(out, IDS) - ref).max() < 1e-4 * np.abs(ref).max()


@pytest.mark.reference
def test_a_qwen3_saved_by_transformers_decodes_as_transformers(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    """A tiny random Qwen3 that transformers itself saves: the fp32 export's greedy tokens are
    transformers' `generate`; the int4 export's top-1 agreement with it is reported."""
    pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.export.saved_by_transformers import int4_agreement, our_greedy, save_tiny, transformers_greedy

    model, config = save_tiny("qwen3", transformers.Qwen3Config, transformers.Qwen3ForCausalLM, tmp_path / "src",
                              tie_word_embeddings=True)
    fp32 = export_model(tmp_path / "src", tmp_path / "fp32", SETTINGS).path
    expected = transformers_greedy(model, config, IDS, 32)
    assert our_greedy(fp32, IDS, 32) == expected
    int4 = export_model(tmp_path / "src", tmp_path / "int4", dataclasses.replace(SETTINGS, quant="int4")).path
    assert int4_agreement(int4, fp32, IDS + expected, "qwen3", capsys) > 0.5
