"""Registry names -> ready artifacts: fetch the weights and export them on first use."""

from __future__ import annotations

import sys
from pathlib import Path

from specedge.errors import SpecEdgeError
from specedge.export.cache import artifact_path, is_exported
from specedge.export.settings import ExportSettings, int8_weights_here
from specedge.models.fetch import fetch
from specedge.models.registry import ModelEntry, get_model


def export_settings(entry: ModelEntry, quant: str | None = None) -> ExportSettings:
    export = entry.export_for(quant)
    return ExportSettings(quant=export.quant, context=export.context, block_size=export.block_size,
                          attention=export.attention, head_vocab=export.head_vocab,
                          int8_weights=int8_weights_here(export.quant))


def cached_artifact(name: str, quant: str | None = None) -> Path:
    entry = get_model(name)
    return artifact_path(entry.name, entry.sha256, export_settings(entry, quant))


def resolve_model(name: str, quant: str | None = None) -> Path:
    """The artifact of a registry model in `quant` (default: the registry's first export), fetching
    and exporting what is missing. Which export decodes fastest here is policy, not mechanism:
    specedge/defaults.py chooses it and asks for it by quant."""
    entry = get_model(name)
    settings = export_settings(entry, quant)
    out = artifact_path(entry.name, entry.sha256, settings)
    if is_exported(out):
        return out
    weights = fetch(name)
    try:
        from specedge.export.artifact import export_model
    except ImportError as e:
        raise SpecEdgeError(f"{name} is not exported yet and this installation cannot export ({e.name} missing)",
                            "pip install 'specedge[export]', or export on another machine") from None
    print(f"exporting {name} ({settings.quant}, context {settings.context}) to {out} - once", file=sys.stderr)
    result = export_model(weights, out, settings, expected_sha256=entry.sha256, reuse=True)
    if result.seconds:
        print(f"exported in {result.seconds:.0f} s, peak memory {result.peak_rss_bytes / 2**30:.1f} GiB",
              file=sys.stderr)
    return out
