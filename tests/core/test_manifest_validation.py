"""A manifest that lies is refused with one clear error naming the field, before anything is allocated."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import MANIFEST_NAME, load_manifest, sha256_file
from specedge.runtime.engine.kv_cache import KVCache
from specedge.runtime.engine.model import OnnxModel
from tests.tiny_models import byte_tokenizer

Edit = Callable[[dict[str, Any]], None]


@pytest.fixture
def artifact(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    """A copy of the tiny target, free to damage."""
    art = tmp_path / "art"
    shutil.copytree(tiny_llama[1], art)
    return art


def edit_manifest(art: Path, edit: Edit) -> None:
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    edit(manifest)
    (art / MANIFEST_NAME).write_text(json.dumps(manifest))


def reseal(art: Path, name: str) -> None:
    """Record a file's new size and checksum in the manifest, as a forger would."""
    def update(m: dict[str, Any]) -> None:
        m["files"][name] = {"size": (art / name).stat().st_size, "sha256": sha256_file(art / name)}

    edit_manifest(art, update)


def setter(path: str, value: object) -> Edit:
    """An edit setting manifest[a][b]... = value, for path "a.b"."""
    *parents, last = path.split(".")

    def edit(m: dict[str, Any]) -> None:
        for key in parents:
            m = m[key]
        m[last] = value

    return edit


def remover(name: str) -> Edit:
    return lambda m: m.pop(name)


CASES: dict[str, tuple[Edit, str]] = {
    "vocab as text": (setter("vocab_size", "260"), "vocab_size"),
    "vocab absurd": (setter("vocab_size", 2**40), "vocab_size"),
    "kv heads absurd": (setter("num_kv_heads", 10**9), "num_kv_heads"),
    "kv heads not dividing": (setter("num_kv_heads", 3), "num_kv_heads"),
    "layers a float": (setter("num_layers", 2.0), "num_layers"),
    "head_dim absurd": (setter("head_dim", 1 << 30), "head_dim"),
    "context zero": (setter("context", 0), "context"),
    "context absurd": (setter("context", 1 << 40), "context"),
    "width beyond context": (setter("widths", [1, 5, 10**6]), "widths"),
    "no width 1": (setter("widths", [2, 5]), "widths"),
    "eos outside vocab": (setter("eos_token_ids", [10**6]), "eos_token_ids"),
    "bos negative": (setter("bos_token_id", -1), "bos_token_id"),
    "bool as int": (setter("head_vocab", True), "head_vocab"),
    "in place as text": (setter("kv_in_place", "yes"), "kv_in_place"),
    "unknown attention": (setter("attention", "magic"), "attention"),
    "unknown kv dtype": (setter("kv_dtype", "float64"), "kv_dtype"),
    "bad fingerprint": (setter("tokenizer_fingerprint", "not hex"), "tokenizer_fingerprint"),
    "quant method": (setter("quantization.method", "evil"), "quantization.method"),
    "quant bits": (setter("quantization.bits", "8"), "quantization.bits"),
    "file size as text": (lambda m: m["files"]["model.onnx"].update(size="1"), "files.model.onnx.size"),
    "short sha256": (lambda m: m["files"]["model.onnx"].update(sha256="abc"), "files.model.onnx.sha256"),
    "cost as text": (setter("costs.matmul_bytes", "many"), "costs.matmul_bytes"),
    "unknown cost": (setter("costs.free_lunch", 1), "costs.free_lunch"),
    "missing field": (remover("context"), "context"),
    "unknown field": (setter("run_this", "rm -rf ~"), "run_this"),
    "template not text": (setter("chat_template", ["x"]), "chat_template"),
    "files not listing the tokenizer": (lambda m: m["files"].pop("tokenizer.json"), "tokenizer.json"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_field_of_the_wrong_type_or_range_is_named(artifact: Path, case: str) -> None:
    edit, field = CASES[case]
    edit_manifest(artifact, edit)
    with pytest.raises(SpecEdgeError, match="not a valid manifest") as e:
        load_manifest(artifact, verify=False)
    assert field in str(e.value) and "re-export" in str(e.value)


GRAPHS = {
    "parent folder": "../outside.onnx",
    "absolute path": "/etc/passwd",
    "subfolder": "sub/model.onnx",
    "unlisted file": "other.onnx",
}


@pytest.mark.parametrize("case", list(GRAPHS))
def test_the_graph_must_be_a_listed_file_inside_the_artifact(artifact: Path, case: str) -> None:
    name = GRAPHS[case]
    edit_manifest(artifact, setter("graph", name))
    with pytest.raises(SpecEdgeError, match="graph") as e:
        load_manifest(artifact)
    assert name in str(e.value)


def test_static_graphs_must_be_listed_files_too(artifact: Path) -> None:
    edit_manifest(artifact, setter("graphs", {"5": "../../model_s5.onnx"}))
    with pytest.raises(SpecEdgeError, match=r"graphs\.5"):
        load_manifest(artifact)
    edit_manifest(artifact, setter("graphs", {"five": "model.onnx"}))
    with pytest.raises(SpecEdgeError, match="graphs"):
        load_manifest(artifact)


def test_a_listed_file_may_not_name_a_path_outside(artifact: Path) -> None:
    edit_manifest(artifact, lambda m: m["files"].update({"../secret": {"size": 1, "sha256": "0" * 64}}))
    with pytest.raises(SpecEdgeError, match="'files'") as e:
        load_manifest(artifact)
    assert "../secret" in str(e.value)


def test_a_link_out_of_the_artifact_is_refused(artifact: Path, tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere.json"
    shutil.copy(artifact / "tokenizer.json", outside)
    (artifact / "tokenizer.json").unlink()
    os.symlink(outside, artifact / "tokenizer.json")  # same bytes, so its checksum still matches
    with pytest.raises(SpecEdgeError, match="outside the artifact"):
        load_manifest(artifact)


def test_a_swapped_tokenizer_with_resealed_checksums_is_refused(artifact: Path) -> None:
    tok = byte_tokenizer()
    tok.add_special_tokens(["<|tool|>"])  # one more token: other ids, same fingerprint claimed
    tok.save(str(artifact / "tokenizer.json"))
    reseal(artifact, "tokenizer.json")
    with pytest.raises(SpecEdgeError, match="fingerprint") as e:
        load_manifest(artifact)
    assert "tokenizer.json" in str(e.value)


@pytest.mark.parametrize("content", ["[1, 2]", "{not json", "\udcff"])
def test_a_manifest_that_is_not_an_object_is_refused(artifact: Path, content: str) -> None:
    (artifact / MANIFEST_NAME).write_bytes(content.encode("utf-8", "surrogateescape"))
    with pytest.raises(SpecEdgeError, match="not a valid manifest"):
        load_manifest(artifact)


def test_an_absurd_cache_is_refused_before_it_is_allocated(artifact: Path) -> None:
    """Within every field's range, but 2 TiB of cache: refused against this machine's memory."""
    edit_manifest(artifact, lambda m: m.update(num_layers=512, num_heads=1024, num_kv_heads=1024, head_dim=1024))
    model = OnnxModel(artifact)  # the graph is loaded from its own, unchanged file
    with pytest.raises(SpecEdgeError, match=r"KV cache .* needs .* GiB") as e:
        model.new_cache()
    assert "--context" in str(e.value)


def test_a_cache_larger_than_available_memory_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.runtime.engine import kv_cache

    monkeypatch.setattr(kv_cache, "available_memory", lambda: 1 << 20)
    KVCache(2, 2, 16, 4096, bucket=256)  # 256 slots: 64 KiB, fits
    with pytest.raises(SpecEdgeError, match="available"):
        KVCache(2, 2, 16, 4096, bucket=256, static=True)  # all 4096 slots: 2 MiB


def test_the_exported_manifest_passes(artifact: Path) -> None:
    manifest = load_manifest(artifact)
    assert manifest.context == 64 and manifest.files
