"""Qualcomm's QNN execution provider, by job: the onnxruntime-qnn plugin (`plugin.py`), the SoCs its
HTP compiles for (`socs.py`), and the compiled contexts an artifact keeps (`folders.py`,
`contexts.py`). Padding a pass to the one width a QNN artifact runs is runtime/engine/rows.py's
(`one_width_graph`, `PaddedSession`).

onnxruntime-qnn 2.x is a plugin EP library (PyPI wheels for Windows ARM64/x64 and Linux x86_64,
Python >= 3.11): it is registered with `onnxruntime.register_execution_provider_library` and
selected per device. On x86_64 its HTP backend (libQnnHtp) is Qualcomm's Hexagon compiler and
simulator: graphs compile exactly as for a device and run, slowly. The wheel has no libQnnCpu.

Standard library only at import (onnxruntime loads when the plugin is first asked for), so a
command-line parser can list the SoCs without loading a runtime.
"""

from specedge.runtime.qnn.contexts import (
    ContextPlan,
    context_summary,
    current_context,
    graph_digest,
    install_contexts,
    plan_context,
    record_sources,
    shared_contexts_load,
)
from specedge.runtime.qnn.folders import (
    CONTEXT_DIR,
    SHARED_DIR,
    SOURCES_FILE,
    TARGET_FILE,
    context_dir,
    context_name,
)
from specedge.runtime.qnn.plugin import (
    EP_NAME,
    available,
    backend_path,
    built_in,
    describe,
    ep_devices,
    node_assignment,
    plugin,
)
from specedge.runtime.qnn.socs import (
    DEFAULT_SOC,
    SOC_ENV,
    SOCS,
    SocArgument,
    artifact_soc,
    choose_soc,
    htp_options,
    profile_socs,
    resolve_soc,
    set_default_soc,
    soc_label,
    write_artifact_soc,
)

__all__ = ["CONTEXT_DIR", "DEFAULT_SOC", "EP_NAME", "SHARED_DIR", "SOCS", "SOC_ENV", "SOURCES_FILE", "TARGET_FILE",
           "ContextPlan", "SocArgument", "artifact_soc", "available", "backend_path", "built_in", "choose_soc",
           "context_dir", "context_name", "context_summary", "current_context", "describe", "ep_devices",
           "graph_digest", "htp_options", "install_contexts", "node_assignment", "plan_context", "plugin",
           "profile_socs", "record_sources", "resolve_soc", "set_default_soc", "shared_contexts_load", "soc_label",
           "write_artifact_soc"]
