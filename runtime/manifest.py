"""The artifact manifest: what export promises and what the runtime checks before trusting it."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from specedge.errors import SpecEdgeError
from specedge.runtime.traffic import WeightCosts

SCHEMA_VERSION = 1
MANIFEST_NAME = "manifest.json"


@dataclass(frozen=True)
class Quantization:
    method: str  # "fp32", "int8", "int4", "w8a8", "qdq"
    bits: int  # 32, 8 or 4
    block_size: int  # 0 for fp32
    accuracy_level: int  # MatMulNBits accuracy_level (4: int8 activations), 0 for fp32
    float_tensors: tuple[str, ...] = ()  # what was left in float


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
    attention: str = "exact"  # "fused": GroupQueryAttention, cache updated in place, rows not exact
    kv_in_place: bool = False  # the graph outputs its updated cache buffers (present_*) to bind in place
    head_vocab: int = 0  # > 0: logits cover only token ids below it (a draft's truncated head)
    next_ids: bool = False  # the graph also outputs next_ids [1,R], the argmax of each logits row

    @property
    def static(self) -> bool:
        return bool(self.graphs)

    @property
    def rows_exact(self) -> bool:
        """Every row of a pass equals the 1-token step at its position, as built: a lossless target.
        Fused attention and MatMulNBits blocks above 32 compute a lone row by another kernel than
        rows in pairs; such a target verifies in row groups (runtime/row_groups.py)."""
        q = self.quantization
        wide_blocks = q.method in ("int4", "int8") and q.block_size > 32
        return self.attention == "exact" and not wide_blocks

    @property
    def in_place(self) -> bool:
        """The pass writes its new cache entries into the buffers bound as past_* and present_*."""
        return self.kv_in_place or self.attention == "fused"

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


def load_manifest(folder: Path, verify: bool = True) -> Manifest:
    """Read an artifact's manifest; with verify, check every listed file's size and sha256."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SpecEdgeError(f"artifact folder {folder} does not exist",
                            "pass the folder written by `specedge export`")
    path = folder / MANIFEST_NAME
    if not path.is_file():
        raise SpecEdgeError(f"{folder} has no {MANIFEST_NAME}, so it is not a specedge artifact",
                            "export the model with `specedge export --model SRC --out DIR`")
    try:
        raw = json.loads(path.read_text())
        if raw.get("schema_version") != SCHEMA_VERSION:
            raise SpecEdgeError(
                f"{path} has schema version {raw.get('schema_version')}, this specedge reads "
                f"{SCHEMA_VERSION}", "re-export the model with this version of specedge")
        manifest = Manifest.from_dict(raw)
    except (json.JSONDecodeError, TypeError, KeyError) as e:
        raise SpecEdgeError(f"{path} is not a valid manifest ({e})",
                            "re-export the model with `specedge export`") from None
    if verify:
        verify_files(folder, manifest)
    return manifest


def verify_files(folder: Path, manifest: Manifest) -> None:
    for name, meta in manifest.files.items():
        f = folder / name
        if not f.is_file():
            raise SpecEdgeError(f"artifact {folder} is missing {name}",
                                "re-export the model; the artifact is incomplete")
        if f.stat().st_size != meta["size"] or sha256_file(f) != meta["sha256"]:
            raise SpecEdgeError(f"checksum of {folder / name} does not match its manifest",
                                "the file is corrupted or was changed; re-export the model")
