"""What can be checked of a graph for a provider that does not run here (DirectML) or runs slowly
(QNN's HTP simulator): the opset, the ops, static shapes, and 4-bit MatMulNBits graphs for QNN."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import load_manifest
from specedge.export.artifact import export_model
from specedge.export.checker import DML_MAX_OPSET, check_graph
from specedge.export.settings import ExportSettings
from specedge.runtime import OnnxModel
from tests.tiny_models import make_tiny_model

WIDTHS = (1, 2, 5)


@pytest.fixture(scope="module")
def tiny_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("checks") / "src", "qwen2", seed=1)


def graphs(folder: Path) -> dict[int, onnx.ModelProto]:
    return {width: onnx.load(str(folder / name), load_external_data=False)
            for width, name in load_manifest(folder).graphs.items()}


def logits(folder: Path, ids: list[int]) -> np.ndarray:
    model = OnnxModel(folder)
    return model.forward(ids, model.new_cache()).logits


def test_directml_graphs_are_opset_17_static_and_compute_what_the_cpu_graph_does(tiny_src: Path,
                                                                                 tmp_path: Path) -> None:
    dml = export_model(tiny_src, tmp_path / "dml", ExportSettings(quant="fp32", context=64, widths=WIDTHS,
                                                                  target="dml")).path
    cpu = export_model(tiny_src, tmp_path / "cpu", ExportSettings(quant="fp32", context=64, widths=WIDTHS)).path
    for width, model in graphs(dml).items():
        assert {o.version for o in model.opset_import if o.domain in ("", "ai.onnx")} == {DML_MAX_OPSET}, width
        assert check_graph(model, "dml") == []
        reduce_means = [n for n in model.graph.node if n.op_type == "ReduceMean"]
        assert reduce_means and all(len(n.input) == 1 for n in reduce_means)  # axes an attribute again, as in 17
    ids = [5, 9, 3, 7, 1]
    np.testing.assert_allclose(logits(dml, ids), logits(cpu, ids), atol=1e-4)


def test_the_directml_check_names_what_it_cannot_run() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    nodes = [helper.make_node("FastGelu", ["x"], ["g"], domain="com.microsoft", name="gelu"),
             helper.make_node("Relu", ["g"], ["y"], name="relu")]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]),
                              opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)])
    problems = [str(p) for p in check_graph(model, "dml")]
    assert "model: imports opset 21 of the ONNX domain; DirectML supports up to 17" in problems
    assert any(p.startswith("gelu: op com.microsoft:FastGelu is not an ONNX op") for p in problems)
    assert not any(p.startswith("relu") for p in problems)


def test_an_activation_beyond_fp16_stops_a_directml_export(tiny_src: Path, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.export import qdq

    real = qdq.float_ranges
    monkeypatch.setattr(qdq, "float_ranges", lambda graph, feeds, only=None: (
        real(graph, feeds, only) if only is not None else {**real(graph, feeds, only), "logits": 1e6}))
    with pytest.raises(SpecEdgeError, match=r"cannot run on DirectML: .*tensor logits: reaches \|x\| = 1,000,000"):
        export_model(tiny_src, tmp_path / "dml", ExportSettings(quant="fp32", context=64, widths=(1, 2), target="dml"))
    assert not (tmp_path / "dml").exists()


def test_qnn_int4_graphs_are_matmulnbits_static_and_equal_the_cpu_int4_export(tiny_src: Path, tmp_path: Path) -> None:
    """--for qnn --quant int4: the CPU export's 4-bit blocks (the HTP takes MatMulNBits with fp16
    activations whole), every shape fixed through them, every op in QNN's list; on the CPU provider
    the same logits as the CPU int4 export with exact attention and, as QNN's, a float embedding."""
    settings = ExportSettings(quant="int4", context=64, widths=WIDTHS, target="qnn")
    qnn = export_model(tiny_src, tmp_path / "qnn", settings).path
    for model in graphs(qnn).values():
        assert check_graph(model, "qnn") == []
        assert sum(n.op_type == "MatMulNBits" for n in model.graph.node) >= 7  # q/k/v/o, gate/up/down, head
        assert not any(n.op_type == "QuantizeLinear" for n in model.graph.node)
    cpu = export_model(tiny_src, tmp_path / "cpu", ExportSettings(quant="int4", context=64, widths=WIDTHS,
                                                                  float_embedding=True)).path
    ids = [5, 9, 3, 7, 1]
    np.testing.assert_allclose(logits(qnn, ids), logits(cpu, ids), atol=2e-3)


@pytest.mark.parametrize("quant", ["int8", "w8a8", "fp32"])
def test_qnn_refuses_weight_formats_the_htp_does_not_take(quant: str) -> None:
    with pytest.raises(SpecEdgeError, match="--for qnn takes int4"):
        ExportSettings(quant=quant, target="qnn").validate()
