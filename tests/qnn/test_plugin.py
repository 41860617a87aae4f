"""The onnxruntime-qnn plugin registered and driven as specedge does it, on small graphs."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from specedge.core.errors import SpecEdgeError
from specedge.runtime import qnn
from specedge.runtime.engine.session import available, create_session


def small_graph(path: Path, *ops: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8])
    names = ["x", *[f"t{i}" for i in range(len(ops) - 1)], "y"]
    nodes = [helper.make_node(op, [names[i]], [names[i + 1]], name=f"{op.lower()}_{i}") for i, op in enumerate(ops)]
    model = helper.make_model(helper.make_graph(nodes, "g", [x], [y]), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, path)
    return path


def test_the_plugin_registers_and_doctor_shows_it(htp: None, tmp_path: Path) -> None:
    assert available("qnn")
    assert qnn.ep_devices() and all(d.ep_name == "QNNExecutionProvider" for d in qnn.ep_devices())
    assert Path(qnn.backend_path()).is_file()
    out = subprocess.run([sys.executable, "-m", "specedge", "doctor"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "SPECEDGE_CACHE": str(tmp_path)})
    assert out.returncode == 0, out.stderr
    assert "QNNExecutionProvider     available" in out.stdout
    assert "device: QNNExecutionProvider (Qualcomm)" in out.stdout and "libQnnHtp" in out.stdout


def test_a_graph_runs_on_the_htp_and_its_context_is_cached_and_reloaded(htp: None, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    graph = small_graph(tmp_path / "model_s1.onnx", "Relu", "Sigmoid")
    x = np.linspace(-2, 2, 32, dtype=np.float32).reshape(1, 4, 8)
    first = create_session(graph, "qnn")
    assert first.get_providers()[0] == "QNNExecutionProvider"
    assert create_session(graph, "qnn") is first  # one session per graph while it is in use
    assert "qnn: compiling model_s1.onnx for SoC 60" in capsys.readouterr().err
    ctx = tmp_path / "qnn_ctx" / "soc60" / "model_s1_ctx.onnx"
    assert ctx.is_file() and list(ctx.parent.glob("*.bin")) and not list(ctx.parent.glob(".staging-*"))
    compiled = first.run(None, {"x": x})[0]
    del first
    gc.collect()
    again = create_session(graph, "qnn")
    assert "loading the compiled context qnn_ctx/soc60/model_s1_ctx.onnx" in capsys.readouterr().err
    assert np.array_equal(again.run(None, {"x": x})[0], compiled)
    np.testing.assert_allclose(compiled, 1 / (1 + np.exp(-np.maximum(x, 0))), atol=2e-3)  # fp16 on the HTP


def test_a_graph_that_would_fall_back_names_its_nodes(htp: None, tmp_path: Path) -> None:
    graph = small_graph(tmp_path / "model_s1.onnx", "Relu", "Celu", "Sigmoid")
    with pytest.raises(SpecEdgeError) as err:
        create_session(graph, "qnn")
    assert "1 nodes of model_s1.onnx would run on the CPU, not QNN's HTP backend: celu_1 (Celu)" in str(err.value)
    assert "\n" not in str(err.value) and not list((tmp_path / "qnn_ctx" / "soc60").glob("*"))


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3_text", "phi3"])  # q/k norms, windows, gelu too
def test_export_compiles_contexts_for_a_soc_and_the_runtime_loads_them(htp: None, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str],
                                                                       arch: str) -> None:
    from specedge.cli import main
    from specedge.runtime import OnnxModel
    from tests.tiny_models import make_tiny_model

    src = make_tiny_model(tmp_path / "src", arch, seed=1)
    out = tmp_path / "qnn"
    assert main(["export", "--model", str(src), "--out", str(out), "--for", "qnn", "--context", "64",
                 "--widths", "1,2", "--soc", "snapdragon-x-elite", "--contexts", "both"]) == 0
    printed = capsys.readouterr().out
    assert "for SoC 60 (SC8380XP" in printed and "compiled shared-weights QNN contexts for widths [1, 2]" in printed
    soc = out / "qnn_ctx" / "soc60"
    assert len(list((soc / "shared").glob("*.bin"))) == 1 and len(list(soc.glob("*.bin"))) == 2
    model = OnnxModel(out, provider="qnn")
    logits = model.forward([1, 2], model.new_cache()).logits
    err = capsys.readouterr().err
    assert "loading the compiled context qnn_ctx/soc60/model_s2_ctx.onnx" in err and "compiling" not in err
    assert "shared-weights context in qnn_ctx/soc60/shared does not load on x86_64" in err
    cpu = OnnxModel(out).forward([1, 2], OnnxModel(out).new_cache()).logits
    # fp16 activations and int4 blocks on the HTP: measured 0.16 of logits up to 3.5 (qwen2), 0.06 of 4.3
    # (qwen3), 0.29 of 7.0 (gemma3)
    assert np.abs(logits - cpu).max() < 0.06 * np.abs(cpu).max()


def test_soc_and_contexts_are_for_qnn_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from specedge.cli import main

    assert main(["export", "--model", str(tmp_path), "--out", str(tmp_path / "x"), "--soc", "60"]) == 2
    assert "--soc and --contexts are for QNN exports" in capsys.readouterr().err
    assert main(["export", "--model", str(tmp_path), "--out", str(tmp_path / "x"), "--for", "qnn",
                 "--soc", "nokia"]) == 2
    assert "unknown QNN SoC 'nokia'" in capsys.readouterr().err
