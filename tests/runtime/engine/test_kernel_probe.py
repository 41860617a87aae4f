"""The u8 x s8 probe tells a saturating kernel from an exact one, and w8a8 exports follow it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest

from specedge.core.errors import SpecEdgeError
from specedge.export.artifact import export_model
from specedge.export.settings import ExportSettings
from specedge.runtime import OnnxModel
from specedge.runtime.engine import kernel_probe as probe
from specedge.runtime.engine import model as model_module
from tests.conftest import TINY_CONTEXT, TINY_WIDTHS


def saturating_product(a: np.ndarray, b: np.ndarray, a_zero: int = 128) -> np.ndarray:
    """x86 without VNNI: vpmaddubsw sums adjacent pairs of u8 x s8 products into saturating int16,
    vpmaddwd adds those in int32; the zero point is taken off after, from b's column sums."""
    products = a.astype(np.int64)[:, :, None] * b.astype(np.int64)[None, :, :]  # [M, K, N]
    pairs = np.clip(products[:, 0::2] + products[:, 1::2], -32768, 32767)
    return pairs.sum(axis=1) - a_zero * b.astype(np.int64).sum(axis=0)


def test_the_probe_tells_a_saturating_kernel_from_an_exact_one() -> None:
    weights = probe.probe_weights()
    exact = {m: probe.exact_product(probe.probe_rows(m), weights).astype(np.int32) for m in probe.ROWS}
    saturated = {m: saturating_product(probe.probe_rows(m), weights).astype(np.int32) for m in probe.ROWS}
    assert probe.products_exact(exact, weights)
    assert not probe.products_exact(saturated, weights)
    assert all(not np.array_equal(exact[m], saturated[m]) for m in probe.ROWS)  # every row count would tell


def test_the_probe_graph_is_a_valid_matmul_integer_model() -> None:
    model = onnx.load_from_string(probe.probe_graph(probe.probe_weights()))
    onnx.checker.check_model(model, full_check=True)
    assert [n.op_type for n in model.graph.node] == ["MatMulInteger"]
    weights = onnx.numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "b"))
    assert np.array_equal(weights, probe.probe_weights())


def test_the_probe_runs_on_this_cpu() -> None:
    probe.u8s8_exact.cache_clear()
    assert isinstance(probe.u8s8_exact(), bool)


@pytest.fixture(scope="module")
def w8a8_pair(tiny_llama: tuple[Path, Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[bool, Path]:
    src = tiny_llama[0]
    root = tmp_path_factory.mktemp("w8a8")
    settings = ExportSettings(quant="w8a8", context=TINY_CONTEXT, widths=TINY_WIDTHS)
    return {signed: export_model(src, root / f"int8-{signed}", dataclasses.replace(settings, int8_weights=signed)).path
            for signed in (False, True)}


def test_int8_weights_give_the_logits_of_uint8_weights_where_exact(w8a8_pair: dict[bool, Path]) -> None:
    if not probe.u8s8_exact():
        pytest.skip("this CPU multiplies u8 x s8 inexactly: int8 weights are refused here")
    logits = {}
    for signed, folder in w8a8_pair.items():
        model = OnnxModel(folder)
        assert model.manifest.quantization.int8_weights is signed
        cache = model.new_cache(bucket=64)
        logits[signed] = model.forward([5, 9, 13, 2, 7], cache).logits.copy()
    assert np.array_equal(logits[False], logits[True])


def test_an_int8_weight_export_is_refused_where_the_cpu_saturates(w8a8_pair: dict[bool, Path],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(model_module, "u8s8_exact", lambda: False)
    OnnxModel(w8a8_pair[False])  # uint8 weights are exact everywhere
    with pytest.raises(SpecEdgeError, match="multiplies inexactly") as e:
        OnnxModel(w8a8_pair[True])
    assert "--quant w8a8" in e.value.fix
