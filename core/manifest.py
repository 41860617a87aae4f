"""The artifact manifest: what export promises and what the runtime checks before trusting it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import MISSING, asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from specedge.core.contract import (
    ATTENTION,
    GENERATION_FIELDS,
    INT4_KERNELS,
    MANIFEST_NAME,
    QUANT_BITS,
    ROWS_LAYOUTS,
    TARGETS,
    TOKENIZER_NAME,
)
from specedge.core.costs import WeightCosts
from specedge.core.errors import DamagedArtifactError, SpecEdgeError

__all__ = ["MANIFEST_NAME", "TOKENIZER_NAME", "Manifest", "Quantization", "load_manifest", "sha256_file"]

SCHEMA_VERSION = 1
MAX_MANIFEST_BYTES = 16 << 20  # a manifest is a few KB, a few hundred with a long chat template
MAX_VOCAB = 1 << 24
MAX_CONTEXT = 1 << 20
MAX_LAYERS = 512
MAX_HEADS = 1024
MAX_HEAD_DIM = 1024
MAX_HIDDEN = 1 << 16
MAX_FILE_BYTES = 1 << 50
MAX_ITEMS = 1024  # entries of a list or dict field: widths, eos ids, files, graphs
MAX_TEMPLATE_CHARS = 1 << 20
KV_DTYPES = ("float32", "float16")
QUANT_BITS_ALLOWED = (4, 8, 16, 32)
HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class Quantization:
    method: str  # "fp32", "int8", "int4", "w8a8", "qdq"
    bits: int  # 32, 8 or 4
    block_size: int  # 0 for fp32
    accuracy_level: int  # MatMulNBits accuracy_level (4: int8 activations), 0 for fp32
    float_tensors: tuple[str, ...] = ()  # what was left in float
    int8_weights: bool = False  # w8a8 weights stored as int8 (u8 x s8 MatMulInteger), else uint8 (u8 x u8)
    kernel: str = "nbits"  # int4: "rows" (ai.specedge::MatMulInt4Rows, rows exact by construction) or MatMulNBits
    layout: int = 0  # the rows kernel's weight layout (core/contract.py ROWS_LAYOUTS)


@dataclass(frozen=True)
class Manifest:
    schema_version: int
    specedge_version: str
    source: dict[str, str]  # {"kind": "gguf"|"hf", "path": ..., "sha256": ...}
    architecture: str
    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    kv_dtype: str
    tokenizer_fingerprint: str
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    chat_template: str | None
    context: int  # capacity C of the KV cache
    widths: tuple[int, ...]  # static sequence widths S the graphs serve
    quantization: Quantization
    graph: str  # the ONNX file, relative to the artifact folder
    files: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> {size, sha256}
    costs: WeightCosts = field(default_factory=WeightCosts)  # bytes the graph's weights cost a pass
    target: str = "cpu"  # the provider the graphs were built for: cpu, qnn or dml
    graphs: dict[int, str] = field(default_factory=dict)  # static targets: width -> its graph file
    attention: str = "exact"  # core/contract.py's ATTENTION: exact, fused (GroupQueryAttention) or rows (native)
    kv_in_place: bool = False  # the graph outputs its updated cache buffers (present_*) to bind in place
    head_vocab: int = 0  # > 0: logits cover only token ids below it (a draft's truncated head)
    next_ids: bool = False  # the graph also outputs next_ids [1,R], the argmax of each logits row
    streams: bool = False  # the graph takes stream_ids [1,S] and caches [N,KV,T,d]: several streams share a pass
    # the source's own sampling defaults (generation_config.json's GENERATION_FIELDS it sets)
    generation: dict[str, float] = field(default_factory=dict)

    @property
    def static(self) -> bool:
        return bool(self.graphs)

    @property
    def rows_exact(self) -> bool:
        """Every row of a pass equals the 1-token step at its position as built (exact attention,
        MatMulNBits blocks of at most 32 or specedge's rows kernel at any block), not necessarily on
        this CPU for MatMulNBits: runtime/engine/row_groups.py probes which groups of rows it keeps exact,
        and a target verifies in those."""
        q = self.quantization
        wide_blocks = q.method in ("int4", "int8") and q.block_size > 32 and q.kernel != "rows"
        return self.attention in ("exact", "rows") and not wide_blocks

    @property
    def native_kernel(self) -> bool:
        """The graph runs ai.specedge::MatMulInt4Rows: CPU sessions need the native library."""
        return self.quantization.kernel == "rows"

    @property
    def in_place(self) -> bool:
        """The pass writes its new cache entries into the buffers bound as past_* and present_*."""
        return self.kv_in_place or self.attention in ("fused", "rows")

    @property
    def logits_vocab(self) -> int:
        """Columns of the logits: the whole vocabulary, or a draft's truncated head."""
        return self.head_vocab or self.vocab_size

    @property
    def prefill_width(self) -> int:
        return max(self.widths)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True)

    @staticmethod
    def from_dict(d: dict[str, Any]) -> Manifest:
        d = dict(d)
        d["quantization"] = Quantization(**{**d["quantization"], "float_tensors": tuple(
            d["quantization"].get("float_tensors", ()))})
        d["eos_token_ids"] = tuple(d["eos_token_ids"])
        d["costs"] = WeightCosts(**d.get("costs", {}))
        d["graphs"] = {int(w): f for w, f in d.get("graphs", {}).items()}
        d["widths"] = tuple(d["widths"])
        return Manifest(**d)


def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def tokenizer_fingerprint(tokenizer_json: str) -> str:
    """A hash of what decides token ids: the model (vocab, merges) and the added tokens."""
    tok = json.loads(tokenizer_json)
    added = sorted((t["id"], t["content"]) for t in tok.get("added_tokens", []))
    canon = json.dumps({"model": tok.get("model"), "added": added}, sort_keys=True)
    return hashlib.sha256(canon.encode()).hexdigest()[:16]


class ManifestFieldError(ValueError):
    """One field of a manifest is missing, of the wrong type or out of range."""

    def __init__(self, name: str, reason: str) -> None:
        self.name = name
        super().__init__(f"field '{name}' {reason}")


def _kind(value: object) -> str:
    return "null" if value is None else type(value).__name__


def check_int(value: object, name: str, lo: int, hi: int) -> int:
    if type(value) is not int:  # bool is an int to Python, not to a manifest
        raise ManifestFieldError(name, f"must be an integer, not {_kind(value)}")
    if not lo <= value <= hi:
        raise ManifestFieldError(name, f"is {value}, outside {lo}..{hi}")
    return value


def check_bool(value: object, name: str) -> bool:
    if type(value) is not bool:
        raise ManifestFieldError(name, f"must be true or false, not {_kind(value)}")
    return value


def check_str(value: object, name: str, max_len: int = 256, choices: tuple[str, ...] = ()) -> str:
    if not isinstance(value, str):
        raise ManifestFieldError(name, f"must be a string, not {_kind(value)}")
    if len(value) > max_len:
        raise ManifestFieldError(name, f"is {len(value)} characters long, more than {max_len}")
    if choices and value not in choices:
        raise ManifestFieldError(name, f"is '{value}', not one of {', '.join(choices)}")
    return value


def check_hex(value: object, name: str, length: int) -> str:
    text = check_str(value, name)
    if len(text) != length or not set(text) <= HEX:
        raise ManifestFieldError(name, f"must be {length} lowercase hex digits")
    return text


def check_list(value: object, name: str, max_len: int = MAX_ITEMS) -> list[Any]:
    if not isinstance(value, list):
        raise ManifestFieldError(name, f"must be a list, not {_kind(value)}")
    if len(value) > max_len:
        raise ManifestFieldError(name, f"has {len(value)} entries, more than {max_len}")
    return value


def check_dict(value: object, name: str, max_len: int = MAX_ITEMS) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ManifestFieldError(name, f"must be an object, not {_kind(value)}")
    if len(value) > max_len:
        raise ManifestFieldError(name, f"has {len(value)} entries, more than {max_len}")
    return value


def check_file_name(value: object, name: str) -> str:
    """A plain file name inside the artifact folder: no folder, no '..', not absolute."""
    text = check_str(value, name)
    if not text or text in (".", "..") or "/" in text or "\\" in text or "\0" in text or ":" in text:
        raise ManifestFieldError(name, f"is '{text}', not a plain file name inside the artifact folder")
    return text


def check_fields(raw: dict[str, Any]) -> None:
    """Every field's presence, type and range; raises ManifestFieldError naming the first bad one."""
    known = {f.name for f in fields(Manifest)}
    required = {f.name for f in fields(Manifest) if f.default is MISSING and f.default_factory is MISSING}
    if unknown := sorted(raw.keys() - known):
        raise ManifestFieldError(unknown[0], "is not a manifest field")
    if missing := sorted(required - raw.keys()):
        raise ManifestFieldError(missing[0], "is missing")
    check_str(raw["specedge_version"], "specedge_version", 64)
    for key, value in check_dict(raw["source"], "source", 16).items():
        if value is not None:
            check_str(value, f"source.{key}", 4096)
    check_str(raw["architecture"], "architecture", 64)
    vocab = check_int(raw["vocab_size"], "vocab_size", 1, MAX_VOCAB)
    check_int(raw["hidden_size"], "hidden_size", 1, MAX_HIDDEN)
    check_int(raw["num_layers"], "num_layers", 1, MAX_LAYERS)
    heads = check_int(raw["num_heads"], "num_heads", 1, MAX_HEADS)
    kv_heads = check_int(raw["num_kv_heads"], "num_kv_heads", 1, heads)
    if heads % kv_heads:
        raise ManifestFieldError("num_kv_heads", f"is {kv_heads}, which does not divide num_heads {heads}")
    check_int(raw["head_dim"], "head_dim", 1, MAX_HEAD_DIM)
    check_str(raw["kv_dtype"], "kv_dtype", choices=KV_DTYPES)
    check_hex(raw["tokenizer_fingerprint"], "tokenizer_fingerprint", 16)
    if raw["bos_token_id"] is not None:
        check_int(raw["bos_token_id"], "bos_token_id", 0, vocab - 1)
    for token in check_list(raw["eos_token_ids"], "eos_token_ids"):
        check_int(token, "eos_token_ids", 0, vocab - 1)
    if raw["chat_template"] is not None:
        check_str(raw["chat_template"], "chat_template", MAX_TEMPLATE_CHARS)
    context = check_int(raw["context"], "context", 1, MAX_CONTEXT)
    widths = check_list(raw["widths"], "widths")
    for width in widths:
        check_int(width, "widths", 1, context)
    if 1 not in widths:
        raise ManifestFieldError("widths", f"is {widths}, without width 1")
    check_quantization(raw["quantization"])
    check_files(raw)
    for key, value in check_dict(raw.get("generation", {}), "generation", 16).items():
        if key not in GENERATION_FIELDS:
            raise ManifestFieldError(f"generation.{key}", "is not a sampling default")
        low, high = GENERATION_FIELDS[key]
        if type(value) not in (int, float) or not low <= value <= high:
            raise ManifestFieldError(f"generation.{key}", f"must be a number from {low:g} to {high:g}")
    costs = check_dict(raw.get("costs", {}), "costs", 16)
    if unknown := sorted(costs.keys() - {f.name for f in fields(WeightCosts)}):
        raise ManifestFieldError(f"costs.{unknown[0]}", "is not a cost field")
    for key, value in costs.items():
        check_int(value, f"costs.{key}", 0, MAX_FILE_BYTES)
    check_str(raw.get("target", "cpu"), "target", choices=TARGETS)
    check_str(raw.get("attention", "exact"), "attention", choices=ATTENTION)
    check_bool(raw.get("kv_in_place", False), "kv_in_place")
    check_bool(raw.get("next_ids", False), "next_ids")
    check_bool(raw.get("streams", False), "streams")
    check_int(raw.get("head_vocab", 0), "head_vocab", 0, vocab)


def check_quantization(value: object) -> None:
    q = check_dict(value, "quantization", 10)
    if unknown := sorted(q.keys() - {f.name for f in fields(Quantization)}):
        raise ManifestFieldError(f"quantization.{unknown[0]}", "is not a quantization field")
    if missing := [name for name in ("method", "bits", "block_size", "accuracy_level") if name not in q]:
        raise ManifestFieldError(f"quantization.{missing[0]}", "is missing")
    check_str(q["method"], "quantization.method", choices=tuple(QUANT_BITS))
    if q["bits"] not in QUANT_BITS_ALLOWED or type(q["bits"]) is not int:
        raise ManifestFieldError("quantization.bits", f"is {q['bits']!r}, not one of {QUANT_BITS_ALLOWED}")
    check_int(q["block_size"], "quantization.block_size", 0, 1 << 16)
    check_int(q["accuracy_level"], "quantization.accuracy_level", 0, 4)
    check_bool(q.get("int8_weights", False), "quantization.int8_weights")
    check_str(q.get("kernel", "nbits"), "quantization.kernel", choices=INT4_KERNELS)
    check_int(q.get("layout", 0), "quantization.layout", 0, 1 << 16)
    if q.get("kernel", "nbits") == "rows" and (q["method"] != "int4" or q.get("layout") not in ROWS_LAYOUTS):
        raise ManifestFieldError("quantization.layout", f"is {q.get('layout')!r}: weights packed for another "
                                 f"release of specedge's int4 kernel (this one reads layouts "
                                 f"{', '.join(map(str, ROWS_LAYOUTS))})")
    for tensor in check_list(q.get("float_tensors", []), "quantization.float_tensors", 1 << 16):
        check_str(tensor, "quantization.float_tensors", 1024)


def check_files(raw: dict[str, Any]) -> None:
    """`files` lists each file's size and sha256 under a plain name; every file the runtime opens
    (the graph or graphs, the tokenizer) is one of them."""
    files = check_dict(raw.get("files", {}), "files")
    for name, meta in files.items():
        check_file_name(name, "files")
        meta = check_dict(meta, f"files.{name}", 2)
        if meta.keys() != {"size", "sha256"}:
            raise ManifestFieldError(f"files.{name}", "must hold exactly size and sha256")
        check_int(meta["size"], f"files.{name}.size", 0, MAX_FILE_BYTES)
        check_hex(meta["sha256"], f"files.{name}.sha256", 64)
    if TOKENIZER_NAME not in files:
        raise ManifestFieldError("files", f"does not list {TOKENIZER_NAME}")
    referenced = [("graph", raw["graph"])]
    for width, graph in check_dict(raw.get("graphs", {}), "graphs").items():
        if not (width.isascii() and width.isdigit() and len(width) <= 8):
            raise ManifestFieldError("graphs", f"has the key {width[:20]!r}, not a width")
        check_int(int(width), "graphs", 1, raw["context"])
        referenced.append((f"graphs.{width}", graph))
    for name, file in referenced:
        check_file_name(file, name)
        if file not in files:
            raise ManifestFieldError(name, f"names {file}, which is not listed (with its checksum) in files")


def check_inside(folder: Path, manifest: Manifest) -> None:
    """No listed file is a link out of the artifact folder (its names are plain names in it)."""
    root = folder.resolve()
    for name in manifest.files:
        path = folder / name
        if not path.is_symlink():
            continue
        try:
            real = path.resolve(strict=True)
        except (OSError, RuntimeError):  # dangling, or a loop of links
            real = None
        if real is None or root not in real.parents:
            raise DamagedArtifactError(
                folder, f"{path} is a link to {real or 'nothing'}, outside the artifact {folder}",
                "an artifact holds its own files")


def load_manifest(folder: Path, verify: bool = True) -> Manifest:
    """Read an artifact's manifest and check every field's type and range and that the files it
    names are plain names listed in `files`; with verify, also each listed file's size and sha256,
    and that tokenizer.json has the fingerprint the manifest claims."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecEdgeError(f"artifact folder {folder} does not exist",
                            "pass the folder written by `specedge export`")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise SpecEdgeError(f"{folder} has no {MANIFEST_NAME}, so it is not a specedge artifact",
                            "export the model with `specedge export --model SRC --out DIR`")
    manifest = parse_manifest(path)
    check_inside(folder, manifest)
    if verify:
        verify_files(folder, manifest)
        verify_tokenizer(folder, manifest)
    return manifest


def manifest_fields(folder: Path) -> dict[str, Any] | None:
    """The fields of `folder`'s manifest.json as written, unchecked (None: it has none): a peek at one
    field before a manifest is loaded and checked (`load_manifest`), or of a folder that may not be an
    artifact. A file that is not a JSON object of a sane size raises DamagedArtifactError."""
    path = Path(folder) / MANIFEST_NAME
    if not path.is_file():
        return None
    try:
        if path.stat().st_size > MAX_MANIFEST_BYTES:
            raise DamagedArtifactError(path.parent, f"{path} is {path.stat().st_size} bytes, too large for a manifest")
        raw = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise DamagedArtifactError(path.parent, f"{path} is not a valid manifest ({e})") from None
    if not isinstance(raw, dict):
        raise DamagedArtifactError(path.parent, f"{path} is not a valid manifest (a JSON {_kind(raw)}, not an object)")
    return raw


def parse_manifest(path: Path) -> Manifest:
    def damaged(problem: str, why: str = "") -> DamagedArtifactError:
        return DamagedArtifactError(path.parent, problem, why)

    if not path.is_file():
        raise damaged(f"{path} is not a valid manifest (there is no such file)")
    raw = manifest_fields(path.parent)
    assert raw is not None
    if raw.get("schema_version") != SCHEMA_VERSION or type(raw.get("schema_version")) is not int:
        raise damaged(f"{path} has schema version {raw.get('schema_version')!r}, this specedge reads "
                      f"{SCHEMA_VERSION}", "it was written by another version of specedge")
    try:
        check_fields(raw)
        return Manifest.from_dict(raw)
    except ManifestFieldError as e:
        raise damaged(f"{path} is not a valid manifest: {e}") from None
    except (TypeError, KeyError, ValueError) as e:  # checked above; a safety net
        raise damaged(f"{path} is not a valid manifest ({type(e).__name__}: {e})") from None


def verify_files(folder: Path, manifest: Manifest) -> None:
    for name, meta in manifest.files.items():
        f = folder / name
        if not f.is_file():
            raise DamagedArtifactError(folder, f"artifact {folder} is missing {name}", "the artifact is incomplete")
        if f.stat().st_size != meta["size"] or sha256_file(f) != meta["sha256"]:
            raise DamagedArtifactError(folder, f"checksum of {folder / name} does not match its manifest",
                                       "the file is corrupted or was changed")


def verify_tokenizer(folder: Path, manifest: Manifest) -> None:
    """tokenizer.json decides the token ids: its fingerprint must be the one the manifest (and a
    draft's check against its target) relies on."""
    path = folder / TOKENIZER_NAME
    try:
        found = tokenizer_fingerprint(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise DamagedArtifactError(folder, f"{path} is not a readable tokenizer ({type(e).__name__}: {e})") from None
    if found != manifest.tokenizer_fingerprint:
        raise DamagedArtifactError(folder, f"{path} has the fingerprint {found}, not the "
                                           f"{manifest.tokenizer_fingerprint} its manifest records",
                                   "the tokenizer was swapped or edited")
