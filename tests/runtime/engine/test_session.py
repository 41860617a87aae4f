"""Provider options as the ONNX Runtime documentation lists them, and what happens without a provider."""

from __future__ import annotations

from pathlib import Path

import pytest

from specedge.core.errors import SpecEdgeError
from specedge.runtime import qnn
from specedge.runtime.engine.session import QNN_CPU_FALLBACK_ENV, provider_setup, qnn_context_path, resolve_provider


def test_qnn_options(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qnn.SOC_ENV, raising=False)
    graph = tmp_path / "model_s5.onnx"
    graph.write_bytes(b"graph")
    linux = provider_setup("qnn", graph, 5, 4096, platform="linux", cpu_fallback=False)
    assert linux.ort_name == "QNNExecutionProvider"
    assert linux.provider_options == {"backend_path": "libQnnHtp.so", "soc_model": "60",
                                      "htp_performance_mode": "burst",
                                      "htp_graph_finalization_optimization_mode": "3",
                                      "enable_htp_fp16_precision": "1"}
    assert provider_setup("qnn", graph, platform="win32").provider_options["backend_path"] == "QnnHtp.dll"
    assert provider_setup("qnn", graph, soc="snapdragon-8-gen-3").provider_options["soc_model"] == "57"
    entries = linux.session_entries
    assert entries["session.disable_cpu_ep_fallback"] == "1" and "ep.share_ep_contexts" not in entries
    assert entries["ep.context_enable"] == "1" and entries["ep.context_embed_mode"] == "0"
    assert Path(entries["ep.context_file_path"]).name == "model_s5_ctx.onnx"  # written aside, then moved in
    assert linux.graph == graph and linux.qnn.how == "compile"
    assert linux.qnn.write == tmp_path / "qnn_ctx" / "soc60" / "model_s5_ctx.onnx" == qnn_context_path(graph)
    # after the first load the cached context model is what gets loaded, and not written again
    folder = qnn_context_path(graph).parent
    folder.mkdir(parents=True)
    qnn_context_path(graph).write_bytes(b"ctx")
    qnn.record_sources(folder, [graph], "60")
    again = provider_setup("qnn", graph, platform="linux")
    assert again.graph == qnn_context_path(graph) and "ep.context_enable" not in again.session_entries
    assert again.qnn.how == "context" and "loading the compiled context qnn_ctx/soc60/model_s5_ctx.onnx" in \
        again.qnn.message
    graph.write_bytes(b"re-exported")  # a context compiled from another graph is not loaded
    assert provider_setup("qnn", graph).qnn.how == "compile"
    # nodes the HTP does not take may run on the CPU only when asked; such a graph is not cached
    monkeypatch.setenv(QNN_CPU_FALLBACK_ENV, "1")
    allowed = provider_setup("qnn", graph)
    assert allowed.session_entries["session.disable_cpu_ep_fallback"] == "0"
    assert "ep.context_enable" not in allowed.session_entries


def test_shared_contexts_load_only_on_the_device(tmp_path: Path) -> None:
    graph = tmp_path / "model_s1.onnx"
    graph.write_bytes(b"graph")
    shared = qnn.context_dir(tmp_path, "60") / qnn.SHARED_DIR
    shared.mkdir(parents=True)
    (shared / "model_s1_ctx.onnx").write_bytes(b"ctx")
    qnn.record_sources(shared, [graph], "60")
    device = provider_setup("qnn", graph, machine="aarch64")
    assert device.qnn.how == "shared" and device.graph == shared / "model_s1_ctx.onnx"
    assert device.session_entries["ep.share_ep_contexts"] == "1"
    x86 = provider_setup("qnn", graph, machine="x86_64")  # loading it there would crash the process
    assert x86.qnn.how == "compile" and x86.graph == graph and "ep.share_ep_contexts" not in x86.session_entries
    assert "does not load on x86_64" in x86.qnn.message
    own = qnn.context_dir(tmp_path, "60")
    (own / "model_s1_ctx.onnx").write_bytes(b"ctx")
    qnn.record_sources(own, [graph], "60")
    assert provider_setup("qnn", graph, machine="x86_64").qnn.how == "context"


def test_soc_names(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(qnn.SOC_ENV, raising=False)
    assert qnn.resolve_soc("60") == "60" and qnn.resolve_soc("SM8650") == "57"
    assert qnn.resolve_soc("snapdragon-x-elite") == "60" and qnn.resolve_soc("snapdragon-8-gen-3") == "57"
    with pytest.raises(SpecEdgeError, match="unknown QNN SoC 'nokia'"):
        qnn.resolve_soc("nokia")
    assert qnn.choose_soc(None, tmp_path) == "60"
    qnn.write_artifact_soc(tmp_path, "57")  # exported for a phone: its SoC unless one is named
    assert qnn.choose_soc(None, tmp_path) == "57" and qnn.choose_soc("43", tmp_path) == "43"
    monkeypatch.setenv(qnn.SOC_ENV, "69")
    assert qnn.choose_soc(None, tmp_path) == "69"


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
                                                                 capsys: pytest.CaptureFixture[str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(qnn, "available", lambda: False)  # as where onnxruntime-qnn is not installed
    with pytest.raises(SpecEdgeError, match=package):
        resolve_provider(provider)
    assert resolve_provider(provider, fallback="cpu") == "cpu"
    assert "running on cpu as --fallback asks" in capsys.readouterr().err


def test_threads_stop_spinning_between_passes(tiny_llama) -> None:
    """Target and draft alternate: neither session's threads may spin through the other's pass."""
    from specedge.runtime import OnnxModel
    from specedge.runtime.engine.session import provider_setup, session_options

    opts = session_options(provider_setup("cpu", tiny_llama[1] / "model.onnx"), threads=2)
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
