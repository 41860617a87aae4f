"""Registry names -> ready artifacts: fetch the weights and export them on first use."""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from specedge.core.contract import MANIFEST_NAME
from specedge.core.errors import DamagedArtifactError, SpecEdgeError
from specedge.core.manifest import manifest_fields
from specedge.export.cache import artifact_path, is_exported
from specedge.export.settings import ExportSettings, int4_kernel_here, int8_weights_here
from specedge.models.fetch import fetch
from specedge.models.locks import reading
from specedge.models.paths import artifacts_dir
from specedge.models.registry import ExportDefaults, ModelEntry, get_model


def export_settings(entry: ModelEntry, quant: str | None = None, context: int | None = None) -> ExportSettings:
    """The settings a registry model is exported with here (context: the registry's, else this)."""
    export = entry.export_for(quant)
    kernel = int4_kernel_here(export.quant)
    attention = export.rows_attention if kernel == "rows" and export.rows_attention else export.attention
    return ExportSettings(quant=export.quant, context=context or export.context, block_size=export.block_size,
                          attention=attention, head_vocab=export.head_vocab,
                          int8_weights=int8_weights_here(export.quant), int4_kernel=kernel)


def why_again(label: str, settings: ExportSettings) -> str:
    """Why a rows-kernel int4 export is made where an int4 export of the model is cached already."""
    if settings.int4_kernel != "rows":
        return ""
    for manifest in artifacts_dir().glob(f"{label}-int4-*/{MANIFEST_NAME}"):
        try:
            q = (manifest_fields(manifest.parent) or {}).get("quantization", {})
        except DamagedArtifactError:
            continue
        if q.get("kernel", "nbits") != "rows":
            return " for specedge's native int4 kernel (the cached int4 export runs MatMulNBits)"
        if q.get("layout") != settings.rows_layout:
            return (f" for this machine's int4 weight layout ({settings.rows_layout}; the cached export "
                    f"has {q.get('layout')})")
    return ""


def cached_artifact(name: str, quant: str | None = None, context: int | None = None) -> Path:
    entry = get_model(name)
    return artifact_path(entry.name, entry.sha256, export_settings(entry, quant, context))


def resolve_model(name: str, quant: str | None = None, context: int | None = None) -> Path:
    """The artifact of a registry model in `quant` (default: the registry's first export), fetching
    and exporting what is missing. Which export decodes fastest here is policy, not mechanism:
    specedge/defaults.py chooses it and asks for it by quant. context: tokens the export holds
    (default: the registry's; each capacity is its own cached export)."""
    entry = get_model(name)
    settings = export_settings(entry, quant, context)
    out = artifact_path(entry.name, entry.sha256, settings)
    if is_exported(out):
        return mark_used(out)
    with held_weights(entry) as weights:
        return mark_used(export_once(weights, out, settings, f"{name} ({settings.quant}, context "
                                                             f"{settings.context}){why_again(entry.name, settings)}",
                                     entry.sha256))


@contextlib.contextmanager
def held_weights(entry: ModelEntry, weights: Path | None = None) -> Iterator[Path]:
    """The verified weights file of `entry` (`weights` if just fetched), held shared for the block:
    `specedge rm --weights` waits for an export reading them. A removal between the fetch and the
    hold is seen inside it, and the weights fetched again."""
    for _ in range(3):
        path = weights or fetch(entry.name)
        with reading(path, "exporting"):
            if path.exists():
                yield path
                return
        weights = None
    raise SpecEdgeError(f"the weights of {entry.name} were removed each time they were fetched",
                        "stop the other specedge process removing them (specedge rm --weights), then try again")


def mark_used(artifact: Path) -> Path:
    """Note that a cached export is used now (its folder's time: `specedge models` shows it as last use)."""
    with contextlib.suppress(OSError):  # a read-only cache: no note, nothing else changes
        os.utime(artifact)
    return artifact


def export_once(src: Path, out: Path, settings: ExportSettings, what: str, expected_sha256: str | None = None) -> Path:
    """Export `src` to the cache folder `out`, saying so (and what it took) on stderr."""
    try:
        from specedge.export.artifact import export_model
    except ImportError as e:
        raise SpecEdgeError(f"{what} is not exported yet and this installation cannot export ({e.name} missing)",
                            "pip install 'specedge[export]', or export on another machine") from None
    print(f"exporting {what} to {out} - once", file=sys.stderr)
    result = export_model(src, out, settings, expected_sha256=expected_sha256, reuse=True)
    if result.seconds:
        print(f"exported in {result.seconds:.0f} s, peak memory {result.peak_rss_bytes / 2**30:.1f} GiB",
              file=sys.stderr)
    return out


# a checkpoint of the user's own, exported as a target as the registry's int4 target is: int4
# (block 128, or the largest that divides its matrices), row-exact on specedge's kernel with its
# native attention where it is used, else MatMulNBits
SOURCE_CONTEXT_STEP = 64  # a source's default context, where it was trained for less than 4096: a whole block
SOURCE_EXPORT = ExportDefaults(quant="int4", context=4096, block_size=128, attention="fused", rows_attention="rows")


def source_artifact(src: Path, label: str | None = None, context: int | None = None) -> Path:
    """The cached export of a GGUF file or Hugging Face checkpoint folder (exported on first use,
    keyed by the source's sha256 and the settings, as a registry model's; block 0 in the key: the
    largest that fits). label: the name its folder starts with (default: the file's or folder's)."""
    from specedge.export.source import inspect_source, source_digest

    summary = inspect_source(src)
    if context is None:  # the default, or fewer where the model was trained for fewer positions
        trained = summary.trained_context
        context = min(SOURCE_EXPORT.context, trained - trained % SOURCE_CONTEXT_STEP) if trained else None
    context = context or SOURCE_EXPORT.context
    kernel = int4_kernel_here(SOURCE_EXPORT.quant)
    # the native rows attention sees whole heads over the whole context: exact attention (also row-exact)
    # for a model whose sliding layers see less, or that rotates part of each head
    whole = not summary.partial_rotary and not (summary.sliding_window and context > summary.sliding_window)
    attention = (SOURCE_EXPORT.rows_attention if whole else "exact") if kernel == "rows" else SOURCE_EXPORT.attention
    settings = ExportSettings(quant=SOURCE_EXPORT.quant, context=context, block_size=0, int4_kernel=kernel,
                              attention=attention)
    out = artifact_path(label or (src.stem if src.is_file() else src.name), source_digest(src), settings)
    if is_exported(out):
        return mark_used(out)
    from specedge.export.artifact import largest_block

    settings = replace(settings, block_size=largest_block(src, SOURCE_EXPORT.block_size))
    return mark_used(export_once(src, out, settings, f"{src} ({settings.quant}, context {settings.context})"))
