"""Export a source checkpoint to a specedge artifact folder, atomically."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

from specedge import __version__
from specedge.core.contract import TOKENIZER_NAME
from specedge.core.errors import SpecEdgeError
from specedge.core.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    Manifest,
    ManifestFieldError,
    Quantization,
    check_fields,
    load_manifest,
    sha256_file,
    tokenizer_fingerprint,
)
from specedge.core.progress import Progress
from specedge.export.decoder_graph import DecoderBuilder
from specedge.export.onnx_writer import GraphWriter
from specedge.export.quantize import QuantSpec
from specedge.export.replace import KEEP_FIX, listed_files, recover, replace_artifact
from specedge.export.settings import QUANT_BITS, ExportSettings
from specedge.export.source import SourceModel, inspect_source, load_source
from specedge.export.source_check import SourceSummary
from specedge.export.source_config import DecoderConfig
from specedge.models.locks import ensure_space, ensure_writable, exclusive, is_disk_full, remove_scratch

GRAPH_FILE = "model.onnx"
DATA_FILE = "model.onnx.data"
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


def build_graph(source: SourceModel, settings: ExportSettings, folder: Path) -> DecoderBuilder:
    """The symbolic-width graph: folder/model.onnx + folder/model.onnx.data."""
    quant = "fp32" if settings.quant == "qdq" else settings.quant  # QDQ is applied to the float graph
    spec = QuantSpec(quant, settings.block_size, settings.accuracy_level, settings.int8_weights, settings.int4_kernel,
                     settings.rows_layout)
    writer = GraphWriter(folder / DATA_FILE)
    builder = DecoderBuilder(writer, source, spec, settings.context, fused=not settings.static,
                             fp16=settings.fp16, attention=settings.attention, kv_in_place=not settings.static,
                             head_vocab=settings.head_vocab, next_ids=not settings.static,
                             int8_embedding=settings.int8_embedding)
    try:
        with Progress(source.config.num_layers, f"exporting {source.path.name}", unit="layer") as bar:
            builder.build(on_layer=lambda _i: bar.update(1))
        model = writer.finish(f"specedge_{source.config.architecture}")
    except BaseException:
        writer.abort()
        raise
    (folder / GRAPH_FILE).write_bytes(model.SerializeToString())
    return builder


def write_static_graphs(source: SourceModel, settings: ExportSettings, folder: Path) -> dict[int, str]:
    """Static targets: one fixed-shape graph per width, all reading folder/model.onnx.data. The
    norms are first made fp16-safe (QNN's HTP runs float ops in fp16, int4 MatMulNBits included; a
    DirectML graph stays fp16-ready), with --quant qdq the MatMuls QDQ-quantized, and a DirectML
    graph rewritten for opset 17; unsupported ops, dynamic shapes, or a float tensor whose
    calibrated range overflows fp16 stop the export."""
    import onnx

    from specedge.export.checker import DML_MAX_OPSET, check_graph, fp16_overflows
    from specedge.export.static_graphs import fix_dims, graph_name, logits_rows, to_opset

    base = folder / GRAPH_FILE
    problems: list[str] = []
    if settings.static:  # the HTP runs float ops in fp16; a DirectML graph is checked for fp16 too
        from specedge.export.qdq import CALIBRATION_TEXT, calibration_feeds, float_ranges, quantize_qdq

        cfg = source.config
        tok = _tokenizer(source)
        texts = [tok.encode(t).ids[:settings.context - 1] for t in CALIBRATION_TEXT]
        feeds = calibration_feeds(base, texts, cfg.num_layers,
                                  cfg.num_kv_heads, cfg.head_dim)
        _make_fp16_safe(base, feeds)  # every text from its first token on: position 0 is where ranges peak
        if settings.quant == "qdq":
            qdq_dir = folder / "qdq"
            qdq_dir.mkdir()
            quantize_qdq(base, qdq_dir / GRAPH_FILE, feeds)
            (qdq_dir / DATA_FILE).replace(folder / DATA_FILE)
            (qdq_dir / GRAPH_FILE).replace(base)
            qdq_dir.rmdir()
        model = onnx.load(str(base), load_external_data=False)
        problems += [str(p) for p in fp16_overflows(float_ranges(base, feeds), model)]
    proto = onnx.load(str(base), load_external_data=False)
    graphs = {}
    for width in settings.widths:
        fixed = fix_dims(proto, width, settings.context, logits_rows(width))
        if settings.target == "dml":
            fixed = to_opset(fixed, DML_MAX_OPSET)
        problems += [f"width {width}: {p}" for p in check_graph(fixed, settings.target)]
        (folder / graph_name(width)).write_bytes(fixed.SerializeToString())
        graphs[width] = graph_name(width)
    base.unlink()
    if problems:
        shown = "; ".join(problems[:12]) + (f"; and {len(problems) - 12} more" if len(problems) > 12 else "")
        where = "QNN's HTP backend" if settings.target == "qnn" else "DirectML"
        raise SpecEdgeError(f"the graph cannot run on {where}: {shown}",
                            "this architecture needs ops the provider lacks, or activations beyond fp16; "
                            "export for cpu instead")
    return graphs


def _make_fp16_safe(graph: Path, feeds: list) -> None:
    """Rewrite the graph's RMSNorms to stay inside fp16 on the HTP (export/fp16_safe.py), in place;
    their prescales from the norms' input ranges over the calibration feeds."""
    import onnx

    from specedge.export.fp16_safe import norm_inputs, safe_rms_norms
    from specedge.export.qdq import float_ranges

    model = onnx.load(str(graph), load_external_data=False)
    if safe_rms_norms(model, float_ranges(graph, feeds, only=norm_inputs(model))):
        graph.write_bytes(model.SerializeToString())


def _tokenizer(source: SourceModel):
    from tokenizers import Tokenizer

    return Tokenizer.from_str(source.tokenizer_json)


def write_artifact(source: SourceModel, settings: ExportSettings, folder: Path) -> Manifest:
    """Build the graph(s) and everything beside them into `folder` (which must exist and be empty)."""
    builder = build_graph(source, settings, folder)
    graphs = write_static_graphs(source, settings, folder) if settings.static else {}
    costs = builder.costs
    if settings.quant == "qdq":  # uint8 weights with per-channel scales
        costs = dataclasses.replace(costs, matmul_bytes=costs.matmul_params, head_bytes=costs.head_bytes // 4)
    spec = QuantSpec("fp32" if settings.quant == "qdq" else settings.quant, settings.block_size,
                     settings.accuracy_level)
    (folder / TOKENIZER_NAME).write_text(source.tokenizer_json)
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
        kv_dtype="float16" if settings.attention == "rows" else "float32",
        tokenizer_fingerprint=tokenizer_fingerprint(source.tokenizer_json),
        bos_token_id=source.bos_token_id,
        eos_token_ids=source.eos_token_ids,
        chat_template=source.chat_template,
        generation=dict(source.generation),
        context=settings.context,
        widths=tuple(sorted(set(settings.widths))),
        quantization=Quantization(
            method=settings.quant, bits=QUANT_BITS[settings.quant],
            block_size=spec.block_size if spec.quantized and not spec.dynamic else 0,  # w8a8: per channel
            accuracy_level=spec.accuracy_level if spec.quantized and not spec.dynamic else 0,
            float_tensors=tuple(builder.float_tensors) if settings.quant != "fp32" else (),
            int8_weights=settings.int8_weights,
            kernel=settings.int4_kernel,
            layout=settings.rows_layout),
        graph=graphs[min(graphs)] if graphs else GRAPH_FILE,
        costs=costs,
        target=settings.target,
        graphs=graphs,
        attention=settings.attention,
        kv_in_place=builder.kv_in_place,
        head_vocab=settings.head_vocab,
        next_ids=builder.next_ids,
        streams=builder.streams,
        files={name: {"size": (folder / name).stat().st_size, "sha256": sha256_file(folder / name)}
               for name in (*(graphs.values() if graphs else [GRAPH_FILE]), DATA_FILE, TOKENIZER_NAME)},
    )
    check_before_writing(manifest, source)
    (folder / MANIFEST_NAME).write_text(manifest.to_json())
    return manifest


def check_before_writing(manifest: Manifest, source: SourceModel) -> None:
    """The manifest passes the checks the runtime applies when it loads one, before it is written:
    no export succeeds that cannot load (the source's checks should have refused it earlier)."""
    try:
        check_fields(json.loads(manifest.to_json()))
    except ManifestFieldError as e:
        raise SpecEdgeError(f"the export of {source.path} would write an artifact that cannot load: "
                            f"its manifest's {e}", "the checkpoint's config does not fit specedge's limits; "
                            "nothing was written") from None


# bytes an export writes per weight value, by format (scales and zero points included, rounded up);
# qdq writes the float graph first and the quantized one beside it
BYTES_PER_WEIGHT = {"fp32": 4.0, "qdq": 5.0, "int8": 1.3, "w8a8": 1.1, "int4": 0.75}


def estimated_bytes(summary: SourceSummary, settings: ExportSettings) -> int:
    """What the artifact will take on disk, from above: the embedding (int8 rows in a quantized CPU
    graph, else float32) plus a quantized head."""
    per = BYTES_PER_WEIGHT[settings.quant] / (2 if settings.fp16 else 1)
    table = 1.1 if settings.int8_embedding else 4
    body = (summary.weights - summary.embedding) * per + summary.embedding * (table + per)
    return int(body * 1.1) + (64 << 20)


def check_out(out: Path, overwrite: bool) -> None:
    """`out` may be a new path, an empty folder, or (with overwrite) a specedge artifact - never
    anything else: --force replaces an artifact's files, not a user's folder (export/replace.py)."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise SpecEdgeError(f"--out {out} is a file, not a folder", "pass a new folder for the artifact")
    if not out.is_dir() or not any(out.iterdir()):
        return
    if not (out / MANIFEST_NAME).is_file():
        raise SpecEdgeError(f"{out} exists and is not a specedge artifact (it has no {MANIFEST_NAME})", KEEP_FIX)
    listed_files(out)  # a manifest.json that is not specedge's is no artifact's
    if not overwrite:
        raise SpecEdgeError(f"{out} already exists", "choose another --out or pass --force to replace it")
    if Path.cwd().resolve().is_relative_to(out):
        raise SpecEdgeError(f"--out {out} holds the working directory", "run the export from another folder")


BLOCK_SIZES = (32, 64, 128)


def matrix_inputs(cfg: DecoderConfig) -> tuple[tuple[str, int], ...]:
    """The input sizes of a model's matrices (what a quantization block must divide), named."""
    return (("hidden size", cfg.hidden_size), ("attention size", cfg.num_heads * cfg.head_dim),
            ("MLP size", cfg.intermediate_size))


def largest_block(src: Path, most: int) -> int:
    """The largest quantization block up to `most` that divides every matrix of the source (32 if none does:
    the export then says what fits)."""
    source = load_source(src)
    source.weights.close()
    fits = [b for b in BLOCK_SIZES if b <= most and all(k % b == 0 for _, k in matrix_inputs(source.config))]
    return fits[-1] if fits else BLOCK_SIZES[0]


def check_context(source: SourceModel, settings: ExportSettings) -> None:
    """No more positions than the model was trained for (where its config says): rotary embeddings
    past them are positions it never saw."""
    trained = source.config.trained_context
    if trained and settings.context > trained:
        raise SpecEdgeError(f"context {settings.context} is more than the {trained} tokens the model was trained for",
                            f"pass --context (-c) {trained} or less")


def check_attention(source: SourceModel, settings: ExportSettings) -> None:
    """The native attention takes heads of 16 to 512 dimensions, in steps of 16."""
    d = source.config.head_dim
    if settings.attention == "rows" and (d % 16 or not 16 <= d <= 512):
        raise SpecEdgeError(f"the model's heads have {d} dimensions; --attention rows takes multiples of 16 up to 512",
                            "export with --attention exact")


def check_blocks(source: SourceModel, settings: ExportSettings) -> None:
    """Block-quantized weights need every matrix's input size (hidden, attention, MLP) to be a
    whole number of blocks."""
    if settings.quant not in ("int4", "int8"):
        return
    sizes = matrix_inputs(source.config)
    for what, k in sizes:
        if k % settings.block_size:
            fits = [b for b in BLOCK_SIZES if all(size % b == 0 for _, size in sizes)]
            raise SpecEdgeError(f"the model's {what} {k} is not a whole number of --block-size {settings.block_size} "
                                "blocks", f"pass --block-size {fits[-1]}" if fits else "export with --quant fp32")


def resolve_out(out: Path) -> Path:
    """--out as an absolute path, its links followed; a loop of links is one line."""
    try:
        return out.resolve()
    except (RuntimeError, OSError) as e:  # Python 3.11 raises RuntimeError for a loop, 3.13 OSError
        raise SpecEdgeError(f"--out {out} cannot be followed: {e}",
                            "pass a new folder for the artifact (not a loop of symbolic links)") from None


def export_model(src: Path, out: Path, settings: ExportSettings | None = None, overwrite: bool = False,
                 expected_sha256: str | None = None, reuse: bool = False) -> ExportResult:
    """Export `src` (HF folder or .gguf) to the artifact folder `out`.

    The artifact is built in a hidden sibling folder and renamed into place at the end, so `out`
    either holds a complete, checked artifact or the one it held before. One process exports to
    `out` at a time: another fails at once, or with `reuse` (a cache) waits and takes its result.
    expected_sha256: the digest the source must have (a registry model's).
    """
    settings = settings or ExportSettings()
    settings.validate()
    out = resolve_out(Path(out))
    check_out(out, overwrite or reuse)
    summary = inspect_source(Path(src))
    ensure_writable(out.parent)
    ensure_space(out.parent, estimated_bytes(summary, settings), f"exporting {Path(src).name}")
    with exclusive(out, "exporting", wait=reuse):
        recover(out)  # a replacement killed half-way: the old folder put back, or emptied
        if reuse and (out / MANIFEST_NAME).is_file():  # built by the process we waited for
            return ExportResult(out, load_manifest(out, verify=False), 0.0, peak_rss_bytes())
        check_out(out, overwrite)
        return _export_locked(Path(src), out, settings, expected_sha256, summary)


def _export_locked(src: Path, out: Path, settings: ExportSettings, expected_sha256: str | None,
                   summary: SourceSummary) -> ExportResult:
    start = time.perf_counter()
    remove_scratch(out.parent, f".{glob.escape(out.name)}{PARTIAL_MARK}*")  # left by killed exports
    source = load_source(src, expected_sha256, checked=summary)
    if settings.head_vocab >= source.config.vocab_size:
        raise SpecEdgeError(f"--head-vocab {settings.head_vocab} is not below the model's vocabulary of "
                            f"{source.config.vocab_size} tokens", "pass a smaller N, or leave it out")
    check_blocks(source, settings)
    check_context(source, settings)
    check_attention(source, settings)
    partial = out.parent / f".{out.name}{PARTIAL_MARK}{os.getpid()}"
    partial.mkdir()
    try:
        manifest = write_artifact(source, settings, partial)
        del source
        replace_artifact(partial, out)
    except OSError as e:
        shutil.rmtree(partial, ignore_errors=True)
        if is_disk_full(e):
            raise SpecEdgeError(f"the disk holding {out.parent} filled up during the export",
                                "free some space, or export to another disk; nothing was left behind") from None
        raise
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExportResult(out, manifest, time.perf_counter() - start, peak_rss_bytes())

