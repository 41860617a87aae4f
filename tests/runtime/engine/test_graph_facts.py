"""A manifest that claims another vocabulary or context than its graph was built for is refused at
load, in one line, before a pass fails inside ONNX Runtime; the graph is read without onnx."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import onnx
import pytest

from specedge.core.errors import DamagedArtifactError
from specedge.core.manifest import MANIFEST_NAME
from specedge.runtime.engine.graph_facts import parse_graph, read_graph
from specedge.runtime.engine.model import OnnxModel


def copy_of(tiny_llama: tuple[Path, Path, Path], which: str, tmp_path: Path) -> Path:
    art = tmp_path / which
    shutil.copytree(tiny_llama[1 if which == "target" else 2], art)
    return art


def edit_manifest(art: Path, **values: Any) -> None:
    manifest = json.loads((art / MANIFEST_NAME).read_text())
    manifest.update(values)
    (art / MANIFEST_NAME).write_text(json.dumps(manifest))


def shape(value: onnx.ValueInfoProto) -> tuple[int | str, ...]:
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in value.type.tensor_type.shape.dim)


@pytest.mark.parametrize("which", ["target", "draft"])  # exact attention, and fused (GroupQueryAttention)
def test_the_reader_sees_what_onnx_sees(tiny_llama: tuple[Path, Path, Path], which: str) -> None:
    graph = tiny_llama[1 if which == "target" else 2] / "model.onnx"
    facts = read_graph(graph)
    proto = onnx.load(str(graph), load_external_data=False)
    assert facts is not None
    assert facts.initializers == {t.name: tuple(t.dims) for t in proto.graph.initializer}
    assert facts.inputs == {v.name: shape(v) for v in proto.graph.input}
    assert facts.outputs == {v.name: shape(v) for v in proto.graph.output}
    assert facts.outputs["logits"] == (1, "R", 260) and facts.initializers["rope.cos_cache"][0] == 64


def test_the_reader_takes_packed_dims_and_negative_values() -> None:
    tensor = b"\x0a\x02\x03\x01" + b"\x42\x01w"  # dims [3, 1] packed (field 1, wire type 2); name "w" (field 8)
    graph = b"\x2a" + bytes([len(tensor)]) + tensor  # an initializer (field 5)
    model = b"\x3a" + bytes([len(graph)]) + graph  # the graph (field 7)
    proto = onnx.ModelProto()
    proto.ParseFromString(model)
    assert list(proto.graph.initializer[0].dims) == [3, 1]
    assert parse_graph(model).initializers == {"w": (3, 1)}
    out = onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [-1, "N"])
    blob = onnx.helper.make_model(onnx.helper.make_graph([], "g", [], [out])).SerializeToString()
    assert parse_graph(blob).outputs == {"y": (-1, "N")}


@pytest.mark.parametrize("blob", [b"", b"\xff", b"\x3a\x05ab", b"\x3a\x02\x2a\xff"])
def test_a_graph_that_cannot_be_read_is_left_to_onnxruntime(tmp_path: Path, blob: bytes) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(blob)
    assert read_graph(path) is None


CASES = {  # manifest edit -> words of the one-line error
    "vocab_size 1000": ({"vocab_size": 1000}, ("model.onnx", "logits score 260 tokens", "vocab_size", "1000")),
    "context 1024": ({"context": 1024}, ("model.onnx", "rotary tables cover 64 positions", "context 1024")),
    "context 32": ({"context": 32}, ("cover 64 positions", "context 32")),
}


@pytest.mark.parametrize("which", ["target", "draft"])
@pytest.mark.parametrize("case", list(CASES))
def test_a_manifest_that_contradicts_its_graph_is_refused_at_load(tiny_llama: tuple[Path, Path, Path],
                                                                  tmp_path: Path, which: str, case: str) -> None:
    edit, words = CASES[case]
    art = copy_of(tiny_llama, which, tmp_path)
    edit_manifest(art, **edit)
    with pytest.raises(DamagedArtifactError) as e:
        OnnxModel(art)
    message = str(e.value)
    assert all(w in message for w in (*words, "re-export", "specedge export")), message
    assert "\n" not in message


def test_a_head_vocab_that_contradicts_the_graph_is_refused(tiny_llama: tuple[Path, Path, Path],
                                                            tmp_path: Path) -> None:
    art = copy_of(tiny_llama, "draft", tmp_path)
    edit_manifest(art, head_vocab=100)  # the graph scores all 260 ids
    with pytest.raises(DamagedArtifactError, match="logits score 260 tokens, not the 100 of the manifest's head_vocab"):
        OnnxModel(art)


def test_a_vocab_size_beyond_the_embedding_is_refused(tiny_llama: tuple[Path, Path, Path], tmp_path: Path) -> None:
    art = copy_of(tiny_llama, "draft", tmp_path)
    edit_manifest(art, vocab_size=1000, head_vocab=260)  # the logits agree; the embedding holds 260 ids
    with pytest.raises(DamagedArtifactError, match="embedding holds 260 tokens, fewer than the manifest's vocab_size"):
        OnnxModel(art)
