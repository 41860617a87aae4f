"""The onnxruntime-qnn plugin: finding it, registering its library once, its EP devices, and what
doctor says about it. onnxruntime is imported by the functions that need it, never at import."""

from __future__ import annotations

import functools
import platform
import sys
from pathlib import Path

EP_NAME = "QNNExecutionProvider"


def plugin():
    """The onnxruntime_qnn module, or None where the wheel is not installed."""
    try:
        import onnxruntime_qnn
    except ImportError:
        return None
    return onnxruntime_qnn


def built_in() -> bool:
    """An onnxruntime build with QNN compiled in (onnxruntime-qnn 1.x), not the plugin (which,
    once registered, is listed among the available providers too, but is selected per device)."""
    import onnxruntime as ort

    return plugin() is None and EP_NAME in ort.get_available_providers()


def ep_devices() -> list:
    """The plugin's EP devices, registering the library on first use; [] where it cannot load."""
    import onnxruntime as ort

    mod = plugin()
    if mod is None or not hasattr(ort, "register_execution_provider_library"):
        return []
    return list(_register(mod.get_library_path()))


@functools.cache
def _register(library: str) -> tuple:
    import onnxruntime as ort

    if EP_NAME not in {d.ep_name for d in ort.get_ep_devices()}:
        try:
            ort.register_execution_provider_library(EP_NAME, library)
        except Exception as e:  # onnxruntime raises its own types for a library it cannot load
            print(f"specedge: cannot register onnxruntime-qnn's library {library}: {e}", file=sys.stderr)
            return ()
    return tuple(d for d in ort.get_ep_devices() if d.ep_name == EP_NAME)


def available() -> bool:
    return built_in() or bool(ep_devices())


def backend_path(platform_name: str = sys.platform) -> str:
    """The HTP backend library: the plugin's own copy where installed, else the name to look up."""
    mod = plugin()
    if mod is not None and Path(mod.get_qnn_htp_path()).is_file():
        return mod.get_qnn_htp_path()
    return "QnnHtp.dll" if platform_name == "win32" else "libQnnHtp.so"


def describe() -> list[str]:
    """What doctor shows: versions, the EP device and the backend libraries."""
    mod = plugin()
    if mod is None:
        return []
    sdk = getattr(getattr(mod, "build_and_package_info", None), "qnn_version", "?")
    lines = [f"onnxruntime-qnn {getattr(mod, '__version__', '?')} (QNN SDK {sdk}), plugin {mod.get_library_path()}"]
    devices = ep_devices()
    for d in devices:
        hw = d.device
        lines.append(f"device: {d.ep_name} ({d.ep_vendor}) on {hw.type.name} {hw.vendor}")
    if not devices:
        lines.append("device: none (the plugin library did not register)")
    backends = {"htp": mod.get_qnn_htp_path(), "gpu": mod.get_qnn_gpu_path(), "cpu": mod.get_qnn_cpu_path()}
    for name, path in backends.items():
        lines.append(f"backend {name}: {path if Path(path).is_file() else 'not in this wheel'}")
    if platform.machine().lower() in ("x86_64", "amd64"):
        lines.append("HTP on x86_64 is Qualcomm's compiler and simulator: graphs compile as for a device and run "
                     "slowly; shared-weights contexts do not load here")
    return lines


def node_assignment(session) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """Execution provider -> how many of the session's nodes it runs (a compiled context counts as
    the one EPContext node it is)."""
    counts: dict[str, int] = {}
    for sub in session.get_provider_graph_assignment_info():
        counts[sub.ep_name] = counts.get(sub.ep_name, 0) + len(sub.get_nodes())
    return counts
