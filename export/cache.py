"""Exported artifacts cached in the user's cache folder, keyed by source digest and settings."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import asdict
from pathlib import Path

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.export.source import source_digest
from specedge.runtime.manifest import MANIFEST_NAME


def cache_root() -> Path:
    """$SPECEDGE_CACHE, else $XDG_CACHE_HOME/specedge, else ~/.cache/specedge."""
    if env := os.environ.get("SPECEDGE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specedge"


def artifact_key(digest: str, settings: ExportSettings) -> str:
    from specedge import __version__

    blob = json.dumps({"source": digest, "settings": asdict(settings), "specedge": __version__},
                      sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def cached_export(src: Path, settings: ExportSettings, name: str | None = None) -> Path:
    """The artifact of `src` under `settings`, exported on the first call and reused after."""
    digest = source_digest(src)
    label = name or Path(src).stem
    out = cache_root() / "artifacts" / f"{label}-{settings.quant}-{artifact_key(digest, settings)}"
    if not (out / MANIFEST_NAME).is_file():
        export_model(src, out, settings, overwrite=True)
    return out
