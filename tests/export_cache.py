"""Exports of test sources cached in the user's cache folder across test runs (SmolLM2 for the
real-model tests), keyed like the registry's artifacts (`artifact_path`) and by the exporter's own
source: an export made by an older exporter is never reused by a test of a newer one."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

from specedge.export.artifact import export_model
from specedge.export.cache import artifact_path, is_exported
from specedge.export.settings import ExportSettings
from specedge.export.source import source_digest

ROOT = Path(__file__).resolve().parents[1]
EXPORTER = ("export", "core", "kernels/int4_layout.py", "kernels/native.py")  # what an export's bytes come from


@functools.cache
def exporter_digest() -> str:
    """The first 8 hex digits of a sha256 over the exporter's source files."""
    h = hashlib.sha256()
    for part in EXPORTER:
        path = ROOT / part
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            h.update(file.relative_to(ROOT).as_posix().encode() + b"\0" + file.read_bytes())
    return h.hexdigest()[:8]


def cached_export(src: Path, settings: ExportSettings, name: str | None = None) -> Path:
    """The artifact of `src` under `settings`, exported on the first call and reused after (by
    another process too: export_model with reuse waits for an export of the same folder under way)."""
    out = artifact_path(f"{name or Path(src).stem}-test{exporter_digest()}", source_digest(src), settings)
    if not is_exported(out):
        export_model(src, out, settings, reuse=True)
    return out
