"""Each family specedge exports from both formats (llama, qwen2, qwen3, gemma3, phi3): one tiny
checkpoint saved as a Hugging Face folder and as the GGUF file llama.cpp's converter makes of it
(its header, gguf's tensor names, and each family's conventions: llama's Q and K interleaved by
head, Gemma's norm weights stored as 1 + w, Phi-3's q/k/v and gate/up fused, tied heads left out)
decodes to the same logits and greedy tokens from either file."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.runtime import Generator, OnnxModel, SpecConfig
from tests.gguf_models import write_as_llama_cpp
from tests.tiny_models import VOCAB, byte_tokenizer, make_tiny_model, random_weights, tiny_config, write_tokenizer

IDS = [72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10, 35, 32, 97, 98, 99, 100]  # past every window
SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))
# Gemma 3 as llama.cpp reads its files: every sixth layer full (the others slide, with a rope base of
# 10000), scores scaled by the head size: a checkpoint of that shape (270M's and 1B's)
GEMMA = {"num_hidden_layers": 6, "query_pre_attn_scalar": 32,
         "layer_types": ["sliding_attention"] * 5 + ["full_attention"]}
FAMILIES = {"llama": {}, "qwen2": {}, "qwen3": {}, "gemma3_text": GEMMA, "phi3": {}}


def saved_both_ways(folder: Path, arch: str, seed: int = 3) -> tuple[Path, Path]:
    """(Hugging Face folder, GGUF file) of one random checkpoint: the same weights, written by
    tests/tiny_models.py and by llama.cpp's conventions (tests/gguf_models.py). Its byte-level
    vocabulary holds GPT-2's <|endoftext|>, as Qwen's and SmolLM's do: a GGUF's byte-level tokenizer
    is GPT2Tokenizer's, which adds that token where the file has none."""
    overrides = {"vocab_size": VOCAB + 1, **FAMILIES[arch]}
    tokenizer = byte_tokenizer()
    tokenizer.add_special_tokens(["<|endoftext|>"])
    hf = make_tiny_model(folder / "hf", arch, seed=seed, **overrides)
    write_tokenizer(hf, tokenizer)
    config = tiny_config(arch, **overrides)
    weights = random_weights(config, np.random.default_rng(seed))  # make_tiny_model's, drawn again
    return hf, write_as_llama_cpp(folder / f"{arch}.gguf", config, weights, tokenizer)


def last_logits(artifact: Path) -> np.ndarray:
    model = OnnxModel(artifact)
    return model.forward(IDS, model.new_cache()).logits


def greedy(artifact: Path) -> list[int]:
    return Generator.load(artifact, config=SpecConfig(gamma=0)).generate(IDS, max_new_tokens=16,
                                                                         ignore_eos=True).token_ids


@pytest.mark.parametrize("arch", list(FAMILIES))
def test_a_checkpoint_and_llama_cpps_gguf_of_it_decode_alike(tmp_path: Path, arch: str) -> None:
    hf, gguf = saved_both_ways(tmp_path, arch)
    from_hf = export_model(hf, tmp_path / "from-hf", SETTINGS).path
    from_gguf = export_model(gguf, tmp_path / "from-gguf", SETTINGS).path
    ref = last_logits(from_hf)
    assert np.abs(last_logits(from_gguf) - ref).max() < 1e-4 * np.abs(ref).max()
    assert greedy(from_gguf) == greedy(from_hf)


def test_a_llama_file_named_mistral_is_mistral_as_transformers_reads_it(tmp_path: Path) -> None:
    """llama.cpp writes Mistral's files with the llama architecture; transformers takes a file named
    exactly "mistral" for Mistral, any other name (a fine-tune's) for Llama. The export says which."""
    from specedge.export.source import load_source
    from tests.gguf_models import make_tiny_gguf

    kinds = {name: load_source(make_tiny_gguf(tmp_path / f"{name}.gguf", name=name)).config.architecture
             for name in ("mistral", "Mistral-7B-Instruct", "tiny")}
    assert kinds == {"mistral": "mistral", "Mistral-7B-Instruct": "llama", "tiny": "llama"}


def test_a_tensor_of_more_rows_than_one_read_has_the_values_gguf_reads(tmp_path: Path) -> None:
    """A large tensor (a big vocabulary's embedding) is read in slices of rows: its values are the
    ones gguf's own reader dequantizes from the whole tensor, plain and quantized."""
    import gguf

    from specedge.export.gguf_file import read_header
    from specedge.export.gguf_source import ROWS_PER_READ, read_tensor

    values = np.random.default_rng(0).standard_normal((ROWS_PER_READ + 40, 32)).astype(np.float32)
    q8 = gguf.quants.quantize(values, gguf.GGMLQuantizationType.Q8_0)
    writer = gguf.GGUFWriter(str(tmp_path / "big.gguf"), "llama")
    writer.add_tensor("plain", values)
    writer.add_tensor("q8", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    g = read_header(tmp_path / "big.gguf")
    reader = gguf.GGUFReader(tmp_path / "big.gguf")
    whole = {t.name: gguf.quants.dequantize(t.data, t.tensor_type) for t in reader.tensors}
    for name in ("plain", "q8"):
        assert np.array_equal(read_tensor(g, g.tensors[name]), whole[name]), name
