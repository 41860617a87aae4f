from __future__ import annotations

from pathlib import Path

import pytest

from specedge.models.registry import ModelEntry
from tests.models.wheels import make_fake_model


@pytest.fixture
def fake_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[ModelEntry, Path, list[bytes]]:
    """A model in 3 chunk packages (specedge-fake-part1..3) in a local wheel folder, each pinned."""
    return make_fake_model(tmp_path, monkeypatch)
