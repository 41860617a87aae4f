"""The export cache's keys: an int4 export for the rows kernel is keyed by the weight layout this
machine packs (its kernel's best path), so a cached export of another layout is exported again,
once, saying why; exports for MatMulNBits keep their keys."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specedge.core.contract import MANIFEST_NAME
from specedge.export.cache import artifact_path
from specedge.export.settings import ExportSettings
from specedge.kernels import native
from specedge.resolve import why_again

ROWS = ExportSettings(quant="int4", block_size=128, int4_kernel="rows")


@pytest.fixture(autouse=True)
def own_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SPECEDGE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_rows_exports_are_keyed_by_the_layout_of_this_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    nbits = ExportSettings(quant="int4", block_size=128)
    rows, others = {}, {}
    for layout in (1, 2):
        monkeypatch.setattr(native, "layout", lambda layout=layout: layout)
        rows[layout], others[layout] = artifact_path("m", "digest", ROWS), artifact_path("m", "digest", nbits)
        assert ROWS.rows_layout == layout and nbits.rows_layout == 0
    assert rows[1] != rows[2]
    assert others[1] == others[2]


def test_a_cached_export_of_another_layout_says_why_it_is_made_again(own_cache: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(native, "layout", lambda: 2)
    old = own_cache / "artifacts" / "m-int4-0123456789abcdef0123"
    old.mkdir(parents=True)
    (old / MANIFEST_NAME).write_text(json.dumps({"quantization": {"kernel": "rows", "layout": 1}}))
    assert why_again("m", ROWS) == " for this machine's int4 weight layout (2; the cached export has 1)"
    monkeypatch.setattr(native, "layout", lambda: 1)
    assert why_again("m", ROWS) == ""
