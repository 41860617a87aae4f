"""Export a source checkpoint to a specedge artifact folder, atomically."""

from __future__ import annotations

import contextlib
import os
import resource
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from specedge import __version__
from specedge.errors import SpecEdgeError
from specedge.export.decoder_graph import DecoderBuilder
from specedge.export.onnx_writer import GraphWriter
from specedge.export.quantize import QuantSpec
from specedge.export.settings import ExportSettings
from specedge.export.source import SourceModel, load_source
from specedge.runtime.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Manifest,
    Quantization,
    sha256_file,
    tokenizer_fingerprint,
)

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
TOKENIZER_FILE = "tokenizer.json"
PARTIAL_MARK = ".partial-"


@dataclass(frozen=True)
class ExportResult:
    path: Path
    manifest: Manifest
    seconds: float
    peak_rss_bytes: int


def peak_rss_bytes() -> int:
    """Peak resident memory of this process (and of finished children), in bytes."""
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, kids) * 1024


def _remove_stale_partials(out: Path) -> None:
    """Delete half-written exports of `out` left by processes that no longer run."""
    for p in out.parent.glob(f".{out.name}{PARTIAL_MARK}*"):
        pid = p.name.rsplit(PARTIAL_MARK, 1)[-1]
        alive = True
        try:
            os.kill(int(pid), 0)
        except (ValueError, ProcessLookupError):
            alive = False
        except PermissionError:
            pass
        if not alive:
            shutil.rmtree(p, ignore_errors=True)


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover - tqdm comes with the export extra
        return contextlib.nullcontext(type("Bar", (), {"update": lambda self, n=1: None})())
    return tqdm(total=total, desc=desc, unit="layer", file=sys.stderr, leave=False,
                disable=not sys.stderr.isatty())


def write_artifact(source: SourceModel, settings: ExportSettings, folder: Path) -> Manifest:
    """Build the graph and everything beside it into `folder` (which must exist and be empty)."""
    spec = QuantSpec(settings.quant, settings.block_size, settings.accuracy_level)
    writer = GraphWriter(folder / DATA_FILE)
    builder = DecoderBuilder(writer, source, spec, settings.context)
    try:
        with _progress(source.config.num_layers, f"export {source.path.name}") as bar:
            builder.build(on_layer=lambda _i: bar.update(1))
        model = writer.finish(f"specedge_{source.config.architecture}")
    except BaseException:
        writer.abort()
        raise
    (folder / GRAPH_FILE).write_bytes(model.SerializeToString())
    (folder / TOKENIZER_FILE).write_text(source.tokenizer_json)
    cfg = source.config
    manifest = Manifest(
        schema_version=SCHEMA_VERSION,
        specedge_version=__version__,
        source={"kind": source.kind, "path": str(source.path), "sha256": source.sha256},
        architecture=cfg.architecture,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        kv_dtype="float32",
        tokenizer_fingerprint=tokenizer_fingerprint(source.tokenizer_json),
        bos_token_id=source.bos_token_id,
        eos_token_ids=source.eos_token_ids,
        chat_template=source.chat_template,
        context=settings.context,
        widths=tuple(sorted(set(settings.widths))),
        quantization=Quantization(
            method=spec.method, bits=spec.bits,
            block_size=spec.block_size if spec.quantized else 0,
            accuracy_level=spec.accuracy_level if spec.quantized else 0,
            float_tensors=tuple(builder.float_tensors) if spec.quantized else ()),
        graph=GRAPH_FILE,
        costs=builder.costs,
        files={name: {"size": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
               for name in (GRAPH_FILE, DATA_FILE, TOKENIZER_FILE)},
    )
    (folder / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def export_model(src: Path, out: Path, settings: ExportSettings | None = None,
                 overwrite: bool = False) -> ExportResult:
    """Export `src` (HF folder or .gguf) to the artifact folder `out`.

    The artifact is built in a hidden sibling folder and renamed into place at the end, so `out`
    either holds a complete, checked artifact or does not exist.
    """
    settings = settings or ExportSettings()
    settings.validate()
    out = Path(out).resolve()
    if out.exists() and not overwrite:
        raise SpecEdgeError(f"{out} already exists", "choose another --out or pass --force to replace it")
    start = time.perf_counter()
    source = load_source(Path(src))
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_partials(out)
    partial = out.parent / f".{out.name}{PARTIAL_MARK}{os.getpid()}"
    partial.mkdir()
    try:
        manifest = write_artifact(source, settings, partial)
        del source
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExportResult(out, manifest, time.perf_counter() - start, peak_rss_bytes())

