"""Compiled QNN contexts on the HTP, on a tiny random model (their mechanics do not depend on the
model; it compiles in ~1 s where SmolLM2 takes ~1 min a width): a context is written on a graph's
first load and reloaded by the next session with the same logits, and `export --contexts shared`
writes one binary for every width."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

from specedge.runtime import OnnxModel, qnn
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_qnn(htp: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    root = tmp_path_factory.mktemp("tiny-qnn")
    src = make_tiny_model(root / "src", "llama", seed=1)
    return export_model(src, root / "qnn", ExportSettings(quant="qdq", target="qnn", context=16, widths=(1, 2))).path


def test_a_context_binary_is_generated_and_reloaded(tiny_qnn: Path, capsys: pytest.CaptureFixture[str]) -> None:
    model = OnnxModel(tiny_qnn, provider="qnn")
    cache = model.new_cache()
    first = model.forward([5, 6], cache).logits.copy()
    assert "qnn: compiling model_s2.onnx for SoC 60" in capsys.readouterr().err
    ctx = qnn.context_dir(tiny_qnn, "60") / "model_s2_ctx.onnx"
    assert ctx.is_file() and len(list(ctx.parent.glob("model_s2_ctx*.bin"))) == 1
    del model
    gc.collect()  # drop the session: the next one loads the context
    capsys.readouterr()
    again = OnnxModel(tiny_qnn, provider="qnn")
    second = again.forward([5, 6], again.new_cache()).logits
    assert "loading the compiled context qnn_ctx/soc60/model_s2_ctx.onnx" in capsys.readouterr().err
    assert np.array_equal(first, second)


def test_a_shared_context_over_all_widths_is_one_binary(tiny_qnn: Path) -> None:
    from specedge.export.qnn_context import compile_contexts

    result = compile_contexts(tiny_qnn, "60", shared=True)
    assert "peak memory" in result.summary() and result.peak_rss_bytes > 0  # the compile says its own peak
    shared = qnn.context_dir(tiny_qnn, "60") / qnn.SHARED_DIR
    assert sorted(p.name for p in shared.glob("*.onnx")) == ["model_s1_ctx.onnx", "model_s2_ctx.onnx"]
    assert len(list(shared.glob("*.bin"))) == 1 and len(result.binaries) == 1
    # a shared context crashes a process that loads it on x86_64: the runtime loads it on the device only
    from specedge.runtime.engine.session import provider_setup

    assert provider_setup("qnn", tiny_qnn / "model_s2.onnx", machine="aarch64").qnn.how == "shared"
    assert provider_setup("qnn", tiny_qnn / "model_s2.onnx", machine="x86_64").qnn.how != "shared"
