"""Exported artifacts cached in the user's cache folder, keyed by source digest and settings."""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict
from pathlib import Path

from specedge.core.contract import MANIFEST_NAME
from specedge.export.settings import EXPORT_FORMAT, ExportSettings
from specedge.models.paths import artifacts_dir


def artifact_path(label: str, digest: str, settings: ExportSettings) -> Path:
    """Where the artifact of a source with this digest, exported with these settings, lives."""
    fields = asdict(settings)
    if not fields["int8_weights"]:  # the default: keys of artifacts exported before the setting existed stay
        del fields["int8_weights"]
    if fields["int4_kernel"] == "nbits":  # likewise
        del fields["int4_kernel"]
    else:  # weights packed for another layout of the kernel are another artifact: exported again, once
        fields["layout"] = settings.rows_layout
    blob = json.dumps({"source": digest, "settings": fields, "format": EXPORT_FORMAT}, sort_keys=True)
    key = hashlib.sha256(blob.encode()).hexdigest()[:20]
    return artifacts_dir() / f"{label}-{settings.quant}-{key}"


def is_exported(path: Path) -> bool:
    return (path / MANIFEST_NAME).is_file()

