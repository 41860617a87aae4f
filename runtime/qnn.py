"""Qualcomm's QNN execution provider: the onnxruntime-qnn plugin, SoC names, and compiled contexts.

onnxruntime-qnn 2.x is a plugin EP library (PyPI wheels for Windows ARM64/x64 and Linux x86_64,
Python >= 3.11): it is registered with `onnxruntime.register_execution_provider_library` and
selected per device. On x86_64 its HTP backend (libQnnHtp) is Qualcomm's Hexagon compiler and
simulator: graphs compile exactly as for a device and run, slowly. The wheel has no libQnnCpu.

Compiled graphs ("EP contexts": a small `_ctx.onnx` pointing at a `.bin`) live per SoC in the
artifact's `qnn_ctx/soc<N>/`:

- `model_s<w>_ctx.onnx` + its own `.bin`: one graph per width, written by the runtime on first
  load (or by `specedge export --contexts per-width`). Loads anywhere QNN's HTP backend runs.
- `shared/model_s<w>_ctx.onnx` + one `.bin` for all widths: weights shared across the widths'
  graphs (`specedge export --contexts shared`), for Snapdragon devices. Loading one on x86_64
  crashes the process ("Shared weights buffer isn't supported on this platform"), so there the
  runtime uses the per-width contexts, or compiles, and says which.

Each context folder has a `sources.json` with the sha256 of every graph it was compiled from; a
context whose graph changed (a re-export) is not loaded.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import os
import platform
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from specedge.core.contract import MAX_VERIFY_WIDTH
from specedge.core.errors import SpecEdgeError

EP_NAME = "QNNExecutionProvider"
CONTEXT_DIR = "qnn_ctx"
SHARED_DIR = "shared"
SOURCES_FILE = "sources.json"
TARGET_FILE = "target.json"  # {"soc_model": ...}: the SoC named at export
SOC_ENV = "SPECEDGE_QNN_SOC"
DEFAULT_SOC = "60"
# QNN's SoC model numbers (QnnHtpDevice soc_model) and HTP architectures, from Qualcomm's SoC table as
# published in LiteRT's Qualcomm backend (tensorflow/lite/experimental/litert/vendors/qualcomm/core/
# schema/soc_table.h) and, for SC8380XP, the onnxruntime-qnn documentation's HTP example (60, v73).
SOCS: dict[str, tuple[str, str, str]] = {  # soc_model -> (SoC, marketing name, HTP arch)
    "30": ("SM8350", "Snapdragon 888", "68"),
    "36": ("SM8450", "Snapdragon 8 Gen 1", "69"),
    "43": ("SM8550", "Snapdragon 8 Gen 2", "73"),
    "57": ("SM8650", "Snapdragon 8 Gen 3", "75"),
    "60": ("SC8380XP", "Snapdragon X Elite", "73"),
    "69": ("SM8750", "Snapdragon 8 Elite", "79"),
}
SHARED_LOAD_MACHINES = ("aarch64", "arm64")  # where Qualcomm's shared weights buffers exist


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


# -- SoCs ---------------------------------------------------------------------------------------
_default_soc: str | None = None


def set_default_soc(value: str | None) -> None:
    """The SoC this process compiles for unless a call names one (the CLI's --soc)."""
    global _default_soc
    _default_soc = resolve_soc(value) if value else None


def profile_socs() -> dict[str, str]:
    """Device profile name -> the QNN soc_model its profile names."""
    from specedge.device_profiles.profiles import BUILTIN_DIR

    out = {}
    for path in sorted(BUILTIN_DIR.glob("*.json")):
        qnn = json.loads(path.read_text()).get("qnn")
        if qnn:
            out[path.stem] = str(qnn["soc_model"])
    return out


class SocArgument(argparse.Action):
    """`--soc` of generate and chat: the SoC this process's QNN sessions compile for."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[no-untyped-def]
        try:
            set_default_soc(str(values))
        except SpecEdgeError as e:
            parser.error(str(e))
        setattr(namespace, self.dest, values)


def artifact_soc(folder: Path) -> str | None:
    """The SoC an artifact was exported for (`specedge export --for qnn --soc`), if it names one."""
    path = Path(folder) / CONTEXT_DIR / TARGET_FILE
    try:
        return str(json.loads(path.read_text())["soc_model"]) if path.is_file() else None
    except (json.JSONDecodeError, KeyError):
        return None


def write_artifact_soc(folder: Path, soc: str) -> None:
    path = Path(folder) / CONTEXT_DIR / TARGET_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"soc_model": soc, "soc": SOCS.get(soc, ("",))[0]}) + "\n")


def choose_soc(value: str | None = None, folder: Path | None = None) -> str:
    """The SoC to compile for: `value`, else the process's --soc or $SPECEDGE_QNN_SOC, else the
    one the artifact was exported for, else 60 (SC8380XP)."""
    explicit = value or _default_soc or os.environ.get(SOC_ENV)
    if explicit:
        return resolve_soc(explicit)
    exported = artifact_soc(folder) if folder is not None else None
    if exported is not None and exported not in SOCS:
        raise SpecEdgeError(f"{Path(folder) / CONTEXT_DIR / TARGET_FILE} names the SoC '{exported[:40]}', which "
                            "QNN's HTP does not know", "pass --soc, or export the model again with --soc")
    return exported or DEFAULT_SOC


def resolve_soc(value: str | int | None = None) -> str:
    """A QNN soc_model number from a number, a SoC name (SM8650) or a device profile name
    (snapdragon-8-gen-3); None: the process default, $SPECEDGE_QNN_SOC, else 60 (SC8380XP)."""
    if value is None or value == "":
        value = _default_soc or os.environ.get(SOC_ENV) or DEFAULT_SOC
    text = str(value).strip()
    if text.isascii() and text.isdigit() and (text.lstrip("0") or "0") in SOCS:
        return text.lstrip("0")  # a number outside the table is no SoC QNN's HTP compiles for
    by_name = {name.lower(): soc for soc, (name, _, _) in SOCS.items()}
    if text.lower() in by_name:
        return by_name[text.lower()]
    profiles = profile_socs()
    if text in profiles:
        return profiles[text]
    known = ", ".join(f"{soc} ({name})" for soc, (name, _, _) in SOCS.items())
    raise SpecEdgeError(f"unknown QNN SoC '{str(value)[:40]}'",
                        f"pass a soc_model number ({known}), a SoC name, or a device profile "
                        f"({', '.join(profiles)})")


def soc_label(soc: str) -> str:
    name, market, arch = SOCS.get(soc, ("", "", ""))
    return f"SoC {soc} ({name}, {market}, HTP v{arch})" if name else f"SoC {soc}"


def htp_options(soc: str, performance: str = "burst", fp16: bool = True) -> dict[str, str]:
    """Provider options for the HTP backend, as the onnxruntime-qnn documentation names them.
    soc_model is what lets the compiler run off-device: without it, fp16 precision is refused on
    x86 ("FP16 precision mode is enabled but soc_model is not specified")."""
    return {
        "soc_model": soc or resolve_soc(),
        "htp_performance_mode": performance,
        "htp_graph_finalization_optimization_mode": "3",
        "enable_htp_fp16_precision": "1" if fp16 else "0",
    }


# -- contexts -----------------------------------------------------------------------------------
def context_dir(folder: Path, soc: str) -> Path:
    return Path(folder) / CONTEXT_DIR / f"soc{soc}"


def context_name(graph: Path | str) -> str:
    return f"{Path(graph).stem}_ctx.onnx"


def shared_contexts_load(machine: str | None = None) -> bool:
    """Can this machine load a context with weights shared across graphs? Only on the device."""
    return (machine or platform.machine()).lower() in SHARED_LOAD_MACHINES


def graph_digest(graph: Path) -> str:
    """The sha256 of a graph file: from the artifact's manifest where it lists it, else computed."""
    graph = Path(graph)
    manifest = graph.parent / "manifest.json"
    if manifest.is_file():
        entry = json.loads(manifest.read_text()).get("files", {}).get(graph.name)
        if entry:
            return entry["sha256"]
    h = hashlib.sha256()
    with graph.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _sources(folder: Path) -> dict[str, str]:
    path = folder / SOURCES_FILE
    try:
        return json.loads(path.read_text())["graphs"] if path.is_file() else {}
    except (json.JSONDecodeError, KeyError):
        return {}


def current_context(folder: Path, graph: Path) -> Path | None:
    """The context for `graph` in `folder`, if it is there and was compiled from this graph."""
    ctx = folder / context_name(graph)
    if ctx.is_file() and _sources(folder).get(graph.name) == graph_digest(graph):
        return ctx
    return None


def record_sources(folder: Path, graphs: list[Path], soc: str) -> None:
    """Add `graphs` (with their digests) to the folder's sources.json."""
    mod = plugin()
    data = {"soc_model": soc, "graphs": _sources(folder),
            "onnxruntime_qnn": getattr(mod, "__version__", None),
            "qnn_sdk": getattr(getattr(mod, "build_and_package_info", None), "qnn_version", None)}
    data["graphs"].update({g.name: graph_digest(g) for g in graphs})
    tmp = folder / f".{SOURCES_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True))
    tmp.replace(folder / SOURCES_FILE)


def install_contexts(staging: Path, folder: Path) -> None:
    """Move the files a session wrote into `staging` into `folder`: binaries first, then the
    `_ctx.onnx` models that point at them, so a reader never finds a context without its binary."""
    folder.mkdir(parents=True, exist_ok=True)
    files = sorted(staging.iterdir(), key=lambda p: p.name.endswith(".onnx"))
    for f in files:
        f.replace(folder / f.name)
    shutil.rmtree(staging, ignore_errors=True)


@dataclass(frozen=True)
class ContextPlan:
    """Where a QNN session's graph comes from: a compiled context, or the graph compiled now."""

    load: Path  # the model to load: a `_ctx.onnx`, or the graph itself
    how: str  # "shared" (weights shared across widths), "context" (this width's own), "compile"
    soc: str
    write: Path | None = None  # compile: where the context is cached (None: not cached)
    note: str = ""

    @property
    def message(self) -> str:
        if self.how == "compile":
            where = f"; caching it in {_from_artifact(self.write.parent)}" if self.write else ""
            return f"qnn: compiling {self.load.name} for {soc_label(self.soc)}{self.note}{where}"
        kind = "shared-weights context" if self.how == "shared" else "compiled context"
        return f"qnn: loading the {kind} {_from_artifact(self.load)} ({soc_label(self.soc)}){self.note}"


def _from_artifact(path: Path) -> str:
    """`path` from its qnn_ctx folder on: what the artifact folder holds."""
    parts = Path(path).parts
    return str(Path(*parts[parts.index(CONTEXT_DIR):])) if CONTEXT_DIR in parts else str(path)


def plan_context(graph: Path, soc: str | None = None, machine: str | None = None, cache: bool = True) -> ContextPlan:
    """What to load for `graph` (pure but for reading the artifact folder): the shared-weights
    context where this machine can load it, else this width's own context, else the graph, to be
    compiled and (cache=True) written as this width's context for next time."""
    graph = Path(graph)
    soc = choose_soc(soc, graph.parent)
    folder = context_dir(graph.parent, soc)
    shared = current_context(folder / SHARED_DIR, graph)
    if shared is not None and shared_contexts_load(machine):
        return ContextPlan(shared, "shared", soc)
    own = current_context(folder, graph)
    note = ""
    if shared is not None:
        note = (f" (the shared-weights context in {folder.relative_to(graph.parent) / SHARED_DIR} does not load "
                f"on {machine or platform.machine()}; it is for the device)")
    if own is not None:
        return ContextPlan(own, "context", soc, note=note)
    return ContextPlan(graph, "compile", soc, folder / context_name(graph) if cache else None, note=note)


# -- one compiled width -------------------------------------------------------------------------
def verify_width(folder: Path) -> int | None:
    """The widest static graph of an artifact that still returns every row (width <= 13): the one
    compiled width every QNN pass of that many rows or fewer runs at."""
    manifest = Path(folder) / "manifest.json"
    if not manifest.is_file():
        return None
    widths = [int(w) for w in json.loads(manifest.read_text()).get("graphs", {})]
    return max((w for w in widths if w <= MAX_VERIFY_WIDTH), default=None)


def one_width_graph(graph: Path, width: int | None) -> tuple[Path, int | None]:
    """(the graph a pass of `width` rows runs, the width it is padded to, or None).

    Rows of different widths are different compiled graphs on the HTP, and they differ: measured on
    SmolLM2-135M (QDQ, context 256), a row of the width-1 graph and the same row of the width-2
    graph differ by up to 0.64 in a logit (a near-tie flipped), while the rows of width-2 passes are
    bit-equal whichever row of the pass a token is and however the tokens are split into passes.
    So every pass of up to `verify_width` rows runs in that one graph, padded (as OnnxModel pads
    row groups): plain steps and verifications compute each row alike, and greedy speculation stays
    token-identical to plain decoding."""
    graph = Path(graph)
    target = verify_width(graph.parent)
    if width is None or target is None or width >= target:
        return graph, None
    manifest = json.loads((graph.parent / "manifest.json").read_text())
    name = manifest.get("graphs", {}).get(str(target))
    if not name or manifest.get("graphs", {}).get(str(width)) != graph.name:
        return graph, None
    return graph.parent / name, target


class PaddedSession:
    """A session of a static graph of `width` rows serving passes of fewer: the last row (token,
    position, mask row, logits index) repeated to fill it, and the outputs cut back. The repeated
    rows rewrite the last row's own cache slot with the same values inside the pass, and every
    row of a pass is computed independently of the others, so the real rows come out as in any
    other pass of this graph."""

    ROW_OUTPUTS = frozenset({"logits", "next_ids"})  # a row per logits index; new_* have S rows (axis 2)

    def __init__(self, session, width: int) -> None:
        self.session = session
        self.width = width

    def __getattr__(self, name: str):
        return getattr(self.session, name)

    def run(self, output_names, feeds, run_options=None):  # type: ignore[no-untyped-def]
        import numpy as np

        n = feeds["input_ids"].shape[1]
        pad = self.width - n
        if pad <= 0:
            return self.session.run(output_names, feeds, run_options)
        rows = len(feeds["logits_index"])
        padded = dict(feeds)
        for name, axis in (("input_ids", 1), ("position_ids", 1), ("attention_bias", 1)):
            value = feeds[name]
            last = np.take(value, [-1], axis=axis)
            padded[name] = np.concatenate([value, np.repeat(last, pad, axis=axis)], axis=axis)
        index = feeds["logits_index"]
        padded["logits_index"] = np.concatenate([index, np.repeat(index[-1:], self.width - rows)])
        out = self.session.run(output_names, padded, run_options)
        names = output_names or [o.name for o in self.session.get_outputs()]
        return [value[:, :rows] if name in self.ROW_OUTPUTS else value[:, :, :n] if value.ndim == 4 else value
                for name, value in zip(names, out, strict=True)]


def context_summary(folder: Path) -> list[str]:
    """What an artifact's qnn_ctx/ holds, for doctor: per SoC, the widths compiled per width or shared."""
    root = Path(folder) / CONTEXT_DIR
    lines = []
    target = artifact_soc(folder)
    if target:
        lines.append(f"exported for {soc_label(target)}")
    for soc_dir in sorted(root.glob("soc*")) if root.is_dir() else []:
        kinds = []
        for kind, sub in (("per-width", soc_dir), ("shared weights", soc_dir / SHARED_DIR)):
            graphs = sorted(_sources(sub))
            if graphs:
                kinds.append(f"{kind}: {', '.join(graphs)}")
        if kinds:
            lines.append(f"compiled for {soc_label(soc_dir.name[3:])}: {'; '.join(kinds)}")
    return lines
