"""An artifact's weights in process memory on 2 MB pages, where Linux gives them, instead of the
map of its data file that ONNX Runtime makes by itself.

ONNX Runtime maps page-aligned external initializers on the CPU (export/onnx_writer.py aligns them),
so the weights a pass streams are the data file's 4 KB pages in the page cache: every 4 KB read
needs a TLB entry of its own (a page walk once the TLB's reach is passed), and a 1-token step of the
1.5B touches ~250,000 of them. Read into anonymous memory advised MADV_HUGEPAGE (transparent huge
pages, 'always' or 'madvise' in /sys/kernel/mm/transparent_hugepage/enabled), the same bytes sit on
2 MB pages and the step reads them sooner (docs/kernel.md has the figures). The bytes are ONNX
Runtime's initializers by `SessionOptions.add_initializer`, which uses the buffer as given (no
copy): a process holds one copy of a graph's weights, as the page cache did, and the sessions of one
graph in a process share it. Resident memory is the same as with the map once a pass has touched
every weight; unlike the page cache, the kernel cannot drop these pages under memory pressure.

Only for graphs whose weight matrices run on specedge's kernel (which reads its weights as
stored): ONNX Runtime's own kernels (MatMulNBits, MLAS) pack their weights into buffers of their
own, so for them the file's bytes are read once either way and this would only hold a second copy.
The embedding table stays mapped: a pass reads only its tokens' rows, so 2 MB pages gain nothing
there, and in memory the table would hold its whole size (the 1.5B's 222 MiB) where the map holds
the rows the text has used.
Elsewhere (no transparent huge pages, macOS, Windows, SPECEDGE_MAPPED_WEIGHTS=1) ONNX Runtime maps
the file as before.
"""

from __future__ import annotations

import mmap
import os
import weakref
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specedge.runtime.engine.graph_facts import EMBEDDING, ExternalTensor, GraphReadError, external_tensors

OPT_OUT_ENV = "SPECEDGE_MAPPED_WEIGHTS"  # "1": leave the data file mapped by ONNX Runtime
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")
DTYPES = {1: np.float32, 2: np.uint8, 3: np.int8, 5: np.int16, 6: np.int32, 7: np.int64, 10: np.float16}
CHUNK = 64 << 20  # bytes read at a time
GATHERED = EMBEDDING.rsplit(".", 1)[0] + "."  # the embedding's table and scales: rows read by token


@dataclass(eq=False)
class ResidentWeights:
    """A graph's external initializers as OrtValues over one anonymous region per data file."""
    names: list[str]
    values: list[ort.OrtValue]
    regions: list[mmap.mmap] = field(repr=False)
    nbytes: int  # the tensors' bytes in memory

    def add_to(self, opts: ort.SessionOptions) -> None:
        for name, value in zip(self.names, self.values, strict=True):
            opts.add_initializer(name, value)


_shared: weakref.WeakValueDictionary[tuple, ResidentWeights] = weakref.WeakValueDictionary()  # by files


def huge_pages_offered(setting: str | None = None) -> bool:
    """Whether this kernel gives anonymous memory advised MADV_HUGEPAGE 2 MB pages."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    if setting is None:
        try:
            setting = THP_SETTING.read_text()
        except OSError:
            return False
    return "[always]" in setting or "[madvise]" in setting


def describe() -> str:
    """Where the weights of graphs on specedge's kernel are read from in this process (doctor's line)."""
    if os.environ.get(OPT_OUT_ENV) == "1":
        return f"mapped from their data files ({OPT_OUT_ENV}=1)"
    if not huge_pages_offered():
        return "mapped from their data files (this system offers no transparent huge pages)"
    return f"read into memory on 2 MB pages ({OPT_OUT_ENV}=1 keeps them mapped)"


def resident_weights(graph: Path) -> ResidentWeights | None:
    """The weights of `graph` read into huge-page memory, shared with any other session of it in
    this process; None where they stay mapped (see the module's docstring)."""
    if os.environ.get(OPT_OUT_ENV) == "1" or not huge_pages_offered():
        return None
    try:
        tensors = [t for t in external_tensors(graph) if not t.name.startswith(GATHERED)]
        if not tensors or not all(readable(t) for t in tensors):
            return None
        files = sorted({t.location for t in tensors})
        key = (str(graph.resolve()), *((f, *file_stamp(graph.parent / f)) for f in files))
    except (OSError, ValueError, GraphReadError):
        return None  # ONNX Runtime reports what is wrong with the graph when it opens it
    if (kept := _shared.get(key)) is not None:
        return kept
    try:
        weights = read_weights(graph.parent, tensors)
    except (OSError, ValueError):  # a data file shorter than its graph says: ONNX Runtime names it
        return None
    _shared[key] = weights
    return weights


def readable(t: ExternalTensor) -> bool:
    """A tensor of a type this reads, with its length, in a file beside its graph."""
    return t.data_type in DTYPES and t.length >= 0 and t.location != "" and Path(t.location).name == t.location


def file_stamp(path: Path) -> tuple[int, int]:
    st = path.stat()
    return st.st_size, st.st_mtime_ns


def read_weights(folder: Path, tensors: list[ExternalTensor]) -> ResidentWeights:
    """Each data file's tensors read into an anonymous region of the file's size advised
    MADV_HUGEPAGE, each at its offset in the file (so the exporter's page alignment holds; the
    bytes of tensors left out are never touched, so never resident), and each tensor a view of it."""
    regions: dict[str, mmap.mmap] = {}
    for location in dict.fromkeys(t.location for t in tensors):
        regions[location] = read_region(folder / location, [t for t in tensors if t.location == location])
    names, values = [], []
    for t in tensors:
        region = regions[t.location]
        dtype = np.dtype(DTYPES[t.data_type])
        array = np.frombuffer(region, dtype=dtype, count=t.length // dtype.itemsize, offset=t.offset)
        names.append(t.name)
        values.append(ort.OrtValue.ortvalue_from_numpy(array.reshape(t.dims)))
    return ResidentWeights(names, values, list(regions.values()), sum(t.length for t in tensors))


def read_region(path: Path, tensors: list[ExternalTensor]) -> mmap.mmap:
    size = path.stat().st_size
    if any(t.offset + t.length > size for t in tensors):
        raise ValueError(f"{path} is shorter than its graph says")
    region = mmap.mmap(-1, max(size, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    view = memoryview(region)
    try:
        with open(path, "rb") as f:
            for t in sorted(tensors, key=lambda t: t.offset):
                f.seek(t.offset)
                done = t.offset
                while done < t.offset + t.length:
                    got = f.readinto(view[done:min(done + CHUNK, t.offset + t.length)])
                    if not got:
                        raise ValueError(f"{path} ended early")
                    done += got
    finally:
        view.release()
    return region
