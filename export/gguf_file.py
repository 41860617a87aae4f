"""A GGUF file read as data: its metadata and tensor table from the header, each tensor's bytes on demand.

The header is parsed with every length bounded by the file's size (source_check.py's reader); the
token and merge lists come out as Python strings directly, where gguf's GGUFReader builds a numpy
view per field (seconds for a large vocabulary). A tensor is read with one
positioned read into its own buffer, not through a memory map, so its file pages never count in
the exporter's resident size, then dequantized to float32 by gguf's numpy code (`gguf.quants`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specedge.core.errors import SpecEdgeError
from specedge.export.source_check import ARRAY, GGUF_MAGIC, MAX_DIMS, STRING, _Reader, overlapping

# GGUF value types -> struct formats (little-endian); 8 = string and 9 = array are read apart
FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8", 11: "<i8", 12: "<f8"}
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 16


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple[int, ...]  # as GGUF lists them: fastest-varying first
    qtype: int  # gguf.GGMLQuantizationType
    offset: int  # from the start of the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """numpy's order: [out, in] for a Linear weight."""
        return tuple(reversed(self.dims))


@dataclass(frozen=True)
class GgufFile:
    path: Path
    fields: dict[str, object]  # scalars as int/float/bool/str, arrays as lists
    tensors: dict[str, TensorInfo]

    def read(self, name: str) -> np.ndarray:
        """The tensor as float32 in numpy's order, dequantized."""
        return dequantize(read_raw(self.path, self.tensors[name]), self.tensors[name])


def _value(r: _Reader, kind: int) -> object:
    if kind in FORMATS:
        fmt = FORMATS[kind]
        value = struct.unpack(fmt, r.take(struct.calcsize(fmt)))[0]
        return float(value) if kind in (6, 12) else value
    if kind == STRING:
        return r.string()
    if kind == ARRAY:
        inner, count = r.u32(), r.u64()
        if inner in NUMPY:
            size = np.dtype(NUMPY[inner]).itemsize
            values = np.frombuffer(r.take(count * size), dtype=NUMPY[inner]).tolist()
            return [float(v) for v in values] if inner in (6, 12) else values
        if inner == STRING:
            if count * 8 > r.size:
                raise r.bad(f"an array claims {count} strings")
            return [r.string() for _ in range(count)]
        raise r.bad(f"an array of value type {inner}")
    raise r.bad(f"unknown value type {kind}")


def read_header(path: Path) -> GgufFile:
    """Metadata and tensor table of a GGUF v2/v3 file (check_gguf has already walked it)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as f:
        r = _Reader(f, size, path)
        if r.take(4) != GGUF_MAGIC or r.u32() not in (2, 3):
            raise r.bad("it does not start with a GGUF v2/v3 header")
        n_tensors, n_fields = r.u64(), r.u64()
        fields = {}
        for _ in range(n_fields):
            key = r.string()
            fields[key] = _value(r, r.u32())
        infos = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.u32()
            if n_dims > MAX_DIMS:
                raise r.bad(f"tensor {name[:80]} has {n_dims} dimensions")
            dims = tuple(r.u64() for _ in range(n_dims))
            qtype, offset = r.u32(), r.u64()
            infos.append((name, dims, qtype, offset))
        alignment = _alignment(fields.get("general.alignment", DEFAULT_ALIGNMENT), r)
        start = -(-f.tell() // alignment) * alignment
    tensors = {}
    for name, dims, qtype, offset in infos:
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(qtype)]
        except (ValueError, KeyError):
            raise SpecEdgeError(f"{path} holds tensor {name[:80]} of GGML type {qtype}, which gguf cannot read",
                                "use a GGUF of common quantization types (F16, Q8_0, Q4_K_M, ...)") from None
        count = int(np.prod(dims, dtype=np.int64)) if dims else 1
        nbytes = count * type_size // block
        if name in tensors or (dims and dims[0] % block) or start + offset + nbytes > size:
            raise SpecEdgeError(f"{path} is not a valid GGUF file: tensor {name[:80]} is duplicated, misshapen "
                                "or runs past the end of the file", "the file is damaged; download it again")
        tensors[name] = TensorInfo(name, dims, qtype, start + offset, nbytes)
    if overlapping(sorted((t.offset, t.offset + t.nbytes) for t in tensors.values())):
        raise SpecEdgeError(f"{path} is not a valid GGUF file: two of its tensors share bytes",
                            "the file is damaged or was made to mislead; download it again")
    return GgufFile(path, fields, tensors)


def _alignment(value: object, r: _Reader) -> int:
    """general.alignment: a power of two the tensor data starts at (GGUF's default 32)."""
    if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= MAX_ALIGNMENT \
            or value & (value - 1):
        raise r.bad(f"general.alignment is {str(value)[:40]!r}, not a power of two up to {MAX_ALIGNMENT}")
    return value


def read_raw(path: Path, info: TensorInfo) -> np.ndarray:
    """The tensor's stored bytes, shaped as gguf's reader shapes them (uint8 rows for quantized types)."""
    from gguf import GGMLQuantizationType as T
    from gguf import quant_shape_to_byte_shape

    plain = {T.F32: np.float32, T.F16: np.float16, T.F64: np.float64, T.I8: np.int8, T.I16: np.int16,
             T.I32: np.int32, T.I64: np.int64}
    qtype = T(info.qtype)
    raw = np.empty(info.nbytes, dtype=np.uint8)
    with open(path, "rb", buffering=0) as f:
        f.seek(info.offset)
        view, done = memoryview(raw), 0
        while done < info.nbytes:
            n = f.readinto(view[done:])
            if not n:
                raise SpecEdgeError(f"{path} ended inside tensor {info.name}", "the file is damaged; download it again")
            done += n
    if qtype in plain:
        return raw.view(plain[qtype]).reshape(info.shape)
    return raw.reshape(quant_shape_to_byte_shape(info.shape, qtype))


def dequantize(raw: np.ndarray, info: TensorInfo) -> np.ndarray:
    """float32 in numpy's order, by gguf's numpy dequantization (what transformers' GGUF loader calls)."""
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize as gguf_dequantize

    try:
        return np.asarray(gguf_dequantize(raw, GGMLQuantizationType(info.qtype)), dtype=np.float32)
    except NotImplementedError:
        raise SpecEdgeError(f"gguf cannot dequantize tensor {info.name} of type "
                            f"{GGMLQuantizationType(info.qtype).name}",
                            "use a GGUF of common quantization types (F16, Q8_0, Q4_K_M, ...)") from None
