"""The QNN tests run Qualcomm's own toolchain: onnxruntime-qnn's HTP backend, which on x86_64 is the
Hexagon compiler and simulator. They skip, saying why, where its wheel is not installed.

A graph compiles in ~40-70 s (SmolLM2-135M), so each graph is compiled once per session
(`compile_once`): its session is made from the graph with CPU fallback disabled, which writes the
per-width context into the artifact's `qnn_ctx/soc<N>/` with the graph's sha256 in `sources.json`,
where every later session of that graph loads it. The nodes each provider took and what the runtime
said are kept per graph checksum for the tests that check them."""

from __future__ import annotations

import contextlib
import io
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def htp() -> None:
    from specedge.runtime import qnn

    if qnn.plugin() is None:
        pytest.skip("onnxruntime-qnn is not installed (wheels: Windows ARM64/x64, Linux x86_64, Python >= 3.11); "
                    "pip install 'specedge[qnn]'")
    if not qnn.available():
        pytest.skip("onnxruntime-qnn is installed but its plugin library did not register with this onnxruntime")


@dataclass(frozen=True)
class Compiled:
    """What compiling one graph gave: the nodes each execution provider took, and what was said."""

    graph: Path
    nodes: dict[str, int]
    log: str


_COMPILED: dict[str, Compiled] = {}  # graph sha256 -> its compile this session


def compile_once(graph: Path) -> Compiled:
    """Compile `graph` for the HTP (fallback disabled: a node the HTP cannot run fails it) unless a
    graph with its checksum was compiled this session; its context is left where the runtime loads it."""
    from specedge.runtime import qnn
    from specedge.runtime.engine.session import create_session

    digest = qnn.graph_digest(graph)
    if digest not in _COMPILED:
        said = io.StringIO()
        with contextlib.redirect_stderr(said):
            session = create_session(graph, "qnn")
        sys.stderr.write(said.getvalue())
        _COMPILED[digest] = Compiled(graph, qnn.node_assignment(session), said.getvalue())
        del session
    return _COMPILED[digest]


# The smallest contexts the tests allow. int4: the 8 teacher-forced positions. QDQ: also a 15-token
# prompt and 8 tokens after it, but the export calibrates on texts cut to the context, the longest
# 93 tokens: at a smaller context it quantizes differently (measured at 32: logits up to 2.1 apart
# from the context-256 export's on the CPU provider, and 2.02 from the HTP's, over the bound).
QDQ_CONTEXT = 96
INT4_CONTEXT = 32


def export_for_qnn(gguf: Path, out: Path, quant: str, context: int) -> Path:
    from specedge.export.artifact import export_model
    from specedge.export.settings import ExportSettings

    return export_model(gguf, out, ExportSettings(quant=quant, target="qnn", context=context, widths=(1, 2))).path


@pytest.fixture(scope="session")
def smollm2_qnn(htp: None, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as QDQ for QNN, both widths compiled: the width-2 graph every pass of 1 or 2 rows runs."""
    folder = export_for_qnn(smollm2_gguf, tmp_path_factory.mktemp("qnn") / "smollm2-qnn", "qdq", QDQ_CONTEXT)
    for name in ("model_s1.onnx", "model_s2.onnx"):
        compile_once(folder / name)
    return folder


@pytest.fixture(scope="session")
def smollm2_qnn_int4(htp: None, smollm2_gguf: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 as int4 for QNN, its width-2 graph compiled."""
    folder = export_for_qnn(smollm2_gguf, tmp_path_factory.mktemp("qnn-int4") / "smollm2-qnn-int4", "int4",
                            INT4_CONTEXT)
    compile_once(folder / "model_s2.onnx")
    return folder
