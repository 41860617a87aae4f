"""QNN graphs whose float ops (fp16 on the HTP) stay inside fp16: RMSNorm rewritten to compute from
its row scaled into [-1, 1], and an export checker that names a tensor beyond fp16."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.checker import fp16_overflows
from specedge.export.fp16_safe import norm_inputs, prescale_exponent, safe_rms_norms
from specedge.export.onnx_writer import GraphWriter
from specedge.export.settings import ExportSettings
from tests.tiny_models import make_tiny_model

EPS = 1e-5


def rms_norm_graph(folder: Path) -> onnx.ModelProto:
    """x / sqrt(mean(x^2) + eps) * w, as DecoderBuilder.rms_norm writes it."""
    g = GraphWriter(folder / "m.data")
    g.input("x", TensorProto.FLOAT, [1, "S", 8])
    ms = g.op("ReduceMean", g.op("Pow", "x", g.const([2.0], np.float32)), g.const([-1]), keepdims=1)
    rms = g.op("Sqrt", g.op("Add", ms, g.const([EPS], np.float32)))
    g.op("Mul", g.op("Div", "x", rms), g.weight("w", np.linspace(0.5, 2, 8).astype(np.float32)), out="y")
    g.output("y", TensorProto.FLOAT, [1, "S", 8])
    return g.finish("norm")


def run(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]


def test_the_rewritten_norm_is_the_same_function_with_every_intermediate_inside_fp16(tmp_path: Path) -> None:
    model = rms_norm_graph(tmp_path)
    x = np.random.default_rng(0).normal(size=(1, 3, 8)).astype(np.float32)
    x[0, 0, 3] = 22_000.0  # a massive activation, as SmolLM2's residual stream carries at the first token
    x[0, 2] *= 1e-4  # and a row of tiny values
    expected = run(model, x)
    assert norm_inputs(model) == ["x"]
    assert safe_rms_norms(model, {"x": 22_000.0}) == 1
    ops = [n.op_type for n in model.graph.node]
    assert ops[:3] == ["Mul", "Abs", "ReduceMax"]  # prescaled by 2^-3, then by its row's max
    np.testing.assert_allclose(run(model, x), expected, rtol=1e-5, atol=1e-6)
    # the rewritten norm computed in fp16 throughout, as the HTP does
    x16 = x.astype(np.float16) * np.float16(2.0**-prescale_exponent(22_000.0))
    m = np.abs(x16).max(-1, keepdims=True)
    xn = x16 / m
    eps = (np.float16(np.sqrt(EPS) * 2.0**-prescale_exponent(22_000.0)) / m) ** 2
    y16 = xn / np.sqrt((xn * xn).mean(-1, keepdims=True, dtype=np.float16) + eps) * np.linspace(0.5, 2, 8)
    assert np.isfinite(y16).all() and np.abs(y16.astype(np.float32) - expected).max() < 0.01


def test_prescales_are_powers_of_two_that_keep_divisors_far_below_2_14() -> None:
    assert prescale_exponent(0.5) == 0 and prescale_exponent(4096.0) == 0
    assert prescale_exponent(22_479.0) == 3 and 22_479.0 / 8 <= 4096


def test_fp16_ranges_name_the_tensor_that_overflows(tmp_path: Path) -> None:
    model = rms_norm_graph(tmp_path)
    div = next(n for n in model.graph.node if n.op_type == "Div")
    problems = [str(p) for p in fp16_overflows({"x": 22_479.0, "pow_3": 5.05e8, div.input[1]: 20_000.0}, model)]
    assert problems[0].startswith("tensor pow_3: reaches |x| = 505,000,000 on calibration text, beyond fp16's 65,504")
    assert any(f"tensor {div.input[1]}: divides in" in p and "flushes to 0" in p for p in problems)
    assert len(problems) == 2  # the residual itself (22,479) fits twice over


def test_a_qnn_export_whose_ranges_overflow_fp16_stops_naming_the_tensor(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    from specedge.export import qdq

    real = qdq.float_ranges

    def inflated(graph, feeds, only=None):  # type: ignore[no-untyped-def]
        ranges = real(graph, feeds, only)
        return ranges if only is not None else {**ranges, "logits": 1e6}

    monkeypatch.setattr(qdq, "float_ranges", inflated)
    src = make_tiny_model(tmp_path / "src", "llama", seed=3)
    with pytest.raises(SpecEdgeError, match=r"tensor logits: reaches \|x\| = 1,000,000 on calibration text"):
        export_model(src, tmp_path / "qnn", ExportSettings(quant="qdq", context=64, widths=(1, 2), target="qnn"))
    assert not (tmp_path / "qnn").exists()


def test_qnn_exports_rewrite_every_norm_and_cpu_exports_none(tmp_path: Path) -> None:
    src = make_tiny_model(tmp_path / "src", "qwen2", seed=1)
    qnn = export_model(src, tmp_path / "qnn", ExportSettings(quant="qdq", context=64, widths=(1, 2), target="qnn")).path
    graph = onnx.load(str(qnn / "model_s1.onnx"), load_external_data=False)
    nodes = graph.graph.node
    norms = sum(1 for n in nodes if n.op_type == "ScatterElements") + 1  # 2 a layer (K and V; 2 norms) + the head
    assert sum(1 for n in nodes if n.name.endswith(".ReduceMax")) == norms
    squares = [n for n in nodes if n.name.endswith(".Square")]  # x̂ * x̂ of x scaled into [-1, 1], no Pow left
    assert len(squares) == norms and all(n.input[0] == n.input[1] and n.input[0].endswith(".xn") for n in squares)
    assert not any(n.op_type == "Pow" for n in nodes)
    cpu = export_model(src, tmp_path / "cpu", ExportSettings(quant="fp32", context=64, widths=(1, 2))).path
    assert not any(n.name.startswith("fp16safe") for n in onnx.load(str(cpu / "model.onnx")).graph.node)
