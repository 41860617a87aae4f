"""Weights read into huge-page memory (runtime/engine/weight_pages.py): every external initializer but
the embedding's read as the graph stores it, logits bit for bit those of the mapped data file, one copy per graph in a
process, and the mapped file kept where the kernel offers no huge pages, the user opts out, or
ONNX Runtime's own kernels hold the weights."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.kernels import native
from specedge.runtime.engine import weight_pages
from specedge.runtime.engine.model import OnnxModel
from specedge.runtime.engine.weight_pages import OPT_OUT_ENV, huge_pages_offered, resident_weights
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS
from tests.tiny_models import make_tiny_model

pytestmark = pytest.mark.skipif(not native.available() and not os.environ.get("CI"),  # CI builds it: fail there
                                reason=native.missing() or "library absent")
SETTINGS = ExportSettings(quant="int4", context=TINY_CONTEXT, widths=TINY_WIDTHS, block_size=32,
                          int4_kernel="rows", attention="rows")


@pytest.fixture(scope="module")
def rows_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen2 on specedge's kernel and the native attention (its weights in a data file)."""
    root = tmp_path_factory.mktemp("pages")
    return export_model(make_tiny_model(root / "src", "qwen2", seed=3), root / "int4", SETTINGS).path


@pytest.fixture
def offered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Huge pages offered, whatever this machine's setting (Linux's mmap has MADV_HUGEPAGE)."""
    if not hasattr(weight_pages.mmap, "MADV_HUGEPAGE"):
        pytest.fail("this test runs on Linux, whose mmap has MADV_HUGEPAGE")
    monkeypatch.setattr(weight_pages, "huge_pages_offered", lambda setting=None: True)
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)


def test_the_settings_that_offer_huge_pages() -> None:
    if not hasattr(weight_pages.mmap, "MADV_HUGEPAGE"):
        assert not huge_pages_offered("always [madvise] never")
        return
    assert huge_pages_offered("[always] madvise never\n")
    assert huge_pages_offered("always [madvise] never\n")
    assert not huge_pages_offered("always madvise [never]\n")


def test_the_line_that_says_where_weights_come_from(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_pages, "huge_pages_offered", lambda setting=None: True)
    monkeypatch.delenv(OPT_OUT_ENV, raising=False)
    assert weight_pages.describe().startswith("read into memory on 2 MB pages")
    monkeypatch.setattr(weight_pages, "huge_pages_offered", lambda setting=None: False)
    assert "no transparent huge pages" in weight_pages.describe()
    monkeypatch.setenv(OPT_OUT_ENV, "1")
    assert weight_pages.describe() == f"mapped from their data files ({OPT_OUT_ENV}=1)"


def test_every_external_initializer_is_read_as_stored(rows_target: Path, offered: None) -> None:
    import onnx
    from onnx import numpy_helper

    weights = resident_weights(rows_target / "model.onnx")
    assert weights is not None
    stored = {t.name: numpy_helper.to_array(t, base_dir=str(rows_target))
              for t in onnx.load(str(rows_target / "model.onnx"), load_external_data=False).graph.initializer
              if t.data_location == onnx.TensorProto.EXTERNAL}
    assert "model.embed_tokens.weight" in stored  # its rows are read by token: it stays mapped
    stored = {name: value for name, value in stored.items() if not name.startswith("model.embed_tokens.")}
    assert sorted(weights.names) == sorted(stored)
    for name, value in zip(weights.names, weights.values, strict=True):
        got = value.numpy()
        assert got.dtype == stored[name].dtype and got.shape == stored[name].shape
        assert np.array_equal(got.view(np.uint8), stored[name].view(np.uint8)), name


def test_resident_weights_decode_as_the_mapped_file(rows_target: Path, offered: None,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    resident = OnnxModel(rows_target)
    monkeypatch.setenv(OPT_OUT_ENV, "1")
    mapped = OnnxModel(rows_target)
    assert resident.session.specedge_weights is not None and mapped.session.specedge_weights is None
    tokens = [5, 17, 99, 3, 42, 7, 250, 11, 64, 8]
    for width in (1, 3, 8):
        logits = []
        for model in (resident, mapped):
            cache = model.new_cache()
            model.prefill(tokens, cache)
            logits.append(model.forward(tokens[:width], cache).logits)
        assert np.array_equal(*logits), width


def test_the_sessions_of_one_graph_share_one_copy(rows_target: Path, offered: None) -> None:
    first, second = OnnxModel(rows_target), OnnxModel(rows_target)
    assert first.session.specedge_weights is second.session.specedge_weights is not None


def test_the_mapped_file_stays_where_the_weights_are_not_read_in(rows_target: Path, tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weight_pages, "huge_pages_offered", lambda setting=None: False)
    assert resident_weights(rows_target / "model.onnx") is None  # no huge pages: nothing gained
    monkeypatch.setattr(weight_pages, "huge_pages_offered", lambda setting=None: True)
    monkeypatch.setenv(OPT_OUT_ENV, "1")
    assert resident_weights(rows_target / "model.onnx") is None  # the user's choice
    monkeypatch.delenv(OPT_OUT_ENV)
    (tmp_path / "model.onnx").write_bytes(b"\x08\x0a")  # a graph without external data (or none at all)
    assert resident_weights(tmp_path / "model.onnx") is None
    assert resident_weights(tmp_path / "absent.onnx") is None


def test_onnx_runtimes_own_kernels_keep_the_mapped_file(tmp_path: Path, offered: None) -> None:
    """MatMulNBits packs its weights into buffers of its own: a copy in memory would be a second one."""
    src = make_tiny_model(tmp_path / "src", "qwen2", seed=4)
    art = export_model(src, tmp_path / "nbits", ExportSettings(quant="int4", context=TINY_CONTEXT,
                                                               widths=TINY_WIDTHS, int4_kernel="nbits")).path
    assert OnnxModel(art).session.specedge_weights is None


def test_a_data_file_shorter_than_its_graph_is_left_to_onnx_runtime(rows_target: Path, tmp_path: Path,
                                                                     offered: None) -> None:
    for name in ("model.onnx", "model.onnx.data"):
        data = (rows_target / name).read_bytes()
        (tmp_path / name).write_bytes(data[:len(data) // 2] if name.endswith(".data") else data)
    assert resident_weights(tmp_path / "model.onnx") is None
