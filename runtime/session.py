"""ONNX Runtime sessions for an execution provider, with clear errors for missing ones."""

from __future__ import annotations

import os
from pathlib import Path

import onnxruntime as ort

from specedge.errors import SpecEdgeError

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "dml": "DmlExecutionProvider",
    "qnn": "QNNExecutionProvider",
}
WHERE_TO_GET = {
    "dml": "install onnxruntime-directml (Windows x64)",
    "qnn": "install onnxruntime-qnn (Windows ARM64/x64, Linux aarch64)",
}


def physical_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def check_provider(provider: str) -> str:
    """The ONNX Runtime name of a provider this build has, or a one-line error."""
    if provider not in PROVIDERS:
        raise SpecEdgeError(f"unknown provider '{provider}'", f"use one of {', '.join(PROVIDERS)}")
    name = PROVIDERS[provider]
    if name not in ort.get_available_providers():
        raise SpecEdgeError(f"this onnxruntime build has no {name}",
                            WHERE_TO_GET.get(provider, "reinstall onnxruntime"))
    return name


def create_session(graph: Path, provider: str = "cpu", threads: int | None = None) -> ort.InferenceSession:
    name = check_provider(provider)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.intra_op_num_threads = threads or physical_cores()
    opts.inter_op_num_threads = 1
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.log_severity_level = 3
    try:
        return ort.InferenceSession(str(graph), opts, providers=[name])
    except Exception as e:  # onnxruntime raises its own exception types for bad graphs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecEdgeError(f"onnxruntime could not load {graph}: {first[:300]}",
                            "re-export the model with `specedge export`") from None
