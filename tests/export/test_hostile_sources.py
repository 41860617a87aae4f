"""A checkpoint is a hostile input until checked: every number its header gives is checked for type,
range and consistency with the tensors it holds before anything is allocated from it, with one
line naming the field and the file; no export succeeds whose artifact cannot load."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from tests.export.hostile_sources import HIDDEN, hf_copy, limited_memory, rewrite_safetensors_header, write_gguf

SETTINGS = ExportSettings(quant="fp32", context=64, widths=(1, 5))
ROOT = Path(__file__).resolve().parents[2]


def refused(src: Path, out: Path, *words: str) -> str:
    """The export of `src` fails with one SpecEdgeError naming each of `words`, leaving nothing
    (under a memory limit: believing a lying header must fail, not take the machine)."""
    with pytest.raises(SpecEdgeError) as e, limited_memory():
        export_model(src, out, SETTINGS)
    message = str(e.value)
    for word in words:
        assert word in message, message
    left = [p for p in out.parent.glob(f".{out.name}*") if p.suffix != ".lock"]  # the lock file stays, empty
    assert not out.exists() and not left, f"an export left {left} behind"
    return message


def test_a_sound_crafted_gguf_exports_and_loads(tmp_path: Path) -> None:
    """The control: the writer below makes a file that exports, so each refusal is its one lie."""
    art = export_model(write_gguf(tmp_path / "ok.gguf"), tmp_path / "art", SETTINGS).path
    assert load_manifest(art).num_layers == 2


def test_a_huge_layer_count_is_refused_under_a_memory_limit(tmp_path: Path) -> None:
    """A 450 KB file claiming 2^32-1 layers grew the export to 23.7 GB: now refused at once, in a
    process that may not take more than 2 GiB."""
    src = write_gguf(tmp_path / "layers.gguf", {"llama.block_count": (1 << 32) - 1})
    script = ("import resource, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))\n"
              "from pathlib import Path\nfrom specedge.core.errors import SpecEdgeError\n"
              "from specedge.export.artifact import export_model\nfrom specedge.export.settings import ExportSettings\n"
              "settings = ExportSettings(quant='fp32', context=64, widths=(1, 5))\n"
              "try:\n    export_model(Path(sys.argv[1]), Path(sys.argv[2]), settings)\n"
              "except SpecEdgeError as e:\n    print(e); sys.exit(3)\n")
    run = subprocess.run([sys.executable, "-c", script, str(src), str(tmp_path / "out")], capture_output=True,
                         text=True, timeout=120, cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 3, run.stderr[-2000:]
    assert "llama.block_count" in run.stdout and "4294967295" in run.stdout
    assert not (tmp_path / "out").exists()


def test_a_huge_hf_layer_count_is_refused(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    src = hf_copy(tiny_llama[0], tmp_path / "src", {"num_hidden_layers": 10**9})
    refused(src, tmp_path / "out", "num_hidden_layers", "1000000000", "config.json")


@pytest.mark.parametrize("fields, words", [
    ({"llama.attention.head_count": 0}, ("llama.attention.head_count", "outside")),
    ({"llama.attention.head_count_kv": 3}, ("llama.attention.head_count_kv", "does not divide")),
    ({"llama.attention.head_count": 5, "llama.attention.head_count_kv": 5, "llama.rope.dimension_count": None},
     ("llama.embedding_length", "do not divide")),
    ({"llama.block_count": 0}, ("llama.block_count", "outside")),
    ({"llama.rope.freq_base": "fast"}, ("llama.rope.freq_base", "must be a number")),
    ({"llama.attention.layer_norm_rms_epsilon": -1.0}, ("layer_norm_rms_epsilon", "outside")),
    ({"llama.rope.dimension_count": 15}, ("llama.rope.dimension_count", "odd")),
    ({"tokenizer.ggml.eos_token_id": 10**6}, ("tokenizer.ggml.eos_token_id", "1000000")),
    ({"general.alignment": "32"}, ("general.alignment", "not a power of two")),
    ({"tokenizer.ggml.tokens": [1, 2, 3]}, ("tokenizer.ggml.tokens", "list of")),
])
def test_a_lying_gguf_header_is_one_line_naming_the_field(tmp_path: Path, fields: dict, words: tuple) -> None:
    src = write_gguf(tmp_path / "bad.gguf", fields)
    refused(src, tmp_path / "out", str(src), *words)


@pytest.mark.parametrize("shapes, drop, words", [
    ({"blk.0.attn_q.weight": (HIDDEN, 32)}, (), ("blk.0.attn_q.weight", "[64, 32]", "[64, 64]")),
    ({"blk.1.attn_k.weight": (HIDDEN, 32)}, (), ("blk.1.attn_k.weight", "[64, 32]", "[32, 64]")),  # swapped
    ({"blk.0.ffn_down.weight": (0, 128)}, (), ("blk.0.ffn_down.weight", "[0, 128]")),
    ({"token_embd.weight": (64, HIDDEN)}, (), ("token_embd.weight", "[64, 64]")),  # fewer rows than tokens
    ({}, ("blk.1.ffn_up.weight",), ("model.layers.1.mlp.up_proj.weight", "no tensor")),
])
def test_a_tensor_its_config_does_not_describe_is_refused(tmp_path: Path, shapes: dict, drop: tuple,
                                                          words: tuple) -> None:
    src = write_gguf(tmp_path / "bad.gguf", shapes=shapes, drop=drop)
    refused(src, tmp_path / "out", *words)


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path: Path) -> None:
    """llama.vocab_size 64 with an embedding of 64 rows but 288 tokens: the artifact's tokenizer
    would give ids the model has no row for (the runtime refuses such an artifact at load)."""
    src = write_gguf(tmp_path / "bad.gguf", {"llama.vocab_size": 64},
                     shapes={"token_embd.weight": (64, HIDDEN), "output.weight": (64, HIDDEN)})
    refused(src, tmp_path / "out", "288 tokens", "vocabulary of 64")


def test_a_chat_template_beyond_the_manifests_limit_is_refused(tmp_path: Path) -> None:
    src = write_gguf(tmp_path / "bad.gguf", {"tokenizer.chat_template": "{{ 'x' }}" + " " * (2 << 20)})
    refused(src, tmp_path / "out", "chat template", "characters")


def test_hf_config_that_disagrees_with_its_tensors_is_refused(tiny_llama: tuple[Path, Path, Path],
                                                              tmp_path: Path) -> None:
    src = hf_copy(tiny_llama[0], tmp_path / "hidden", {"hidden_size": 48, "head_dim": 12})
    refused(src, tmp_path / "out", "model.embed_tokens.weight", "its config implies")
    src = hf_copy(tiny_llama[0], tmp_path / "vocab", {"vocab_size": 10**9})
    refused(src, tmp_path / "out2", "vocab_size", "1000000000")


@pytest.mark.parametrize("edit, words", [
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "shape": [-64]}}, ("model.norm.weight", "shape")),
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "shape": ["64"]}}, ("model.norm.weight", "shape")),
    (lambda h: {**h, "model.norm.weight": {"dtype": "F32", "shape": [64]}}, ("model.norm.weight", "data offsets")),
    (lambda h: [h], ("not an object",)),
    (lambda h: {**h, "model.norm.weight": {**h["model.norm.weight"], "shape": [65]}}, ("model.norm.weight", "bytes")),
])
def test_a_lying_safetensors_header_is_one_line(tiny_llama: tuple[Path, Path, Path], tmp_path: Path, edit,
                                                words: tuple) -> None:  # type: ignore[no-untyped-def]
    src = hf_copy(tiny_llama[0], tmp_path / "src")
    rewrite_safetensors_header(src / "model.safetensors", edit)
    refused(src, tmp_path / "out", "model.safetensors", *words)


def test_a_header_whose_tensors_overlap_is_refused(tmp_path: Path) -> None:
    """Every tensor pointing at the same bytes would let a small file claim many large tensors."""
    import struct

    src = write_gguf(tmp_path / "ok.gguf")
    from specedge.export.gguf_file import read_header

    g = read_header(src)
    data = bytearray(src.read_bytes())
    second = g.tensors["blk.0.attn_k.weight"]
    first = g.tensors["blk.0.attn_v.weight"]
    # the v weight's stored offset (relative to the data start) made the k weight's: same bytes
    start = min(t.offset for t in g.tensors.values())
    at = data.index(b"blk.0.attn_v.weight") + len("blk.0.attn_v.weight") + 4 + 8 * 2 + 4
    assert struct.unpack_from("<Q", data, at)[0] == first.offset - start
    struct.pack_into("<Q", data, at, second.offset - start)
    bad = tmp_path / "overlap.gguf"
    bad.write_bytes(bytes(data))
    with pytest.raises(SpecEdgeError, match="overlap"):
        read_header(bad)


def test_every_export_that_succeeds_loads(tmp_path: Path) -> None:
    """The manifest is checked by the runtime's own checks before it is written."""
    from specedge.export.artifact import check_before_writing
    from specedge.export.source import load_source

    src = write_gguf(tmp_path / "ok.gguf")
    art = export_model(src, tmp_path / "art", SETTINGS).path
    manifest = load_manifest(art)
    import dataclasses

    source = load_source(src)
    check_before_writing(manifest, source)
    with pytest.raises(SpecEdgeError, match="eos_token_ids"):
        check_before_writing(dataclasses.replace(manifest, eos_token_ids=(10**6,)), source)
    assert json.loads((art / "manifest.json").read_text())["num_layers"] == 2


def test_a_vocabulary_without_merges_still_has_its_lists_checked(tmp_path: Path) -> None:
    """A file without merges (a SentencePiece vocabulary has none) has its token types checked all
    the same, before a tokenizer is built from them."""
    src = write_gguf(tmp_path / "bad.gguf", {"tokenizer.ggml.merges": None, "tokenizer.ggml.token_type": ["x"] * 3})
    refused(src, tmp_path / "out", str(src), "tokenizer.ggml.token_type", "list of")
