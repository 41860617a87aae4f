"""Checks of a source checkpoint before any library reads it: what it holds, in bounds, with no code.

A GGUF header is walked field by field with every length checked against the file's size (a
header that claims a 2^62-byte key is refused, not allocated). A Hugging Face folder is read as
data only: its config may not ask for its own Python code (`auto_map`), and its weights must be
safetensors, never pickle files, which can run code when loaded. Both give the number of weights,
so export can check the free disk space before it starts.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from specedge.core.errors import SpecEdgeError

GGUF_MAGIC = b"GGUF"
MAX_ITEMS = 1 << 20  # key/value pairs or tensors in one header
MAX_DIMS = 8
GGUF_U32, GGUF_U64 = 4, 10  # value types of a GGUF key (SCALAR_SIZES)
# GGUF value types: fixed sizes in bytes (8 = string, 9 = array are variable)
SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
STRING, ARRAY = 8, 9
EMBEDDING_NAMES = ("token_embd.weight", "model.embed_tokens.weight")
MAX_SAFETENSORS_HEADER = 100 << 20
SAFETENSORS_ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U64": 8,
                        "U32": 4, "U16": 2, "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1}


@dataclass(frozen=True)
class SourceSummary:
    weights: int  # number of weight values
    embedding: int  # of which in the token embedding
    trained_context: int = 0  # the positions it was trained for, as its header or config says (0: not said)
    # what the native rows attention cannot hold: layers that see only the last sliding_window
    # positions (Gemma 3, Phi-3), and rotary embeddings over part of each head (Phi-4-mini)
    sliding_window: int = 0
    partial_rotary: bool = False


class _Reader:
    def __init__(self, f: BinaryIO, size: int, path: Path) -> None:
        self.f, self.size, self.path = f, size, path

    def bad(self, what: str) -> SpecEdgeError:
        return SpecEdgeError(f"{self.path} is not a valid GGUF file: {what}",
                             "the file is damaged or not a GGUF model; download it again")

    def take(self, n: int) -> bytes:
        if n < 0 or self.f.tell() + n > self.size:
            raise self.bad(f"a field of {n} bytes at offset {self.f.tell()} runs past the end of the file")
        return self.f.read(n)

    def skip(self, n: int) -> None:
        if n < 0 or self.f.tell() + n > self.size:
            raise self.bad(f"a field of {n} bytes at offset {self.f.tell()} runs past the end of the file")
        self.f.seek(n, 1)

    def u32(self) -> int:
        return struct.unpack("<I", self.take(4))[0]

    def u64(self) -> int:
        return struct.unpack("<Q", self.take(8))[0]

    def string(self) -> str:
        data = self.take(self.u64())
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise self.bad("a key or string is not UTF-8") from None

    def skip_value(self, kind: int) -> None:
        if kind in SCALAR_SIZES:
            self.skip(SCALAR_SIZES[kind])
        elif kind == STRING:
            self.skip(self.u64())
        elif kind == ARRAY:
            inner, count = self.u32(), self.u64()
            if inner in SCALAR_SIZES:
                self.skip(count * SCALAR_SIZES[inner])
            elif inner == STRING:
                if count * 8 > self.size:
                    raise self.bad(f"an array claims {count} strings")
                for _ in range(count):
                    self.skip(self.u64())
            else:
                raise self.bad(f"an array of value type {inner}")
        else:
            raise self.bad(f"unknown value type {kind}")


def check_gguf(path: Path) -> SourceSummary:
    """Walk a GGUF header (v2/v3) with every length bounded by the file size."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size, path)
        if r.take(4) != GGUF_MAGIC:
            raise r.bad("it does not start with the GGUF magic bytes")
        version = r.u32()
        if version not in (2, 3):
            raise r.bad(f"version {version} (specedge reads GGUF versions 2 and 3)")
        tensors, kvs = r.u64(), r.u64()
        if tensors > MAX_ITEMS or kvs > MAX_ITEMS:
            raise r.bad(f"the header claims {tensors} tensors and {kvs} key/value pairs")
        sizes: dict[str, int] = {}  # the header's integers the summary reads
        for _ in range(kvs):
            key, kind = r.string(), r.u32()
            suffix = next((s for s in SUMMARY_KEYS if key.endswith(s)), None)
            if suffix is not None and kind in (GGUF_U32, GGUF_U64):
                sizes[suffix] = r.u32() if kind == GGUF_U32 else r.u64()
            else:
                r.skip_value(kind)
        trained = sizes.get(".context_length", 0)
        total = embedding = 0
        for _ in range(tensors):
            name = r.string()
            dims = r.u32()
            if dims > MAX_DIMS:
                raise r.bad(f"tensor {name[:80]} has {dims} dimensions")
            count = 1
            for _ in range(dims):
                count *= r.u64()
            r.skip(12)  # type (u32) and offset (u64)
            if count > size * 4:  # the densest GGUF type holds < 4 values a byte
                raise r.bad(f"tensor {name[:80]} claims {count} values in a {size}-byte file")
            total += count
            embedding += count if name in EMBEDDING_NAMES else 0
    return SourceSummary(total, embedding, trained, sizes.get(".attention.sliding_window", 0), partial_in(sizes))


SUMMARY_KEYS = (".context_length", ".attention.sliding_window", ".rope.dimension_count", ".attention.key_length",
                ".embedding_length", ".attention.head_count")


def partial_in(sizes: dict[str, int]) -> bool:
    """Does a GGUF header's rope.dimension_count cover less than a head (llama.cpp's Phi-4-mini)?"""
    heads, hidden = sizes.get(".attention.head_count", 0), sizes.get(".embedding_length", 0)
    head = sizes.get(".attention.key_length") or (hidden // heads if heads else 0)
    rotary = sizes.get(".rope.dimension_count", 0)
    return bool(rotary and head and rotary < head)


def check_hf_folder(folder: Path) -> SourceSummary:
    """A Hugging Face folder as data only: no remote code, safetensors weights, counted from headers."""
    config = _read_json(folder / "config.json")
    if not isinstance(config, dict):
        raise SpecEdgeError(f"{folder / 'config.json'} is a JSON {type(config).__name__}, not an object",
                            "pass a complete Hugging Face checkpoint folder")
    for name in ("config.json", "tokenizer_config.json"):
        data = config if name == "config.json" else _read_json(folder / name, required=False)
        if isinstance(data, dict) and data.get("auto_map"):
            raise SpecEdgeError(f"{folder / name} asks for the checkpoint's own Python code (auto_map)",
                                "specedge never runs code from a checkpoint: use a checkpoint of a "
                                "supported architecture without custom code")
    weights = sorted(folder.glob("*.safetensors"))
    if not weights:
        pickles = sorted(p.name for p in folder.glob("*.bin")) + sorted(p.name for p in folder.glob("*.pt*"))
        found = f" (it has {', '.join(pickles[:3])}: pickle files, which can run code when loaded)" if pickles else ""
        raise SpecEdgeError(f"{folder} has no .safetensors weights{found}",
                            "convert the weights to safetensors, e.g. with transformers' save_pretrained")
    total = embedding = 0
    for f in weights:
        for e in safetensors_entries(f):
            total += e.count
            embedding += e.count if e.name in EMBEDDING_NAMES else 0
    trained = config.get("max_position_embeddings")
    window = config.get("sliding_window") if config.get("model_type") in ("gemma3_text", "phi3") else 0
    partial = partial_rotary_factor(config) or 1.0
    return SourceSummary(total, embedding, trained if isinstance(trained, int) and trained > 0 else 0,
                         window if isinstance(window, int) and window > 0 else 0,
                         isinstance(partial, int | float) and partial < 1)


def partial_rotary_factor(config: dict) -> object:
    """A config's partial_rotary_factor, at its top level or in rope_parameters (None: not said)."""
    params = config.get("rope_parameters")
    return config.get("partial_rotary_factor") or (params.get("partial_rotary_factor") if isinstance(params, dict)
                                                   else None)


def _read_json(path: Path, required: bool = True) -> object:
    if not path.is_file():
        if required:
            raise SpecEdgeError(f"{path} is missing", "pass a complete Hugging Face checkpoint folder")
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SpecEdgeError(f"{path} is not valid JSON ({e})", "the checkpoint is damaged; download it again") from None


@dataclass(frozen=True)
class SafetensorsEntry:
    """One tensor of a safetensors file, where its bytes are."""

    file: Path
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # from the start of the file
    end: int

    @property
    def count(self) -> int:
        return math.prod(self.shape)


def safetensors_entries(path: Path) -> list[SafetensorsEntry]:
    """A safetensors file's tensors from its header, every field checked: a JSON object of entries
    with a dtype, a shape of non-negative integers and data offsets inside the file that hold
    exactly the shape's bytes, no two tensors sharing a byte."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        length = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if not 0 < length <= min(size - 8, MAX_SAFETENSORS_HEADER):
            raise SpecEdgeError(f"{path} is not a valid safetensors file", "download the weights again")
        try:
            header = json.loads(f.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            raise SpecEdgeError(f"{path} has a damaged safetensors header", "download the weights again") from None
    if not isinstance(header, dict):
        raise SpecEdgeError(f"{path} has a damaged safetensors header (a JSON {type(header).__name__}, "
                            "not an object)", "download the weights again")
    start = 8 + length
    entries = [_entry(path, name, meta, start, size) for name, meta in header.items() if name != "__metadata__"]
    if overlapping(sorted((e.begin, e.end) for e in entries)):
        raise SpecEdgeError(f"{path} has a damaged safetensors header (two tensors share bytes)",
                            "download the weights again")
    return entries


def _entry(path: Path, name: str, meta: object, start: int, size: int) -> SafetensorsEntry:
    """One header entry, checked; its offsets counted from the data's `start` in a `size`-byte file."""
    def bad(what: str) -> SpecEdgeError:
        return SpecEdgeError(f"{path} has a damaged safetensors header: tensor {name[:80]} {what}",
                             "download the weights again")

    if not isinstance(meta, dict):
        raise bad("is not an object")
    dtype, shape, offsets = meta.get("dtype"), meta.get("shape"), meta.get("data_offsets")
    if not isinstance(dtype, str) or len(dtype) > 16:
        raise bad(f"has the dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or len(shape) > MAX_DIMS or not all(_natural(d) for d in shape):
        raise bad(f"has the shape {str(shape)[:60]}, not a list of non-negative integers")
    if not isinstance(offsets, list) or len(offsets) != 2 or not all(_natural(o) for o in offsets) \
            or not offsets[0] <= offsets[1] <= size - start:
        raise bad(f"has the data offsets {str(offsets)[:60]}, not a range inside the file")
    entry = SafetensorsEntry(path, name, dtype, tuple(shape), start + offsets[0], start + offsets[1])
    nbytes = entry.end - entry.begin
    itemsize = SAFETENSORS_ITEMSIZE.get(dtype)
    if (itemsize and nbytes != entry.count * itemsize) or (not itemsize and entry.count > nbytes * 8):
        raise bad(f"has {nbytes} bytes for its shape {list(shape)} of {dtype}")
    return entry


def overlapping(extents: list[tuple[int, int]]) -> bool:
    """Whether two of these sorted (begin, end) byte ranges share a byte: with none shared, what a
    file's tensors hold adds up to no more than the file."""
    reached = 0
    for begin, end in extents:
        if begin < end:
            if begin < reached:
                return True
            reached = end
    return False


def _natural(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
