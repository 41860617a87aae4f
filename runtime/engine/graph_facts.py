"""What an artifact's ONNX graph says of itself, checked against its manifest before a session
opens: the width of its logits, the positions its rotary tables cover, the rows of its embedding.

A manifest that claims another vocabulary or context than its graph was built for would make the
first pass fail inside ONNX Runtime; this reads the graph file's protobuf (names and shapes only,
never the weights, which live in the data file) with the standard library, since the runtime does
not depend on the onnx package.
"""

from __future__ import annotations

import mmap
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from specedge.core.errors import DamagedArtifactError
from specedge.core.manifest import Manifest

Shape = tuple[int | str, ...]  # a dimension's size, or its symbol ("R", "T")

# field numbers of onnx.proto
MODEL_GRAPH = 7
GRAPH_INITIALIZER, GRAPH_INPUT, GRAPH_OUTPUT = 5, 11, 12
TENSOR_DIMS, TENSOR_TYPE, TENSOR_NAME, TENSOR_EXTERNAL, TENSOR_LOCATION = 1, 2, 8, 13, 14
ENTRY_KEY, ENTRY_VALUE = 1, 2
LOCATION_EXTERNAL = 1
VALUE_NAME, VALUE_TYPE = 1, 2
TYPE_TENSOR, TENSOR_TYPE_SHAPE, SHAPE_DIM = 1, 2, 1
DIM_VALUE, DIM_PARAM = 1, 2

ROPE_TABLES = ("rope.cos_cache", "rope.sin_cache", "rope.cos", "rope.sin")  # [C, d/2] or [C, d]
EMBEDDING = "model.embed_tokens.weight"  # [V, D]
LOGITS = "logits"  # [1, R, V]
PAST_KEY = "past_key.0"  # [1, kv_heads, T, head_dim]: T is the context in a static graph


class GraphReadError(ValueError):
    """The bytes are not a protobuf this reader can walk."""


@dataclass(frozen=True)
class GraphFacts:
    inputs: dict[str, Shape] = field(default_factory=dict)
    outputs: dict[str, Shape] = field(default_factory=dict)
    initializers: dict[str, tuple[int, ...]] = field(default_factory=dict)


def _varint(buf: bytes | mmap.mmap, pos: int, end: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        if pos >= end or shift > 63:
            raise GraphReadError("a truncated varint")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes | mmap.mmap, start: int, end: int) -> Iterator[tuple[int, int, int, int]]:
    """(field number, wire type, value or start, end) of each field of the message in buf[start:end]:
    a varint's value, else the span of its bytes."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos, end)
            yield number, wire, value, pos
            continue
        if wire == 2:
            size, pos = _varint(buf, pos, end)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
        else:
            raise GraphReadError(f"wire type {wire}")
        if pos + size > end:
            raise GraphReadError("a field runs past its message")
        yield number, wire, pos, pos + size
        pos += size


def _int64(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _tensor(buf: bytes | mmap.mmap, start: int, end: int) -> tuple[str, tuple[int, ...]]:
    name, dims = "", []
    for number, wire, a, b in _fields(buf, start, end):
        if number == TENSOR_NAME and wire == 2:
            name = bytes(buf[a:b]).decode("utf-8", "replace")
        elif number == TENSOR_DIMS and wire == 0:
            dims.append(_int64(a))
        elif number == TENSOR_DIMS and wire == 2:  # packed
            pos = a
            while pos < b:
                value, pos = _varint(buf, pos, b)
                dims.append(_int64(value))
    return name, tuple(dims)


@dataclass(frozen=True)
class ExternalTensor:
    """An initializer whose bytes lie in a data file beside the graph."""
    name: str
    dims: tuple[int, ...]
    data_type: int  # onnx.proto's TensorProto.DataType
    location: str
    offset: int
    length: int


def _external(buf: bytes | mmap.mmap, start: int, end: int) -> ExternalTensor | None:
    """The initializer in buf[start:end] if its data is external, else None."""
    name, dims = _tensor(buf, start, end)
    data_type, external, entries = 0, False, {}
    for number, wire, a, b in _fields(buf, start, end):
        if number == TENSOR_TYPE and wire == 0:
            data_type = a
        elif number == TENSOR_LOCATION and wire == 0:
            external = a == LOCATION_EXTERNAL
        elif number == TENSOR_EXTERNAL and wire == 2:
            entry = {n: bytes(buf[c:d]).decode("utf-8", "replace") for n, w, c, d in _fields(buf, a, b) if w == 2}
            entries[entry.get(ENTRY_KEY, "")] = entry.get(ENTRY_VALUE, "")
    if not external:
        return None
    return ExternalTensor(name, dims, data_type, entries.get("location", ""), int(entries.get("offset", 0)),
                          int(entries.get("length", -1)))


def external_tensors(path: Path) -> list[ExternalTensor]:
    """The initializers of the graph file at `path` whose bytes lie in a data file (GraphReadError,
    OSError or ValueError where the file cannot be read as a graph)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        found = []
        for number, wire, a, b in _fields(buf, 0, len(buf)):
            if number == MODEL_GRAPH and wire == 2:
                found += [t for n2, w2, c, d in _fields(buf, a, b)
                          if n2 == GRAPH_INITIALIZER and w2 == 2 and (t := _external(buf, c, d)) is not None]
        return found


def _value(buf: bytes | mmap.mmap, start: int, end: int) -> tuple[str, Shape]:
    """A ValueInfoProto's name and tensor shape (() if it has none)."""
    name, shape = "", ()
    for number, wire, a, b in _fields(buf, start, end):
        if number == VALUE_NAME and wire == 2:
            name = bytes(buf[a:b]).decode("utf-8", "replace")
        elif number == VALUE_TYPE and wire == 2:
            shape = _type_shape(buf, a, b)
    return name, shape


def _type_shape(buf: bytes | mmap.mmap, start: int, end: int) -> Shape:
    for number, wire, a, b in _fields(buf, start, end):
        if number == TYPE_TENSOR and wire == 2:
            for n2, w2, c, d in _fields(buf, a, b):
                if n2 == TENSOR_TYPE_SHAPE and w2 == 2:
                    return tuple(_dim(buf, e, f) for n3, w3, e, f in _fields(buf, c, d)
                                 if n3 == SHAPE_DIM and w3 == 2)
    return ()


def _dim(buf: bytes | mmap.mmap, start: int, end: int) -> int | str:
    for number, wire, a, b in _fields(buf, start, end):
        if number == DIM_VALUE and wire == 0:
            return _int64(a)
        if number == DIM_PARAM and wire == 2:
            return bytes(buf[a:b]).decode("utf-8", "replace")
    return "?"


def parse_graph(buf: bytes | mmap.mmap) -> GraphFacts:
    """The shapes of a serialized ModelProto's graph inputs, outputs and initializers."""
    facts = GraphFacts()
    for number, wire, a, b in _fields(buf, 0, len(buf)):
        if number != MODEL_GRAPH or wire != 2:
            continue
        for n2, w2, c, d in _fields(buf, a, b):
            if w2 != 2:
                continue
            if n2 == GRAPH_INITIALIZER:
                name, dims = _tensor(buf, c, d)
                facts.initializers[name] = dims
            elif n2 in (GRAPH_INPUT, GRAPH_OUTPUT):
                name, shape = _value(buf, c, d)
                (facts.inputs if n2 == GRAPH_INPUT else facts.outputs)[name] = shape
    return facts


def read_graph(path: Path) -> GraphFacts | None:
    """The facts of the graph file at `path` (its weights are not read: they lie in the data
    file, and bytes of the proto this reader does not need are skipped); None where it cannot be
    read, for ONNX Runtime to report when it opens it."""
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return parse_graph(buf)
    except (OSError, ValueError):  # ValueError: an empty file cannot be mapped; GraphReadError
        return None


def graph_mismatches(facts: GraphFacts, manifest: Manifest) -> list[str]:
    """What the graph contradicts in the manifest, one phrase each."""
    found = []
    logits = facts.outputs.get(LOGITS, ())
    if logits and isinstance(logits[-1], int) and logits[-1] != manifest.logits_vocab:
        field_ = "head_vocab" if manifest.head_vocab else "vocab_size"
        found.append(f"its logits score {logits[-1]} tokens, not the {manifest.logits_vocab} of the manifest's "
                     f"{field_}")
    embedding = facts.initializers.get(EMBEDDING, ())
    if len(embedding) == 2 and manifest.vocab_size > embedding[0]:
        found.append(f"its embedding holds {embedding[0]} tokens, fewer than the manifest's vocab_size "
                     f"{manifest.vocab_size}")
    table = next((facts.initializers[name] for name in ROPE_TABLES if name in facts.initializers), ())
    if table and table[0] != manifest.context:
        found.append(f"its rotary tables cover {table[0]} positions, not the manifest's context {manifest.context}")
    past = facts.inputs.get(PAST_KEY, ())
    if manifest.static and len(past) == 4 and isinstance(past[2], int) and past[2] != manifest.context:
        found.append(f"its KV cache holds {past[2]} positions, not the manifest's context {manifest.context}")
    return found


def check_graphs(folder: Path, manifest: Manifest) -> None:
    """Each graph file of the artifact agrees with the manifest on the vocabulary and the context."""
    for name in dict.fromkeys([manifest.graph, *manifest.graphs.values()]):
        facts = read_graph(Path(folder) / name)
        if facts is not None and (found := graph_mismatches(facts, manifest)):
            raise DamagedArtifactError(folder, f"the graph {name} of {folder} does not match its manifest: "
                                       + "; ".join(found), "the manifest was edited or belongs to another export")
