"""Which session runs a pass of a given width: one CPU graph for every width, or a static graph
per exported width (QNN, DirectML), each opened on first use."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from specedge.core.contract import logits_rows
from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import Manifest
from specedge.runtime.engine.session import create_session
from specedge.runtime.engine.weight_pages import resident_weights


class DynamicGraph:
    """A CPU graph with a symbolic width: one session (one copy of the weights) for any pass."""

    def __init__(self, session: object, prefill_width: int) -> None:
        self.session = session
        self.prefill_width = prefill_width

    def session_for(self, width: int) -> object:
        return self.session

    def takes(self, width: int) -> bool:
        return True

    def all_rows(self, width: int, all_logits: bool) -> bool:
        """Whether a pass of `width` returns every row's logits: as the caller asks."""
        return all_logits

    def chunk_width(self, remaining: int) -> int:
        return min(remaining, self.prefill_width)


class StaticGraphs:
    """One graph per exported width with every shape fixed; a session per width, made on first use
    (on QNN, runtime/engine/session.py runs every pass up to the widest verification graph in that graph,
    padded: runtime/engine/rows.py)."""

    session = None

    def __init__(self, folder: Path, manifest: Manifest, provider: str, threads: int | None, spin: bool) -> None:
        self.folder = folder
        self.graphs = manifest.graphs
        self.context = manifest.context
        self.provider, self.threads, self.spin = provider, threads, spin
        self._sessions: dict[int, object] = {}

    def session_for(self, width: int) -> object:
        if width not in self.graphs:
            raise SpecEdgeError(f"{self.folder} has static graphs for widths {sorted(self.graphs)}, not {width}",
                                "re-export with that width in --widths")
        if width not in self._sessions:
            self._sessions[width] = create_session(self.folder / self.graphs[width], self.provider, self.threads,
                                                   width, self.context, self.spin)
        return self._sessions[width]

    def takes(self, width: int) -> bool:
        return width in self.graphs

    def all_rows(self, width: int, all_logits: bool) -> bool:
        """The graph fixes its logits rows: all of them up to the widest verification, else the last."""
        return logits_rows(width) == width

    def chunk_width(self, remaining: int) -> int:
        """The widest exported width that fits what remains."""
        return max(w for w in self.graphs if w <= remaining)


def open_graphs(folder: Path, manifest: Manifest, provider: str, threads: int | None,
                spin: bool, profile_prefix: str | None = None,
                entries: Mapping[str, str] | None = None) -> DynamicGraph | StaticGraphs:
    """entries: the CPU session's own config entries (a draft's attention window); static graphs
    (QNN, DirectML) run the providers' attention, which has none."""
    if manifest.static:
        return StaticGraphs(folder, manifest, provider, threads, spin)
    # specedge's kernel reads its weights as stored: in memory on huge pages, where this OS gives them
    weights = resident_weights(folder / manifest.graph) if provider == "cpu" and manifest.native_kernel else None
    return DynamicGraph(create_session(folder / manifest.graph, provider, threads, spin=spin,
                                       profile_prefix=profile_prefix, weights=weights, entries=entries),
                        manifest.prefill_width)
