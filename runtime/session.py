"""ONNX Runtime sessions per execution provider, with the options each provider's documentation
asks for, and one-line errors for providers this installation lacks.

- cpu: all graph optimizations, threads = cores, denormals flushed to zero; threads stop
  spinning when a pass returns, unless the session runs alone (plain decoding).
- qnn (Qualcomm HTP): backend library, burst performance mode, graph finalization level 3, fp16
  for float ops, no silent CPU fallback; the compiled graph is cached as an EP context model next
  to the artifact on first load and loaded from there after; contexts share weights across widths.
- dml (DirectML): memory pattern off, sequential execution, free dimensions fixed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
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
    "qnn": "install onnxruntime-qnn (Windows ARM64/x64, Linux aarch64; Python >= 3.11)",
}
QNN_CONTEXT_DIR = "qnn_ctx"


@dataclass(frozen=True)
class ProviderSetup:
    provider: str
    ort_name: str
    provider_options: dict[str, str] = field(default_factory=dict)
    session_entries: dict[str, str] = field(default_factory=dict)
    mem_pattern: bool = True
    free_dims: dict[str, int] = field(default_factory=dict)
    graph: Path | None = None  # what to load: the graph, or its cached EP context model


def physical_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def qnn_context_path(graph: Path) -> Path:
    return graph.parent / QNN_CONTEXT_DIR / f"{graph.stem}_ctx.onnx"


def provider_setup(provider: str, graph: Path, width: int | None = None, context: int | None = None,
                   platform: str = sys.platform) -> ProviderSetup:
    """The options a session on `provider` gets for `graph` (pure: no provider needs to be present)."""
    if provider not in PROVIDERS:
        raise SpecEdgeError(f"unknown provider '{provider}'", f"use one of {', '.join(PROVIDERS)}")
    name = PROVIDERS[provider]
    if provider == "qnn":
        ctx = qnn_context_path(graph)
        entries = {"session.disable_cpu_ep_fallback": "1", "ep.share_ep_contexts": "1"}
        if not ctx.is_file():  # first load: compile, then write the context model for next time
            entries |= {"ep.context_enable": "1", "ep.context_file_path": str(ctx), "ep.context_embed_mode": "0"}
        return ProviderSetup(provider, name, {
            "backend_path": "QnnHtp.dll" if platform == "win32" else "libQnnHtp.so",
            "htp_performance_mode": "burst",
            "htp_graph_finalization_optimization_mode": "3",
            "enable_htp_fp16_precision": "1",
        }, entries, graph=ctx if ctx.is_file() else graph)
    if provider == "dml":
        dims = {"S": width, "R": width, "T": context} if width and context else {}
        return ProviderSetup(provider, name, {"device_id": "0"}, {}, mem_pattern=False,
                             free_dims={k: v for k, v in dims.items() if v}, graph=graph)
    return ProviderSetup(provider, name, graph=graph)


def available(provider: str) -> bool:
    name = PROVIDERS.get(provider)
    if name in ort.get_available_providers():
        return True
    if provider == "qnn":
        try:
            import onnxruntime_qnn  # noqa: F401 - the plugin package of onnxruntime-qnn 2.x
        except ImportError:
            return False
        return True
    return False


def check_provider(provider: str) -> str:
    """The ONNX Runtime name of a provider this build has, or a one-line error."""
    if provider not in PROVIDERS:
        raise SpecEdgeError(f"unknown provider '{provider}'", f"use one of {', '.join(PROVIDERS)}")
    if not available(provider):
        raise SpecEdgeError(f"this onnxruntime build has no {PROVIDERS[provider]}",
                            WHERE_TO_GET.get(provider, "reinstall onnxruntime") + ", or pass --fallback cpu")
    return PROVIDERS[provider]


def resolve_provider(provider: str, fallback: str | None = None) -> str:
    """`provider` if present; else `fallback`, said out loud; else a one-line error."""
    try:
        check_provider(provider)
        return provider
    except SpecEdgeError as e:
        if fallback is None or provider not in PROVIDERS:
            raise
        check_provider(fallback)
        print(f"specedge: {e.problem}; running on {fallback} as --fallback asks", file=sys.stderr)
        return fallback


def _session_options(setup: ProviderSetup, threads: int | None, spin: bool = False) -> ort.SessionOptions:
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.enable_mem_pattern = setup.mem_pattern
    opts.log_severity_level = 3
    opts.intra_op_num_threads = threads or physical_cores()
    opts.inter_op_num_threads = 1
    # Target and draft passes alternate. Left spinning after its pass, one session's threads take
    # the cores from the other's pass: on 2 cores a 2-token verification measured 104 ms next to a
    # draft model instead of 85 ms. Spin within a pass, stop when it returns - unless the session
    # runs alone, where spinning between passes saves the wake-up (a 1.5B step: 58.9 -> 57.3 ms).
    opts.add_session_config_entry("session.force_spinning_stop", "0" if spin else "1")
    opts.add_session_config_entry("session.set_denormal_as_zero", "1")  # 57.8 ms against 58.9
    for key, value in setup.session_entries.items():
        opts.add_session_config_entry(key, value)
    for dim, value in setup.free_dims.items():
        opts.add_free_dimension_override_by_name(dim, value)
    return opts


def create_session(graph: Path, provider: str = "cpu", threads: int | None = None, width: int | None = None,
                   context: int | None = None, spin: bool = False) -> ort.InferenceSession:
    """spin: keep the threads spinning between passes; only for a session that runs alone."""
    check_provider(provider)
    setup = provider_setup(provider, Path(graph), width, context)
    opts = _session_options(setup, threads, spin)
    if provider == "qnn" and setup.session_entries.get("ep.context_file_path"):
        Path(setup.session_entries["ep.context_file_path"]).parent.mkdir(exist_ok=True)
    try:
        if setup.ort_name in ort.get_available_providers():
            return ort.InferenceSession(str(setup.graph), opts, providers=[(setup.ort_name, setup.provider_options)])
        return _plugin_session(setup, opts)  # pragma: no cover - needs onnxruntime-qnn 2.x
    except Exception as e:  # onnxruntime raises its own exception types for bad graphs
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SpecEdgeError(f"onnxruntime could not load {graph} on {provider}: {first[:300]}",
                            "re-export the model with `specedge export` (with --for for NPU/GPU targets)") from None


def _plugin_session(setup: ProviderSetup, opts: ort.SessionOptions) -> ort.InferenceSession:  # pragma: no cover
    """onnxruntime-qnn 2.x registers QNN as a plugin EP library, selected per device."""
    import onnxruntime_qnn

    if setup.ort_name not in {d.ep_name for d in ort.get_ep_devices()}:
        ort.register_execution_provider_library(setup.ort_name, onnxruntime_qnn.get_library_path())
    devices = [d for d in ort.get_ep_devices() if d.ep_name == setup.ort_name]
    options = dict(setup.provider_options, backend_path=onnxruntime_qnn.get_qnn_htp_path())
    opts.add_provider_for_devices(devices, options)
    return ort.InferenceSession(str(setup.graph), opts)
