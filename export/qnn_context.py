"""Ahead-of-time QNN context binaries: an artifact's static graphs compiled for a named Snapdragon.

`specedge export --for qnn --soc SOC --contexts MODE` compiles every width's graph with
Qualcomm's HTP compiler (onnxruntime-qnn; on x86_64 it compiles exactly as for the device) and
writes the EP context models into the artifact's `qnn_ctx/soc<N>/`:

- shared: one pass over all widths with `ep.share_ep_contexts`, the last one closing it with
  `ep.stop_share_ep_contexts`: a `_ctx.onnx` per width and one `.bin` holding the weights once,
  in `qnn_ctx/soc<N>/shared/`. What a device loads: one copy of the weights for every width.
  Only an ARM64 device can load it (on x86_64 it crashes the process), so the runtime never does
  elsewhere (runtime/qnn/contexts.py).
- per-width: a `_ctx.onnx` and `.bin` per width (the weights in each), in `qnn_ctx/soc<N>/`:
  what the runtime loads anywhere, and what it writes itself on a graph's first load.
- both: the two above.
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import manifest_fields
from specedge.runtime import qnn

MODES = ("shared", "per-width", "both")


@dataclass(frozen=True)
class CompiledContexts:
    folder: Path
    shared: bool
    contexts: dict[int, str]  # width -> its _ctx.onnx, relative to the artifact
    binaries: dict[str, int]  # .bin file (relative to the artifact) -> bytes
    seconds: float
    peak_rss_bytes: int  # the process's peak resident memory when the compile ended
    peak_is_compiles: bool  # the compile raised it (else it peaked earlier, in the export)

    def summary(self) -> str:
        kind = "shared-weights" if self.shared else "per-width"
        sizes = ", ".join(f"{name} {size / 2**20:.0f} MiB" for name, size in self.binaries.items())
        peak = self.peak_rss_bytes / 2**30
        memory = f"peak memory {peak:.1f} GiB" if self.peak_is_compiles else f"peak memory under {peak:.1f} GiB"
        return (f"compiled {kind} QNN contexts for widths {sorted(self.contexts)} in {self.seconds:.0f} s, "
                f"{memory}: {len(self.binaries)} binary file(s), {sizes}")


def artifact_graphs(folder: Path) -> dict[int, Path]:
    manifest = manifest_fields(Path(folder)) or {}
    if manifest.get("target") != "qnn" or not manifest.get("graphs"):
        raise SpecEdgeError(f"{folder} is not a QNN export", "export it with `specedge export --for qnn`")
    return {int(w): Path(folder) / name for w, name in sorted(manifest["graphs"].items(), key=lambda kv: int(kv[0]))}


def compile_contexts(folder: Path, soc: str | None = None, shared: bool = True,
                     threads: int | None = None) -> CompiledContexts:
    """Compile every width's graph of the QNN artifact `folder` for `soc` (see the module doc)."""
    from specedge.export.artifact import peak_rss_bytes
    from specedge.runtime.engine.session import ProviderSetup, check_provider, make_qnn_session, session_options

    check_provider("qnn")
    folder = Path(folder)
    soc = qnn.resolve_soc(soc)
    graphs = artifact_graphs(folder)
    dest = qnn.context_dir(folder, soc) / qnn.SHARED_DIR if shared else qnn.context_dir(folder, soc)
    staging = dest.parent / f".staging-{'shared' if shared else 'widths'}-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    start, peak_before = time.perf_counter(), peak_rss_bytes()
    sessions = []  # alive until the last one is made: a shared context is written as one
    try:
        for i, graph in enumerate(graphs.values()):
            entries = {"session.disable_cpu_ep_fallback": "1", "ep.context_enable": "1",
                       "ep.context_file_path": str(staging / qnn.context_name(graph)), "ep.context_embed_mode": "0"}
            if shared:
                entries["ep.share_ep_contexts"] = "1"
                if i == len(graphs) - 1:
                    entries["ep.stop_share_ep_contexts"] = "1"
            setup = ProviderSetup("qnn", qnn.EP_NAME, {"backend_path": qnn.backend_path(), **qnn.htp_options(soc)},
                                  entries, graph=graph)
            print(f"specedge: qnn: compiling {graph.name} for {qnn.soc_label(soc)}", flush=True)
            try:
                sessions.append(make_qnn_session(setup, session_options(setup, threads)))
            except Exception as e:
                first = str(e).strip().splitlines()[0][:300] if str(e).strip() else type(e).__name__
                raise SpecEdgeError(f"QNN could not compile {graph.name} for {qnn.soc_label(soc)}: {first}",
                                    "check that every node runs on the HTP: `specedge generate --provider qnn` "
                                    "names the ones that would not") from None
        del sessions[:]
        seconds = time.perf_counter() - start
        binaries = {f.name: f.stat().st_size for f in sorted(staging.glob("*.bin"))}
        qnn.install_contexts(staging, dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    qnn.record_sources(dest, list(graphs.values()), soc)
    rel, peak = dest.relative_to(folder), peak_rss_bytes()
    return CompiledContexts(dest, shared, {w: str(rel / qnn.context_name(g)) for w, g in graphs.items()},
                            {str(rel / name): size for name, size in binaries.items()}, seconds,
                            peak, peak > peak_before)


def write_qnn_target(folder: Path, soc: str | None, contexts: str | None) -> list[str]:
    """Record the SoC a QNN export is for and (contexts: shared, per-width or both) compile its
    graphs for it; the lines to print."""
    soc = qnn.resolve_soc(soc)
    qnn.write_artifact_soc(folder, soc)
    lines = [f"for {qnn.soc_label(soc)}"]
    if contexts not in (None, "none"):
        if contexts not in MODES:
            raise SpecEdgeError(f"unknown --contexts '{contexts}'", f"use one of {', '.join(MODES)}")
        for shared in {"shared": (True,), "per-width": (False,), "both": (True, False)}[contexts]:
            lines.append(compile_contexts(folder, soc, shared=shared).summary())
    return lines
