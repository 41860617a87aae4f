"""Phi-3: q, k and v in one matrix and gate and up in another (read as the parts they stack), a
sliding window on every layer (12 positions in the tiny model), and longrope (its short factors and
attention factor, within the positions they serve). Partial rotary embeddings (Phi-4-mini) are
refused in one line. Against the numpy model here, against transformers in the reference set."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.export.source import checked_config, load_source
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.numpy_forward import reference_logits
from tests.tiny_models import tiny_config

IDS = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 35, 32, 97, 98, 99, 100]
SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "original_max_position_embeddings": 64,
            "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.6, 3.3, 4.0], "long_factor": [1.0] * 4 + [8.0] * 4}


def logits_of(folder: Path, ids: list[int]) -> np.ndarray:
    model = OnnxModel(folder)
    return model.forward(ids, model.new_cache()).logits


def test_the_source_reads_the_fused_matrices_and_the_window(tiny_phi3: tuple[Path, Path, Path]) -> None:
    source = load_source(tiny_phi3[0])
    c = source.config
    assert (c.architecture, c.sliding_window, c.sliding_layers) == ("phi3", 12, (True, True))
    assert source.weights.read("model.layers.0.self_attn.k_proj.weight").shape == (32, 64)
    assert source.weights.read("model.layers.1.mlp.up_proj.weight").shape == (128, 64)


@pytest.mark.parametrize("attention", ["exact", "fused"])
def test_each_attention_kind_equals_the_numpy_model(tiny_phi3: tuple[Path, Path, Path], tmp_path: Path,
                                                     attention: str) -> None:
    out = export_model(tiny_phi3[0], tmp_path / attention, dataclasses.replace(SETTINGS, attention=attention)).path
    ref = reference_logits(tiny_phi3[0], IDS)
    assert np.abs(logits_of(out, IDS) - ref).max() < 1e-4 * np.abs(ref).max()


def test_speculation_equals_plain_decoding_across_the_window(tiny_phi3: tuple[Path, Path, Path]) -> None:
    config = SpecConfig(gamma=4, max_new_tokens=40, ignore_eos=True)
    plain = Generator.load(tiny_phi3[1], single_steps=True, config=dataclasses.replace(config, gamma=0))
    tokens = plain.generate(IDS).token_ids
    assert Generator.load(tiny_phi3[1], draft=tiny_phi3[2], config=config).generate(IDS).token_ids == tokens
    assert reference_logits(tiny_phi3[0], IDS + tokens)[len(IDS) - 1:-1].argmax(-1).tolist() == tokens


def test_what_an_export_cannot_hold_is_one_line(tiny_phi3: tuple[Path, Path, Path], tmp_path: Path) -> None:
    with pytest.raises(SpecEdgeError, match=r"partial_rotary_factor gives a rotary part of 3 values"):
        checked_config({**tiny_config("phi3"), "partial_rotary_factor": 0.2}, Path("config.json"))
    values = {**tiny_config("phi3"), "rope_parameters": LONGROPE, "max_position_embeddings": 256}
    config, _ = checked_config(values, Path("config.json"))
    assert config.rope_freq_factors == tuple(LONGROPE["short_factor"]) and config.rope_context_limit == 64
    assert config.rope_attention_factor == pytest.approx(np.sqrt(1 + np.log(4) / np.log(64)))
    from specedge.kernels import native

    if native.available():
        with pytest.raises(SpecEdgeError, match="sliding layers see only the last 12 positions"):
            export_model(tiny_phi3[0], tmp_path / "rows", dataclasses.replace(SETTINGS, attention="rows"))


@pytest.mark.parametrize("attention", ["exact", "fused", "static"])
def test_partial_rotary_embeddings_equal_the_numpy_model(tmp_path: Path, attention: str) -> None:
    """Phi-4-mini rotates the first 3/4 of each head (96 of 128): here half of 32, with both CPU
    attention kinds and in a static graph (DirectML's, run on the CPU provider), which rotates by
    its own ops rather than ONNX Runtime's RotaryEmbedding."""
    from tests.tiny_models import make_tiny_model

    params = {"rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5}
    src = make_tiny_model(tmp_path / "src", "phi3", seed=4, rope_parameters=params, head_dim=32)
    assert load_source(src).config.rotary_size == 16
    settings = (dataclasses.replace(SETTINGS, target="dml") if attention == "static" else
                dataclasses.replace(SETTINGS, attention=attention))
    out = export_model(src, tmp_path / attention, settings).path
    ids = IDS[:5] if attention == "static" else IDS  # a static graph's width
    ref = reference_logits(src, ids)
    assert np.abs(logits_of(out, ids) - ref).max() < 1e-4 * np.abs(ref).max()


@pytest.mark.reference
def test_the_numpy_model_is_transformers_phi3(tiny_phi3: tuple[Path, Path, Path]) -> None:
    torch = pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM

    from tests.tiny_models import make_tiny_model

    partial = make_tiny_model(tiny_phi3[0].parent / "phi3-partial-src", "phi3", seed=4, head_dim=32, rope_parameters={
        "rope_theta": 10000.0, "rope_type": "default", "partial_rotary_factor": 0.5})
    for src in (tiny_phi3[0], partial):
        model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
        with torch.no_grad():
            ref = model(torch.tensor([IDS])).logits[0].numpy()
        assert np.abs(reference_logits(src, IDS) - ref).max() < 1e-4 * np.abs(ref).max()


@pytest.mark.reference
def test_a_longrope_phi3_saved_by_transformers_decodes_as_transformers(tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """Phi-3 with longrope (as Phi-3-mini-128k and Phi-3.5-mini), saved by transformers: within the
    positions its short factors serve, the export's logits and greedy tokens are transformers' (the
    int4 export's top-1 agreement reported); a context past them is refused in one line."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from tests.export.saved_by_transformers import int4_agreement, our_greedy, save_tiny, transformers_greedy

    model, config = save_tiny("phi3", transformers.Phi3Config, transformers.Phi3ForCausalLM, tmp_path / "src",
                              rope_parameters=LONGROPE, max_position_embeddings=256,
                              original_max_position_embeddings=64, sliding_window=None)
    src = tmp_path / "src"
    out = export_model(src, tmp_path / "fp32", SETTINGS).path
    ids = [int(i) for i in np.random.default_rng(2).integers(0, 256, 48)]
    with torch.no_grad():
        ref = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(logits_of(out, ids) - ref).max() < 1e-3 * np.abs(ref).max()
    prompt = ids[:24]
    expected = transformers_greedy(model, config, prompt, 24)
    assert our_greedy(out, prompt, 24) == expected
    int4 = export_model(src, tmp_path / "int4", dataclasses.replace(SETTINGS, quant="int4")).path
    # 0.40 measured: 4-bit blocks of a tiny random model's narrow rows; chance is 1/260
    assert int4_agreement(int4, out, prompt + expected, "phi3 longrope", capsys) > 0.2
    with pytest.raises(SpecEdgeError, match=r"longrope.* change past 64 positions"):
        export_model(src, tmp_path / "long", dataclasses.replace(SETTINGS, context=128))


@pytest.mark.parametrize("variant", ["plain", "llama.cpp's longrope, window and partial rotary"])
def test_a_phi3_gguf_decodes_as_the_numpy_model_of_its_weights(tmp_path: Path, variant: str) -> None:
    """llama.cpp's Phi-3 file: attn_qkv and ffn_up (gate and up) read as their parts; with
    rope.dimension_count short of the head (Phi-4-mini), a sliding window and rope_factors_short, as
    llama.cpp applies them. Its tensors, dequantized into a checkpoint of the same config, give the
    numpy model's logits, and the export of the file gives the same; speculation equals plain."""
    import json

    from tests.gguf_models import HEAD_DIM, make_tiny_gguf
    from tests.tiny_models import write_safetensors

    short = [1.0, 1.5, 2.0, 3.0]  # the 4 frequencies of an 8-value rotary part
    spec = {} if variant == "plain" else {"rotary": 8, "window": 12, "short": short, "original": 64, "attn": 1.2}
    path = make_tiny_gguf(tmp_path / "phi3.gguf", arch="phi3", phi3=spec)
    source = load_source(path)
    c = source.config
    assert (c.architecture, c.rotary_size) == ("phi3", 8 if spec else HEAD_DIM)
    folder = tmp_path / "as-hf"
    folder.mkdir()
    extra = {"sliding_window": None} if not spec else {
        "sliding_window": 12, "original_max_position_embeddings": 64,
        "rope_parameters": {"rope_type": "longrope", "rope_theta": c.rope_theta, "partial_rotary_factor": 0.5,
                            "short_factor": short, "long_factor": short, "attention_factor": 1.2,
                            "original_max_position_embeddings": 64}}
    config = tiny_config("phi3", vocab_size=c.vocab_size, rms_norm_eps=c.rms_norm_eps, rope_theta=c.rope_theta,
                         tie_word_embeddings=c.tie_word_embeddings, **extra)
    (folder / "config.json").write_text(json.dumps(config))
    weights = {n: source.weights.read(n) for n in sorted(source.weights.keys())}
    fused = {}
    for i in range(c.num_layers):
        a, m = f"model.layers.{i}.self_attn", f"model.layers.{i}.mlp"
        fused[f"{a}.qkv_proj.weight"] = np.concatenate([weights.pop(f"{a}.{n}_proj.weight") for n in "qkv"])
        fused[f"{m}.gate_up_proj.weight"] = np.concatenate([weights.pop(f"{m}.{n}_proj.weight")
                                                            for n in ("gate", "up")])
    write_safetensors(folder / "model.safetensors", {**weights, **fused})
    out = export_model(path, tmp_path / "out", SETTINGS).path
    ref = reference_logits(folder, IDS)
    assert np.abs(logits_of(out, IDS) - ref).max() < 1e-4 * np.abs(ref).max()
    config = SpecConfig(gamma=4, max_new_tokens=24, ignore_eos=True)
    plain = Generator.load(out, single_steps=True, config=dataclasses.replace(config, gamma=0))
    assert Generator.load(out, ngram=True, config=config).generate(IDS * 2).token_ids == \
        plain.generate(IDS * 2).token_ids


@pytest.mark.reference
def test_a_phi3_gguf_tokenizes_as_transformers(tmp_path: Path) -> None:
    """A sentencepiece Phi-3 GGUF: the prefix space from a normalizer, as transformers builds it."""
    from tokenizers import Tokenizer

    from tests.export.reference_source import reference_tokenizer
    from tests.gguf_models import make_tiny_gguf

    path = make_tiny_gguf(tmp_path / "phi3-spm.gguf", arch="phi3", tokenizer="llama")
    ours, ref = Tokenizer.from_str(load_source(path).tokenizer_json), reference_tokenizer(path)
    for text in ["the cat", "  two  spaces", "\\ttab and newline\\n", "ünïcode 🙂", ""]:
        assert ours.encode(text).ids == ref(text)["input_ids"], text


def test_the_summary_sees_a_gguf_rotating_part_of_each_head(tmp_path: Path) -> None:
    """What a first use reads before choosing the attention (resolve.source_artifact): the window and
    a rotary part short of the head, from a GGUF's header alone."""
    from specedge.export.source import inspect_source
    from tests.gguf_models import make_tiny_gguf

    partial = inspect_source(make_tiny_gguf(tmp_path / "p.gguf", arch="phi3", phi3={"rotary": 8, "window": 12}))
    whole = inspect_source(make_tiny_gguf(tmp_path / "w.gguf", arch="phi3"))
    assert (partial.partial_rotary, partial.sliding_window) == (True, 12)
    assert (whole.partial_rotary, whole.sliding_window) == (False, 0)


def test_a_bad_factor_list_names_the_list() -> None:
    """One line naming the list at fault, of the wrong length or not all positive: longrope's
    short_factor, or a file's rope frequency factors."""
    values = {**tiny_config("phi3"), "rope_parameters": {**LONGROPE, "short_factor": [1.0] * 3},
              "max_position_embeddings": 256}
    with pytest.raises(SpecEdgeError, match=r"must hold 8 factors in short_factor, one per rotary frequency"):
        checked_config(values, Path("config.json"))
    with pytest.raises(SpecEdgeError, match=r"rope_freq_factors.* must hold 8 factors, one per rotary frequency"):
        checked_config({**tiny_config("llama"), "rope_freq_factors": [1.0, 2.0]}, Path("x.gguf"))
    values["rope_parameters"]["short_factor"] = [1.0] * 7 + [-1.0]  # type: ignore[index]
    with pytest.raises(SpecEdgeError, match=r"must be positive finite numbers in short_factor\. "):
        checked_config(values, Path("config.json"))
    with pytest.raises(SpecEdgeError, match=r"rope_freq_factors.* must be positive finite numbers\. "):
        checked_config({**tiny_config("llama"), "rope_freq_factors": [1.0] * 7 + [0.0]}, Path("x.gguf"))
