"""Provider options as the ONNX Runtime documentation lists them, and what happens without a provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.errors import SpecEdgeError
from specedge.runtime.session import provider_setup, qnn_context_path, resolve_provider


def test_qnn_options(tmp_path: Path) -> None:
    graph = tmp_path / "model_s5.onnx"
    linux = provider_setup("qnn", graph, 5, 4096, platform="linux")
    assert linux.ort_name == "QNNExecutionProvider"
    assert linux.provider_options == {"backend_path": "libQnnHtp.so", "htp_performance_mode": "burst",
                                      "htp_graph_finalization_optimization_mode": "3",
                                      "enable_htp_fp16_precision": "1"}
    assert provider_setup("qnn", graph, platform="win32").provider_options["backend_path"] == "QnnHtp.dll"
    entries = linux.session_entries
    assert entries["session.disable_cpu_ep_fallback"] == "1" and entries["ep.share_ep_contexts"] == "1"
    assert entries["ep.context_enable"] == "1" and entries["ep.context_embed_mode"] == "0"
    assert entries["ep.context_file_path"] == str(tmp_path / "qnn_ctx" / "model_s5_ctx.onnx")
    assert linux.graph == graph
    # after the first load the cached context model is what gets loaded, and not written again
    qnn_context_path(graph).parent.mkdir()
    qnn_context_path(graph).write_bytes(b"ctx")
    again = provider_setup("qnn", graph, platform="linux")
    assert again.graph == qnn_context_path(graph) and "ep.context_enable" not in again.session_entries


def test_dml_options(tmp_path: Path) -> None:
    setup = provider_setup("dml", tmp_path / "model.onnx", 5, 4096)
    assert setup.ort_name == "DmlExecutionProvider"
    assert setup.mem_pattern is False
    assert setup.free_dims == {"S": 5, "R": 5, "T": 4096}


def test_cpu_options(tmp_path: Path) -> None:
    setup = provider_setup("cpu", tmp_path / "model.onnx")
    assert setup.ort_name == "CPUExecutionProvider" and setup.mem_pattern and not setup.session_entries


@pytest.mark.parametrize(("provider", "package"), [("qnn", "onnxruntime-qnn"), ("dml", "onnxruntime-directml")])
def test_missing_provider_names_the_package_and_fallback_says_so(provider: str, package: str,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SpecEdgeError, match=package):
        resolve_provider(provider)
    assert resolve_provider(provider, fallback="cpu") == "cpu"
    assert "running on cpu as --fallback asks" in capsys.readouterr().err


def test_threads_stop_spinning_between_passes(tiny_llama) -> None:
    """Target and draft alternate: neither session's threads may spin through the other's pass."""
    from specedge.runtime import OnnxModel
    from specedge.runtime.session import _session_options, provider_setup

    opts = _session_options(provider_setup("cpu", tiny_llama[1] / "model.onnx"), threads=2)
    assert opts.get_session_config_entry("session.force_spinning_stop") == "1"
    assert opts.intra_op_num_threads == 2
    assert opts.get_session_config_entry("session.set_denormal_as_zero") == "1"
    model = OnnxModel(tiny_llama[2], threads=1)
    assert model.forward([1, 2, 3], model.new_cache()).logits.shape[0] == 3


def test_a_session_that_runs_alone_keeps_spinning(tiny_llama) -> None:
    from specedge.runtime import Generator

    def stops(model) -> str:
        return model.session.get_session_options().get_session_config_entry("session.force_spinning_stop")

    speculative = Generator.load(tiny_llama[1], draft=tiny_llama[2])
    assert stops(speculative.target) == "1" and stops(speculative.drafter.model) == "1"
    assert stops(Generator.load(tiny_llama[1]).target) == "0"  # plain decoding: nothing to share the cores with
