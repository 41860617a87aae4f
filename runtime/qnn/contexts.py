"""Compiled QNN contexts: which one a session loads (`plan_context`: shared weights where this
machine can load them, else the width's own, else compile and cache), whether one is current
(the sha256 of the graph it came from), and installing what a session or an export compiled.
Where they live: runtime/qnn/folders.py."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from dataclasses import dataclass
from pathlib import Path

from specedge.core.manifest import manifest_fields
from specedge.runtime.qnn.folders import CONTEXT_DIR, SHARED_DIR, SOURCES_FILE, context_dir, context_name
from specedge.runtime.qnn.plugin import plugin
from specedge.runtime.qnn.socs import artifact_soc, choose_soc, soc_label

SHARED_LOAD_MACHINES = ("aarch64", "arm64")  # where Qualcomm's shared weights buffers exist


def shared_contexts_load(machine: str | None = None) -> bool:
    """Can this machine load a context with weights shared across graphs? Only on the device."""
    return (machine or platform.machine()).lower() in SHARED_LOAD_MACHINES


def graph_digest(graph: Path) -> str:
    """The sha256 of a graph file: from the artifact's manifest where it lists it, else computed."""
    graph = Path(graph)
    entry = (manifest_fields(graph.parent) or {}).get("files", {}).get(graph.name)
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
