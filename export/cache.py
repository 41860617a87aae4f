"""Exported artifacts cached in the user's cache folder, keyed by source digest and settings."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from specedge.export.settings import EXPORT_FORMAT, ExportSettings
from specedge.models.paths import artifacts_dir
from specedge.runtime.manifest import MANIFEST_NAME


def artifact_path(label: str, digest: str, settings: ExportSettings) -> Path:
    """Where the artifact of a source with this digest, exported with these settings, lives."""
    blob = json.dumps({"source": digest, "settings": asdict(settings), "format": EXPORT_FORMAT}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:20]
    return artifacts_dir() / f"{label}-{settings.quant}-{key}"


def is_exported(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()


def cached_export(src: Path, settings: ExportSettings, name: str | None = None, digest: str | None = None) -> Path:
    """The artifact of `src` under `settings`, exported on the first call and reused after.
    Pass `digest` only when the source was already verified against it (a fetched model)."""
    from specedge.export.artifact import export_model
    from specedge.export.source import source_digest

    out = artifact_path(name or Path(src).stem, digest or source_digest(src), settings)
    if not is_exported(out):
        export_model(src, out, settings, expected_sha256=digest, reuse=True)
    return out
