"""Exports of test sources cached in the user's cache folder across test runs (SmolLM2 for the
real-model tests), keyed like the registry's artifacts (`artifact_path`)."""

from __future__ import annotations

from pathlib import Path

from specedge.export.artifact import export_model
from specedge.export.cache import artifact_path, is_exported
from specedge.export.settings import ExportSettings
from specedge.export.source import source_digest


def cached_export(src: Path, settings: ExportSettings, name: str | None = None) -> Path:
    """The artifact of `src` under `settings`, exported on the first call and reused after (by
    another process too: export_model with reuse waits for an export of the same folder under way)."""
    out = artifact_path(name or Path(src).stem, source_digest(src), settings)
    if not is_exported(out):
        export_model(src, out, settings, reuse=True)
    return out
