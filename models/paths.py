"""Where specedge keeps fetched weights and exported artifacts."""

from __future__ import annotations

import os
from pathlib import Path


def cache_root() -> Path:
    """$SPECEDGE_CACHE, else $XDG_CACHE_HOME/specedge, else ~/.cache/specedge."""
    if env := os.environ.get("SPECEDGE_CACHE"):
        return Path(env)
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "specedge"


def weights_dir() -> Path:
    return cache_root() / "weights"


def artifacts_dir() -> Path:
    return cache_root() / "artifacts"
