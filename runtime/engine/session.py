"""ONNX Runtime sessions per execution provider, with the options each provider's documentation
asks for, and one-line errors for providers this installation lacks.

- cpu: all graph optimizations, threads = cores, denormals flushed to zero; threads stop
  spinning when a pass returns, unless the session runs alone (plain decoding).
- qnn (Qualcomm HTP, the onnxruntime-qnn plugin): backend library, the SoC to compile for
  (soc_model, default 60), burst performance mode, graph finalization level 3, fp16 for float ops,
  and no CPU fallback: a graph with a node the HTP does not take fails, naming the nodes. The
  compiled graph is loaded from the artifact's qnn_ctx/soc<N>/ where it is there (shared-weights
  contexts only where the platform can load them, see runtime/qnn/contexts.py), else compiled and cached
  there for next time; the session says which on stderr.
- dml (DirectML): memory pattern off, sequential execution, free dimensions fixed.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import sys
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import onnxruntime as ort

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import manifest_fields
from specedge.kernels import native
from specedge.runtime import qnn
from specedge.runtime.engine.rows import PaddedSession, one_width_graph
from specedge.runtime.engine.weight_pages import ResidentWeights

PROVIDERS = {
    "cpu": "CPUExecutionProvider",
    "dml": "DmlExecutionProvider",
    "qnn": "QNNExecutionProvider",
}
WHERE_TO_GET = {
    "dml": "install onnxruntime-directml (Windows x64)",
    "qnn": "pip install 'specedge[qnn]' (onnxruntime-qnn: Windows ARM64/x64, Linux x86_64; Python >= 3.11)",
}
FALLBACK_DISABLED = "fallback to CPU EP has been explicitly disabled"  # onnxruntime's words
QNN_CPU_FALLBACK_ENV = "SPECEDGE_QNN_CPU_FALLBACK"  # "1": let nodes the HTP does not take run on the CPU


@dataclass(frozen=True)
class ProviderSetup:
    provider: str
    ort_name: str
    provider_options: dict[str, str] = field(default_factory=dict)
    session_entries: dict[str, str] = field(default_factory=dict)
    mem_pattern: bool = True
    free_dims: dict[str, int] = field(default_factory=dict)
    graph: Path | None = None  # what to load: the graph, or its cached EP context model
    qnn: qnn.ContextPlan | None = None  # qnn: where the compiled graph comes from


def physical_cores() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def qnn_context_path(graph: Path, soc: str | None = None) -> Path:
    """This width's own compiled context for `soc` (default: the process's SoC)."""
    return qnn.context_dir(Path(graph).parent, qnn.choose_soc(soc, Path(graph).parent)) / qnn.context_name(graph)


def staging_dir(plan: qnn.ContextPlan) -> Path | None:
    """Where a compiling session writes its context before it is moved into place."""
    return plan.write.parent / f".staging-{os.getpid()}" if plan.write else None


def provider_setup(provider: str, graph: Path, width: int | None = None, context: int | None = None,
                   platform: str = sys.platform, soc: str | None = None, machine: str | None = None,
                   cpu_fallback: bool | None = None) -> ProviderSetup:
    """The options a session on `provider` gets for `graph` (pure but for reading the artifact's
    qnn_ctx folder: no provider needs to be present)."""
    if provider not in PROVIDERS:
        raise SpecEdgeError(f"unknown provider '{provider}'", f"use one of {', '.join(PROVIDERS)}")
    name = PROVIDERS[provider]
    if provider == "qnn":
        if cpu_fallback is None:
            cpu_fallback = os.environ.get(QNN_CPU_FALLBACK_ENV) == "1"
        # a graph split between QNN and the CPU cannot be written as a context: compile it each time
        plan = qnn.plan_context(Path(graph), soc, machine, cache=not cpu_fallback)
        entries = {"session.disable_cpu_ep_fallback": "0" if cpu_fallback else "1",
                   "session.record_ep_graph_assignment_info": "1"}  # where each node runs: qnn.node_assignment
        if plan.how == "shared":  # the widths' sessions share one copy of the weights
            entries["ep.share_ep_contexts"] = "1"
        staging = staging_dir(plan)
        if plan.write and staging:  # compile now, and write the context for next time
            entries |= {"ep.context_enable": "1", "ep.context_file_path": str(staging / plan.write.name),
                        "ep.context_embed_mode": "0"}
        options = {"backend_path": "QnnHtp.dll" if platform == "win32" else "libQnnHtp.so",
                   **qnn.htp_options(plan.soc)}
        return ProviderSetup(provider, name, options, entries, graph=plan.load, qnn=plan)
    if provider == "dml":
        dims = {"S": width, "R": width, "T": context} if width and context else {}
        return ProviderSetup(provider, name, {"device_id": "0"}, {}, mem_pattern=False,
                             free_dims={k: v for k, v in dims.items() if v}, graph=graph)
    return ProviderSetup(provider, name, graph=graph)


def available(provider: str) -> bool:
    if provider == "qnn":  # built in (onnxruntime-qnn 1.x), or the 2.x plugin library, registered on first use
        return qnn.available()
    return PROVIDERS.get(provider) in ort.get_available_providers()


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


def session_options(setup: ProviderSetup, threads: int | None, spin: bool = False,
                    entries: Mapping[str, str] | None = None) -> ort.SessionOptions:
    """The options a session of `setup` is made with (also the export's, compiling QNN contexts);
    entries: config entries of this session's own (a draft's attention window: kernels/native.py)."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.enable_mem_pattern = setup.mem_pattern
    opts.log_severity_level = 4 if setup.provider == "qnn" else 3  # qnn: its failures are reported in one line
    opts.intra_op_num_threads = threads or physical_cores()
    opts.inter_op_num_threads = 1
    # Target and draft passes alternate. Left spinning after its pass, one session's threads take
    # the cores from the other's pass. Spin within a pass, stop when it returns - unless the session
    # runs alone, where spinning between passes saves the wake-up (docs/benchmarks.md, "Measured
    # choices in the code": both, and denormals as zero).
    opts.add_session_config_entry("session.force_spinning_stop", "0" if spin else "1")
    opts.add_session_config_entry("session.set_denormal_as_zero", "1")
    for key, value in {**setup.session_entries, **(entries or {})}.items():
        opts.add_session_config_entry(key, value)
    for dim, value in setup.free_dims.items():
        opts.add_free_dimension_override_by_name(dim, value)
    if setup.provider == "cpu" and native.available():  # ai.specedge ops (int4 exports made with the library)
        native.register(opts)
    return opts


def create_session(graph: Path, provider: str = "cpu", threads: int | None = None, width: int | None = None,
                   context: int | None = None, spin: bool = False, profile_prefix: str | None = None,
                   weights: ResidentWeights | None = None,
                   entries: Mapping[str, str] | None = None) -> ort.InferenceSession:
    """spin: keep the threads spinning between passes; only for a session that runs alone.
    profile_prefix: record ONNX Runtime's profile of every node (the step profiler's, never decoding's).
    weights: the graph's weights already in memory (runtime/engine/weight_pages.py), used instead of its data file.
    entries: the session's own config entries (session_options)."""
    check_provider(provider)
    if provider == "qnn":
        check_built_for_qnn(Path(graph))
        return _qnn_width_session(Path(graph), width, context, threads)
    setup = provider_setup(provider, Path(graph), width, context)
    opts = session_options(setup, threads, spin, entries)
    if profile_prefix is not None:
        opts.enable_profiling = True
        opts.profile_file_prefix = profile_prefix
    if weights is not None:
        weights.add_to(opts)
    try:
        session = ort.InferenceSession(str(setup.graph), opts, providers=[(setup.ort_name, setup.provider_options)])
    except Exception as e:  # onnxruntime raises its own exception types for bad graphs
        raise _load_error(graph, provider, e) from None
    session.specedge_weights = weights  # the session reads them in place: they live as long as it
    return session


def _load_error(graph: Path, provider: str, e: Exception) -> SpecEdgeError:
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    if native.DOMAIN in str(e) and not native.available():
        return SpecEdgeError(f"{graph.parent} runs specedge's native 4-bit kernel, and {native.missing()}",
                             "or re-export it without: specedge export ... --int4-kernel nbits")
    return SpecEdgeError(f"onnxruntime could not load {graph} on {provider}: {first[:300]}",
                         "re-export the model with `specedge export` (with --for for NPU/GPU targets)")


def check_built_for_qnn(graph: Path) -> None:
    """A graph of an artifact exported for another target (a CPU graph: dynamic shapes, CPU-only
    kernels) is refused before QNN compiles any of it."""
    fields = manifest_fields(graph.parent)
    target = fields.get("target", "cpu") if fields is not None else "qnn"
    if target != "qnn":
        raise SpecEdgeError(f"{graph.parent} was exported for {target}, not for QNN's HTP backend",
                            "export it with `specedge export --for qnn`")


_qnn_sessions: weakref.WeakValueDictionary = weakref.WeakValueDictionary()  # one per graph, while in use


def _qnn_width_session(graph: Path, width: int | None, context: int | None, threads: int | None):
    """The session a pass of `width` rows runs on QNN: the graph of its artifact's verification
    width, padded (see runtime/engine/rows.py), made once per process while it is in use."""
    run, padded_to = one_width_graph(graph, width)
    setup = provider_setup("qnn", run, padded_to or width, context)
    key = (str(run.resolve()), setup.provider_options["soc_model"],  # compiled now or loaded: the same graph
           setup.session_entries["session.disable_cpu_ep_fallback"])
    session = _qnn_sessions.get(key)
    if session is None:
        session = _qnn_session(setup, threads)
        _qnn_sessions[key] = session
    if padded_to is None:
        return session
    rows = f"{width} row" + ("s" if width > 1 else "")
    print(f"specedge: qnn: passes of {rows} run in {run.name}, padded to {padded_to} rows (the HTP's rows differ "
          "between compiled widths; one width keeps speculation lossless)", file=sys.stderr, flush=True)
    return PaddedSession(session, padded_to)


def _qnn_session(setup: ProviderSetup, threads: int | None) -> ort.InferenceSession:
    """A session on QNN's HTP backend: from a compiled context, or compiling the graph and caching
    its context (moved into place only once complete). Says on stderr which."""
    plan = setup.qnn
    assert plan is not None
    staging = staging_dir(plan)
    if staging is not None:
        shutil.rmtree(staging, ignore_errors=True)
        try:
            staging.mkdir(parents=True)
        except OSError:  # a read-only artifact: compile without caching
            staging, plan = None, dataclasses.replace(plan, write=None)
            entries = {k: v for k, v in setup.session_entries.items() if not k.startswith("ep.context")}
            setup = dataclasses.replace(setup, session_entries=entries, qnn=plan)
    print(f"specedge: {plan.message}", file=sys.stderr, flush=True)
    try:
        session = make_qnn_session(setup, session_options(setup, threads))
    except Exception as e:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        # with fallback disabled, or while writing a context, a graph the HTP does not take whole
        # fails with a message that names no node: load it again to find them
        if FALLBACK_DISABLED in str(e) or setup.session_entries.get("ep.context_enable") == "1":
            raise _fallback_error(setup, threads, e) from None
        raise _load_error(setup.graph, "qnn", e) from None
    if staging is not None and plan.write is not None:
        if any(staging.glob("*.onnx")):
            qnn.install_contexts(staging, plan.write.parent)
            qnn.record_sources(plan.write.parent, [plan.load], plan.soc)
        else:
            shutil.rmtree(staging, ignore_errors=True)
    return session


def make_qnn_session(setup: ProviderSetup, opts: ort.SessionOptions) -> ort.InferenceSession:
    """A session on the QNN provider, built in (onnxruntime-qnn 1.x) or as the plugin's device."""
    if qnn.built_in():  # onnxruntime-qnn 1.x: QNN compiled into onnxruntime
        return ort.InferenceSession(str(setup.graph), opts, providers=[(setup.ort_name, setup.provider_options)])
    devices = qnn.ep_devices()
    if not devices:
        raise SpecEdgeError("onnxruntime-qnn is installed but its plugin library did not register",
                            "reinstall it: pip install 'specedge[qnn]'")
    opts.add_provider_for_devices(devices, dict(setup.provider_options, backend_path=qnn.backend_path()))
    return ort.InferenceSession(str(setup.graph), opts)


def fallback_nodes(setup: ProviderSetup, threads: int | None = None) -> list[tuple[str, str]]:
    """(name, op type) of the nodes onnxruntime assigns to the CPU rather than QNN for this graph:
    the graph loaded again with fallback allowed (and the quickest finalization), its assignment
    recorded."""
    entries = {k: v for k, v in setup.session_entries.items() if not k.startswith("ep.context")}
    entries |= {"session.disable_cpu_ep_fallback": "0", "session.record_ep_graph_assignment_info": "1"}
    options = dict(setup.provider_options, htp_graph_finalization_optimization_mode="1")
    probe = dataclasses.replace(setup, session_entries=entries, provider_options=options)
    session = make_qnn_session(probe, session_options(probe, threads))
    return [(node.name or "(unnamed)", node.op_type) for sub in session.get_provider_graph_assignment_info()
            if sub.ep_name != setup.ort_name for node in sub.get_nodes()]


def _fallback_error(setup: ProviderSetup, threads: int | None, error: Exception) -> SpecEdgeError:
    """One line naming the nodes that would have fallen back to the CPU; onnxruntime's own error
    where none would (the graph failed for another reason)."""
    name = setup.graph.name if setup.graph else "the graph"
    try:
        nodes = fallback_nodes(setup, threads)
    except Exception:  # the diagnosis failed too: report the first error
        nodes = []
    if not nodes:
        return _load_error(setup.graph, "qnn", error)
    shown = ", ".join(f"{n} ({op})" for n, op in nodes[:12])
    more = f" and {len(nodes) - 12} more" if len(nodes) > 12 else ""
    return SpecEdgeError(f"{len(nodes)} nodes of {name} would run on the CPU, not QNN's HTP backend: {shown}{more}",
                         f"re-export with `specedge export --for qnn`, or set {QNN_CPU_FALLBACK_ENV}=1 to let "
                         "them run on the CPU")
